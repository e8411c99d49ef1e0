#include "tests/cli/cli_testutil.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace memfit::clitest {

std::string memfit_binary() {
  const char* dir = std::getenv("MEMFIT_BINARY_DIR");
  return std::string(dir ? dir : MEMFIT_TEST_BINARY_DIR) + "/memfit";
}

ProgramRun run_memfit(const std::string& args, bool stderr_too) {
  // One CPU rates file for every run (tests/CMakeLists.txt measures it first, as cli_cpu_rates).
  const std::string cmd = "MEMFIT_CACHE_DIR='" + std::string(MEMFIT_TEST_CACHE_DIR) + "' " +
                          memfit_binary() + " " + args + (stderr_too ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace memfit::clitest
