#include "profiler/output_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "memory/error.h"

namespace memfit {

OutputLock::OutputLock(const std::string& path, std::string_view flag)
    : OutputLock(path + ".lock", path, flag) {}

OutputLock OutputLock::dir(const std::string& dir, std::string_view flag) {
  return OutputLock(dir + "/.memfit.lock", dir, flag);
}

OutputLock::OutputLock(std::string lock_path, std::string target, std::string_view flag)
    : lock_path_(std::move(lock_path)) {
  const std::string what = std::string(flag) + " '" + target + "'";
  if (target.empty()) throw InvalidArgument(std::string(flag) + ": an empty file name");
  // Another holder may remove the file between our open and our flock: then we hold a lock on
  // a file nobody else can find, so check that the name still leads to what we locked.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd =
        ::open(lock_path_.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0) {
      throw InvalidArgument(what + " cannot be written: creating its lock file '" + lock_path_ +
                            "': " + std::strerror(errno));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) {
        throw InvalidArgument(what + " is being written by another process (it holds '" +
                              lock_path_ +
                              "'); wait for that run to finish or choose another path");
      }
      throw InvalidArgument(what + ": locking '" + lock_path_ + "': " + std::strerror(err));
    }
    struct stat held {
    }, named{};
    if (::fstat(fd, &held) == 0 && ::lstat(lock_path_.c_str(), &named) == 0 &&
        held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
      fd_ = fd;
      return;
    }
    ::close(fd);  // the holder before us removed it: try again on the new file
  }
  throw InvalidArgument(what + ": its lock file '" + lock_path_ + "' keeps being replaced");
}

OutputLock::OutputLock(OutputLock&& other) noexcept
    : lock_path_(std::move(other.lock_path_)), fd_(std::exchange(other.fd_, -1)) {}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  ::unlink(lock_path_.c_str());  // while still locked: a waiter then sees a different file
  ::close(fd_);
}

}  // namespace memfit
