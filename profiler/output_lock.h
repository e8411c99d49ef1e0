// OutputLock: one process at a time writes a given output (a training state, a summary, a
// report directory, a plan file), so two runs given the same target do not both "succeed"
// while one's result silently disappears.
//
//   OutputLock save_lock("runs/a.mfstate", "--save");   // InvalidArgument if another run holds it
//   OutputLock report_lock = OutputLock::dir("out/r", "--report");
//   ... train, then write the targets; the locks go when the objects do
//
// The lock is flock(LOCK_EX | LOCK_NB) on "<path>.lock" ("<dir>/.memfit.lock" for a directory),
// taken without waiting: a second run refuses at once, naming the target, the lock file and what
// to do, before it computes anything. The kernel drops it when its holder exits however it
// exits (SIGKILL included), so a stale lock file never blocks anyone; the holder removes the file
// when it is done. Taking the lock is also a writability check: a directory that is missing,
// read-only or full enough to refuse a new entry is an InvalidArgument naming it and the reason.
// The lock file is opened O_NOFOLLOW and never written, so a link placed under its name
// neither redirects nor damages anything.
#pragma once

#include <string>
#include <string_view>

namespace memfit {

class OutputLock {
 public:
  OutputLock(const std::string& path, std::string_view flag);
  static OutputLock dir(const std::string& dir, std::string_view flag);
  ~OutputLock();
  OutputLock(OutputLock&& other) noexcept;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;
  OutputLock& operator=(OutputLock&&) = delete;

  const std::string& lock_path() const { return lock_path_; }

 private:
  OutputLock(std::string lock_path, std::string target, std::string_view flag);
  std::string lock_path_;
  int fd_ = -1;
};

}  // namespace memfit
