// read_file_bounded: regular files read whole; directories, FIFOs and devices refused by name
// before a byte is read (a FIFO without a writer would block an open); files over the limit
// refused naming it, by their size and, for files whose size says nothing (/proc), by reading
// at most limit + 1 bytes.
#include "profiler/read_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace memfit {
namespace {

std::string tmp(const std::string& name) {
  return testing::TempDir() + "read_file_" + std::to_string(::getpid()) + "_" + name;
}

std::string refusal(const std::string& path, std::size_t limit) {
  try {
    read_file_bounded<ConfigError>(path, limit, "test file");
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << path << " was read";
  return "";
}

TEST(ReadFileBounded, ReadsARegularFileWhole) {
  const std::string path = tmp("ok");
  const std::string bytes = std::string("a\0b\r\n", 5) + std::string(100'000, 'x');
  std::ofstream(path, std::ios::binary) << bytes;
  EXPECT_EQ(read_file_bounded(path, bytes.size(), "test file"), bytes);  // exactly the limit
  std::ofstream(path, std::ios::binary | std::ios::trunc);
  EXPECT_EQ(read_file_bounded(path, 10, "test file"), "");
  ::unlink(path.c_str());
}

TEST(ReadFileBounded, OverTheLimitNamesIt) {
  const std::string path = tmp("big");
  std::ofstream(path, std::ios::binary) << std::string((std::size_t{1} << 20) + 1, 'y');
  const std::string msg = refusal(path, std::size_t{1} << 20);
  EXPECT_NE(msg.find("test file '" + path + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1048577 bytes, over the limit of 1 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("valid: a regular file of at most 1 MiB"), std::string::npos) << msg;
  ::unlink(path.c_str());
}

TEST(ReadFileBounded, NonRegularFilesAreRefusedByName) {
  const std::string dir = tmp("dir");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  EXPECT_NE(refusal(dir, 100).find("is a directory"), std::string::npos);
  ::rmdir(dir.c_str());
  // No writer: an open() for reading would block forever; the refusal comes first.
  const std::string fifo = tmp("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(refusal(fifo, 100).find("is a FIFO"), std::string::npos);
  ::unlink(fifo.c_str());
  const std::string zero = refusal("/dev/zero", std::size_t{1} << 30);
  EXPECT_NE(zero.find("'/dev/zero': is a character device"), std::string::npos) << zero;
}

TEST(ReadFileBounded, SizeZeroProcFilesAreReadAndCapped) {
  // /proc files report size 0; their text is there all the same.
  const std::string status = read_file_bounded("/proc/self/status", 1 << 20, "test file");
  EXPECT_NE(status.find("Name:"), std::string::npos);
  const std::string msg = refusal("/proc/self/status", 16);
  EXPECT_NE(msg.find("more than 16 bytes (the limit)"), std::string::npos) << msg;
}

TEST(ReadFileBounded, MissingFileGivesTheOsReason) {
  const BoundedRead r = try_read_file_bounded("/nonexistent/x", 10, "test file");
  EXPECT_FALSE(r.refused);
  EXPECT_NE(r.error.find("cannot open the file (No such file or directory)"), std::string::npos)
      << r.error;
  EXPECT_THROW(read_file_bounded("/nonexistent/x", 10, "test file"), IoError);
}

}  // namespace
}  // namespace memfit
