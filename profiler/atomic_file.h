// Whole-file writes that never leave a partial file behind, and the output-directory check the
// exporters run before writing anything.
//
//   ensure_writable_dir("out/profile");              // creates it; InvalidArgument if it cannot
//   write_file_atomic("out/profile/summary.json", text);
//
// write_file_atomic writes to a fresh temporary beside `path` (create_temp_beside), fsyncs it,
// renames it over `path` and fsyncs the directory, so a reader sees either the old file or the
// whole new one, and a crash or a failure (disk full, a directory where the file should go,
// ...) leaves the old file as it was. On any failure the temporary is removed and IoError names
// the file and the OS's reason (strerror).
//
// create_temp_beside creates "<path>.tmp.XXXXXX" with an unpredictable suffix, exclusively
// (mkostemp: O_CREAT | O_EXCL), so a file or symlink someone placed under a temporary's name is
// never opened, followed or truncated; mode 0644. It returns the descriptor and sets *tmp_path;
// IoError when it cannot. Every atomic save in memfit (reports, plans, training states) writes
// through one of these.
//
// ensure_writable_dir creates `dir` with its parents and proves it writable by creating and
// removing a probe file there (permission bits alone say nothing when running as root, and
// nothing about read-only mounts). Failure: InvalidArgument naming the path and the reason.
// Both are thread-safe for distinct paths.
#pragma once

#include <string>
#include <string_view>

namespace memfit {

void write_file_atomic(const std::string& path, std::string_view contents);

int create_temp_beside(const std::string& path, std::string* tmp_path);

void ensure_writable_dir(const std::string& dir);

}  // namespace memfit
