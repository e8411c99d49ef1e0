#include "profiler/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace memfit {

namespace {

const char* file_type(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string limit_text(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 30) && bytes % (std::size_t{1} << 30) == 0)
    return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (std::size_t{1} << 20) && bytes % (std::size_t{1} << 20) == 0)
    return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

BoundedRead try_read_file_bounded(const std::string& path, std::size_t limit,
                                  std::string_view what) {
  BoundedRead r;
  const std::string head = std::string(what) + " '" + path + "': ";
  const std::string valid = limit == SIZE_MAX
                                ? "; valid: a regular file"
                                : "; valid: a regular file of at most " + limit_text(limit);
  // stat before open: opening a FIFO for reading blocks until someone writes to it.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    r.error = head + "cannot open the file (" + std::strerror(errno) + ")";
    return r;
  }
  if (!S_ISREG(st.st_mode)) {
    r.refused = true;
    r.error = head + "is " + file_type(st.st_mode) + valid;
    return r;
  }
  if (static_cast<std::uint64_t>(st.st_size) > limit) {
    r.refused = true;
    r.error = head + std::to_string(st.st_size) + " bytes, over the limit of " + limit_text(limit) +
              valid;
    return r;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    r.error = head + "cannot open the file (" + std::strerror(errno) + ")";
    return r;
  }
  // The file may have been swapped between stat and open: check what was opened.
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    r.refused = true;
    r.error = head + "is " + file_type(st.st_mode) + valid;
    return r;
  }
  // Read to the end, but never more than limit + 1 bytes (sizes of /proc files say 0).
  const std::size_t cap = limit < SIZE_MAX ? limit + 1 : SIZE_MAX;
  r.bytes.resize(std::min(cap, static_cast<std::size_t>(st.st_size) + 1));
  std::size_t got = 0;
  while (true) {
    if (got == r.bytes.size()) {
      if (got == cap) break;
      r.bytes.resize(std::min(cap, std::max<std::size_t>(got * 2, 4096)));
    }
    const ssize_t n = ::read(fd, r.bytes.data() + got, r.bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      r.bytes.clear();
      r.error = head + "read failed (" + std::strerror(err) + ")";
      return r;
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (got > limit) {
    r.bytes.clear();
    r.refused = true;
    r.error = head + "more than " + limit_text(limit) + " (the limit)" + valid;
    return r;
  }
  r.bytes.resize(got);
  return r;
}

}  // namespace memfit
