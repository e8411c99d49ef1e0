// The files a command writes (--save, --summary-json, --report, plan --out): claimed before any
// work, and written so that a failure at the end loses as little as possible.
//
//   std::vector<OutputLock> held = claim_outputs({{"--save", t.save}, {"--report", dir, true}});
//   ... train ...
//   std::vector<std::string> failed;
//   write_or_rescue("--save", t.save, false, [&](const std::string& p) { trainer.save(p); },
//                   failed);
//   finish_outputs(failed);   // IoError listing what failed and where each went instead
//
// claim_outputs: each target given (empty paths are skipped) is proved writable
// (check_writable_file, or ensure_writable_dir for a directory, which it creates) and locked
// (profiler/output_lock.h), so a read-only or missing directory, a directory given as a file,
// two flags naming one file, or another run writing the same target is an error before a step
// runs.
// write_or_rescue: runs write(path); if that throws, it says why on stderr and runs
// write(rescue) with rescue = "$TMPDIR/memfit-rescue-<pid>-<file name>" (TMPDIR unset: /tmp),
// so a disk that filled during training costs the file's place, not the training. Each
// failure's line ("--save 'x': <why>; saved to '<rescue>' instead", or "...; not saved: <why>")
// is appended to `failed`. finish_outputs throws IoError with those lines when any failed (the
// command then exits 2 after writing everything it could).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "profiler/output_lock.h"

namespace memfit::cli {

struct Output {
  const char* flag;
  std::string path;
  bool dir = false;
};

std::vector<OutputLock> claim_outputs(const std::vector<Output>& outputs);

void write_or_rescue(const char* flag, const std::string& path, bool dir,
                     const std::function<void(const std::string&)>& write,
                     std::vector<std::string>& failed);

void finish_outputs(const std::vector<std::string>& failed);

}  // namespace memfit::cli
