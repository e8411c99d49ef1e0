// Whole-file writes that never leave a partial file behind, and the output-directory check the
// exporters run before writing anything.
//
//   write_file_atomic("out/plan.yaml", text);          // one file, whole or not at all
//
//   AtomicFile f("out/run.mfstate");                   // streamed: the temporary exists now
//   f.write(header); f.write(data);                    // IoError on a full disk, ...
//   f.commit();                                        // fsync, rename into place, fsync the dir
//
//   AtomicFileSet set;                                 // several files swapped in together
//   set.stage("out/r/summary.json", a);                // each written and synced to a temporary
//   set.stage("out/r/report.html", b);
//   set.commit();                                      // only now is any old file replaced
//
// AtomicFile writes to a fresh temporary beside `path` (create_temp_beside); commit() fsyncs it,
// closes it, renames it over `path` and fsyncs the directory, so a reader sees either the old
// file or the whole new one, and a crash at any instant (the kill tests SIGKILL writers at every
// stage) leaves no partial file under the final name. Destroyed without commit() (an exception,
// an early return), it removes its temporary; the old file is untouched. A process killed
// mid-write leaves its temporary ("<path>.tmp.XXXXXX") behind: never under the final name, and
// safe to delete once no memfit process is writing there.
//
// AtomicFileSet: every file is written and synced (stage) before any is renamed (commit), so a
// failure while writing any of them (disk full, ...) leaves every earlier file exactly as it was.
// commit() renames them in order: a crash inside the renames (microseconds, no allocation or
// data write) can leave some files from each run, each whole.
//
// create_temp_beside creates "<path>.tmp.XXXXXX" with an unpredictable suffix, exclusively
// (mkostemp: O_CREAT | O_EXCL), so a file or symlink someone placed under a temporary's name is
// never opened, followed or truncated; mode 0644. It returns the descriptor and sets *tmp_path;
// IoError when it cannot. Every atomic save in memfit (reports, plans, training states) writes
// through AtomicFile.
//
// ensure_writable_dir creates `dir` with its parents and proves it writable by creating and
// removing a probe file there (permission bits alone say nothing when running as root, and
// nothing about read-only mounts). Failure: InvalidArgument naming the path and the reason.
// check_writable_file does the same for a file target: its directory exists and takes a new
// file, and the path is not a directory, device, FIFO or socket (the rename would replace it). Both
// run before a long job, so a bad target costs nothing. Errors name the path and the OS's reason
// (strerror). All are thread-safe for distinct paths.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace memfit {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // IoError when the temporary cannot be created
  ~AtomicFile();                          // removes the temporary unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }
  int fd() const { return fd_; }  // for writers of their own (EINTR and short writes are theirs)

  void write(const void* data, std::size_t n);  // all of it; IoError naming path and reason
  void write(std::string_view s) { write(s.data(), s.size()); }
  // fsync (when `sync`) and close: the contents are whole under the temporary's name.
  void finish(bool sync = true);
  // finish() if not done, rename over path(), fsync the directory (when `sync`).
  void commit(bool sync = true);

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

class AtomicFileSet {
 public:
  void stage(const std::string& path, std::string_view contents);  // written and synced
  void commit();                                                   // renames, in stage order
  std::size_t size() const { return files_.size(); }

 private:
  std::vector<AtomicFile> files_;
};

void write_file_atomic(const std::string& path, std::string_view contents);

int create_temp_beside(const std::string& path, std::string* tmp_path);

void ensure_writable_dir(const std::string& dir);
void check_writable_file(const std::string& path, std::string_view what);

// Tests: a function called at each stage of every AtomicFile (after the temporary is created,
// after each write, after the fsync, after the rename, after the directory's fsync); the kill
// tests raise SIGKILL from it. Null (the default): nothing is called. Not thread-safe to set.
enum class WriteStage { kCreated, kWrote, kSynced, kRenamed, kDirSynced };
using WriteProbe = void (*)(WriteStage stage, const std::string& path);
void set_write_probe(WriteProbe probe);

}  // namespace memfit
