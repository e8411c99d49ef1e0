#include "profiler/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "memory/error.h"

namespace memfit {

namespace {

std::string reason(int err) { return std::strerror(err); }

[[noreturn]] void io_fail(const std::string& path, const std::string& what, int err) {
  throw IoError("cannot write '" + path + "': " + what + ": " + reason(err));
}

// The directory part of `path` ("." for a bare name), for the temporary and the dir fsync.
std::string parent_of(const std::string& path) {
  const std::filesystem::path p(path);
  const std::filesystem::path parent = p.parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// Closes the descriptor and removes the temporary unless released, so every early exit
// (an exception included) cleans up.
class TempFile {
 public:
  TempFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  int fd() const { return fd_; }
  // Closing can report a deferred write error (NFS): the caller checks it.
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }
  void renamed() { renamed_ = true; }

 private:
  std::string path_;
  int fd_;
  bool renamed_ = false;
};

void fsync_dir(const std::string& dir, const std::string& path) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail(path, "opening its directory '" + dir + "' to sync it", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot sync a directory (EINVAL): the rename itself has happened.
  if (rc != 0 && err != EINVAL) io_fail(path, "syncing its directory '" + dir + "'", err);
}

}  // namespace

int create_temp_beside(const std::string& path, std::string* tmp_path) {
  if (path.empty()) throw InvalidArgument("create_temp_beside: empty file name");
  const std::string dir = parent_of(path);
  const std::string name = std::filesystem::path(path).filename().string();
  std::string t = dir + "/" + name + ".tmp.XXXXXX";
  const int fd = ::mkostemp(t.data(), O_CLOEXEC);
  if (fd < 0) io_fail(path, "creating a temporary beside it in '" + dir + "'", errno);
  if (::fchmod(fd, 0644) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(t.c_str());
    io_fail(path, "setting the temporary's mode", err);
  }
  *tmp_path = std::move(t);
  return fd;
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  if (path.empty()) throw InvalidArgument("write_file_atomic: empty file name");
  const std::string dir = parent_of(path);
  std::string tmp_path;
  const int fd = create_temp_beside(path, &tmp_path);
  TempFile tmp(tmp_path, fd);

  const char* p = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(tmp.fd(), p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_fail(path, "writing the temporary '" + tmp_path + "'", errno);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(tmp.fd()) != 0) io_fail(path, "syncing the temporary '" + tmp_path + "'", errno);
  if (tmp.close() != 0) io_fail(path, "closing the temporary '" + tmp_path + "'", errno);
  if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
    io_fail(path, "renaming '" + tmp_path + "' into place", errno);
  }
  tmp.renamed();
  fsync_dir(dir, path);
}

void ensure_writable_dir(const std::string& dir) {
  if (dir.empty()) throw InvalidArgument("output directory: empty path");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw InvalidArgument("output directory '" + dir + "' cannot be created: " + ec.message());
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    throw InvalidArgument("output directory '" + dir + "' is not a directory");
  }
  std::string probe = dir + "/.memfit-probe." + std::to_string(::getpid()) + ".XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    const int err = errno;
    throw InvalidArgument("output directory '" + dir + "' is not writable: " + reason(err));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace memfit
