#include "profiler/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "memory/error.h"
#include "tests/profiler/export_testutil.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using exporttest::temp_dir;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Names in `dir` that look like our temporaries.
int temporaries(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos) ++n;
  }
  return n;
}

TEST(AtomicFile, WritesTheWholeContentsAndLeavesNoTemporary) {
  const std::string dir = temp_dir("write");
  std::string text(3 << 20, 'x');  // several write() calls' worth
  text[12345] = '\0';              // binary content survives
  write_file_atomic(dir + "/a.bin", text);
  EXPECT_EQ(slurp(dir + "/a.bin"), text);
  EXPECT_EQ(temporaries(dir), 0);
}

// A file or symlink waiting under a temporary's name (the predictable "<name>.tmp.<pid>" that
// earlier versions used) is never opened, followed or truncated: what it points to stays as it
// was, and the temporaries themselves have unpredictable names, created exclusively.
TEST(AtomicFile, APrePlacedSymlinkAtATemporarysNameRedirectsNothing) {
  const std::string dir = temp_dir("symlink");
  const std::string victim = dir + "/victim";
  write_file_atomic(victim, "precious\n");
  const std::string trap = dir + "/f.txt.tmp." + std::to_string(::getpid());
  ASSERT_EQ(::symlink(victim.c_str(), trap.c_str()), 0);
  write_file_atomic(dir + "/f.txt", "new\n");
  EXPECT_EQ(slurp(dir + "/f.txt"), "new\n");
  EXPECT_EQ(slurp(victim), "precious\n");
  EXPECT_TRUE(fs::is_symlink(trap));  // not ours: left alone
  std::string a, b;
  const int fa = create_temp_beside(dir + "/g.txt", &a);
  const int fb = create_temp_beside(dir + "/g.txt", &b);
  ASSERT_GE(fa, 0);
  ASSERT_GE(fb, 0);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind(dir + "/g.txt.tmp.", 0), 0u) << a;
  struct stat st {};
  ASSERT_EQ(::fstat(fa, &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  ::close(fa);
  ::close(fb);
  ::unlink(a.c_str());
  ::unlink(b.c_str());
}

TEST(AtomicFile, ReplacesAnExistingFile) {
  const std::string dir = temp_dir("replace");
  write_file_atomic(dir + "/f.txt", "a much longer first version\n");
  write_file_atomic(dir + "/f.txt", "short\n");
  EXPECT_EQ(slurp(dir + "/f.txt"), "short\n");
  EXPECT_EQ(temporaries(dir), 0);
}

TEST(AtomicFile, ADirectoryWhereTheFileGoesFailsCleanly) {
  const std::string dir = temp_dir("dirfault");
  fs::create_directory(dir + "/report.html");
  std::ofstream(dir + "/report.html/keep.txt") << "kept";
  try {
    write_file_atomic(dir + "/report.html", "<html></html>");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/report.html"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("renaming"), std::string::npos) << e.what();
  }
  EXPECT_EQ(temporaries(dir), 0);
  EXPECT_TRUE(fs::is_directory(dir + "/report.html"));
  EXPECT_EQ(slurp(dir + "/report.html/keep.txt"), "kept");
}

TEST(AtomicFile, AMissingDirectoryIsAnIoErrorWithTheReason) {
  const std::string dir = temp_dir("missing");
  try {
    write_file_atomic(dir + "/no/such/dir/f.txt", "x");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
        << e.what();
  }
}

TEST(EnsureWritableDir, CreatesNestedDirectories) {
  const std::string dir = temp_dir("nested") + "/a/b/c";
  ensure_writable_dir(dir);
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir));  // the probe is gone
}

TEST(EnsureWritableDir, AFileInThePathIsInvalidArgumentNamingIt) {
  const std::string dir = temp_dir("file");
  std::ofstream(dir + "/plain") << "x";
  for (const std::string& bad : {dir + "/plain", dir + "/plain/sub"}) {
    try {
      ensure_writable_dir(bad);
      FAIL() << "expected InvalidArgument for " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

// Root may write anywhere on an ordinary file system, so the fault that holds for everyone is
// a file system that refuses new files: /proc.
TEST(EnsureWritableDir, AnUnwritableFileSystemIsRefusedEvenForRoot) {
  EXPECT_THROW(ensure_writable_dir("/proc/memfit-report"), InvalidArgument);
  try {
    ensure_writable_dir("/proc");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not writable"), std::string::npos) << e.what();
  }
  if (!exporttest::is_root()) {  // and permissions, where they apply
    const std::string dir = temp_dir("ro");
    ::chmod(dir.c_str(), 0500);
    EXPECT_THROW(ensure_writable_dir(dir), InvalidArgument);
    ::chmod(dir.c_str(), 0700);
  }
}

}  // namespace
}  // namespace memfit
