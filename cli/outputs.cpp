#include "cli/outputs.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>

#include "cli/terminal_text.h"
#include "memory/error.h"
#include "profiler/atomic_file.h"

namespace memfit::cli {

std::vector<OutputLock> claim_outputs(const std::vector<Output>& outputs) {
  std::vector<OutputLock> held;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Output& o = outputs[i];
    if (o.path.empty()) continue;
    for (std::size_t j = 0; j < i; ++j) {
      std::error_code ec;
      if (outputs[j].path == o.path || std::filesystem::equivalent(outputs[j].path, o.path, ec)) {
        throw InvalidArgument(std::string(outputs[j].flag) + " and " + o.flag + " both name '" +
                              o.path + "'; valid: a different file for each");
      }
    }
    if (o.dir) {
      ensure_writable_dir(o.path);
      held.push_back(OutputLock::dir(o.path, o.flag));
    } else {
      check_writable_file(o.path, o.flag);
      held.emplace_back(o.path, o.flag);
    }
  }
  return held;
}

void write_or_rescue(const char* flag, const std::string& path, bool dir,
                     const std::function<void(const std::string&)>& write,
                     std::vector<std::string>& failed) {
  std::string why;
  try {
    write(path);
    return;
  } catch (const std::exception& e) {
    why = e.what();
  }
  const char* env = std::getenv("TMPDIR");
  const std::string tmp = env != nullptr && *env != '\0' ? env : "/tmp";
  std::string name = std::filesystem::path(path).filename().string();
  if (name.empty()) name = std::filesystem::path(path).parent_path().filename().string();
  const std::string rescue =
      tmp + "/memfit-rescue-" + std::to_string(::getpid()) + "-" + (name.empty() ? "out" : name);
  std::string line = std::string(flag) + " '" + path + "': " + why;
  std::fprintf(stderr, "memfit: %s\n", shown(line).c_str());
  try {
    if (dir) ensure_writable_dir(rescue);
    write(rescue);
    line += "; saved to '" + rescue + "' instead";
    std::fprintf(stderr, "memfit: saved it to '%s' instead\n", shown(rescue).c_str());
  } catch (const std::exception& e) {
    line += "; not saved: '" + rescue + "' failed too: " + e.what();
  }
  failed.push_back(line);
}

void finish_outputs(const std::vector<std::string>& failed) {
  if (failed.empty()) return;
  std::string msg = "the run finished but not every output could be written where asked:";
  for (const std::string& f : failed) msg += "\n  " + f;
  throw IoError(msg);
}

}  // namespace memfit::cli
