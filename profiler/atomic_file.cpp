#include "profiler/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

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

WriteProbe g_probe = nullptr;

void probe(WriteStage stage, const std::string& path) {
  if (g_probe != nullptr) g_probe(stage, path);
}

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

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  if (path_.empty()) throw InvalidArgument("atomic write: empty file name");
  fd_ = create_temp_beside(path_, &tmp_);
  probe(WriteStage::kCreated, path_);
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_(std::move(other.tmp_)),
      fd_(other.fd_),
      committed_(other.committed_) {
  other.fd_ = -1;
  other.committed_ = true;  // the moved-from object owns no temporary
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, std::size_t n) {
  if (fd_ < 0) throw InvalidArgument("atomic write of '" + path_ + "': written after finish()");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      io_fail(path_, "writing the temporary '" + tmp_ + "'", errno);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  probe(WriteStage::kWrote, path_);
}

void AtomicFile::finish(bool sync) {
  if (fd_ < 0) return;
  if (sync && ::fsync(fd_) != 0) io_fail(path_, "syncing the temporary '" + tmp_ + "'", errno);
  // Closing can report a deferred write error (NFS).
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) io_fail(path_, "closing the temporary '" + tmp_ + "'", errno);
  probe(WriteStage::kSynced, path_);
}

void AtomicFile::commit(bool sync) {
  if (committed_) return;
  finish(sync);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    io_fail(path_, "renaming '" + tmp_ + "' into place", errno);
  }
  committed_ = true;
  probe(WriteStage::kRenamed, path_);
  if (sync) fsync_dir(parent_of(path_), path_);
  probe(WriteStage::kDirSynced, path_);
}

void AtomicFileSet::stage(const std::string& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents);
  f.finish();
  files_.push_back(std::move(f));
}

void AtomicFileSet::commit() {
  for (AtomicFile& f : files_) f.commit();
  files_.clear();
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

void set_write_probe(WriteProbe p) { g_probe = p; }

void check_writable_file(const std::string& path, std::string_view what) {
  const std::string label = std::string(what) + " '" + path + "'";
  if (path.empty()) throw InvalidArgument(std::string(what) + ": an empty file name");
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(st)) {
    throw InvalidArgument(label + " is a directory; valid: a file name");
  }
  // A device, FIFO or socket would be replaced by the rename (as root, /dev/null itself).
  if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
    throw InvalidArgument(label +
                          " exists and is not a regular file (a device, FIFO or "
                          "socket); valid: a regular file or a new name");
  }
  const std::string dir = parent_of(path);
  if (!std::filesystem::is_directory(dir, ec)) {
    throw InvalidArgument(label + ": its directory '" + dir + "' does not exist");
  }
  std::string tmp;
  int fd = -1;
  try {
    fd = create_temp_beside(path, &tmp);
  } catch (const IoError& e) {
    throw InvalidArgument(label + " cannot be written: " + e.what());
  }
  ::close(fd);
  ::unlink(tmp.c_str());
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
