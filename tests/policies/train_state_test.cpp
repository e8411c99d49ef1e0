// Training-state files on their own (no model): round trip, atomic replacement under an
// injected write failure, and rejection of corrupt, truncated and mismatched files before any
// tensor is written. The trainer-level tests (resume bit-exact) are in trainer_test.cpp.
#include "policies/train_state.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "memory/caching_allocator.h"
#include "memory/host_provider.h"

namespace memfit {
namespace {

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::string& path, const std::vector<char>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}
bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

class TrainStateTest : public testing::Test {
 protected:
  void SetUp() override {
    path_ = testing::TempDir() + "train_state_test_" + std::to_string(::getpid()) + ".mfstate";
    a_ = OwnedTensor::empty(alloc_, {3, 5}, DType::kF32, Device::kCpu, Category::kParameter);
    b_ = OwnedTensor::empty(alloc_, {7}, DType::kBF16, Device::kCpu, Category::kOptimizerState);
    fill(1.0f);
    meta_.model_spec = "model: {kind: gpt}\n";
    meta_.dtype = "bf16";
    meta_.optimizer = "adamw";
    meta_.options_json = "{}";
    meta_.steps = 42;
    meta_.attempted = 44;
    meta_.scaler_enabled = true;
    meta_.scaler = {1024.0, 17};
    meta_.rng.s = {1, 2, 0xFFFFFFFFFFFFFFFFull, 4};
    meta_.rng.has_spare = true;
    meta_.rng.spare = -0.375f;
  }
  void TearDown() override { std::remove(path_.c_str()); }

  // a = base + i, b = bf16(base * 2 + i)
  void fill(float base) {
    float* a = a_.view().data<float>();
    for (int i = 0; i < 15; ++i) a[i] = base + static_cast<float>(i);
    auto* b = b_.view().data<std::uint16_t>();
    for (int i = 0; i < 7; ++i) b[i] = f32_to_bf16(base * 2 + static_cast<float>(i));
  }
  std::vector<StateTensor> tensors() { return {{"weight/a", a_.view()}, {"exp_avg/b", b_.view()}}; }
  void save(const SaveOptions& o = {}) {
    write_train_state(path_, meta_, tensors(), be_, kDefaultStream, o);
  }
  float a0() const { return a_.view().data<float>()[0]; }
  std::string dir_of_path() const { return std::filesystem::path(path_).parent_path().string(); }

  std::string path_;
  CpuBackend be_;
  HostProvider host_;
  CachingAllocator alloc_{host_, {}, &be_.stream_sync()};
  OwnedTensor a_, b_;
  TrainStateMeta meta_;
};

TEST(Hash64Test, KnownValueAndStreaming) {
  // xxHash64 of the empty input with seed 0 (the reference implementation's test vector).
  EXPECT_EQ(Hash64::of(nullptr, 0), 0xEF46DB3751D8E999ull);
  std::vector<unsigned char> data(1000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 31 + 7);
  const std::uint64_t whole = Hash64::of(data.data(), data.size());
  for (std::size_t chunk : {1, 3, 8, 31, 32, 33, 100}) {
    Hash64 h;
    for (std::size_t i = 0; i < data.size(); i += chunk) {
      h.update(data.data() + i, std::min(chunk, data.size() - i));
    }
    EXPECT_EQ(h.digest(), whole) << "chunk " << chunk;
  }
  // Every single-bit flip changes the hash (what the corruption check relies on).
  for (std::size_t i = 0; i < data.size(); i += 37) {
    auto d = data;
    d[i] ^= 0x10;
    EXPECT_NE(Hash64::of(d.data(), d.size()), whole) << "byte " << i;
  }
  EXPECT_NE(Hash64::of(data.data(), 999), whole);
}

TEST_F(TrainStateTest, RoundTripRestoresTensorsAndMeta) {
  save();
  fill(100.0f);
  const TrainStateFile f = TrainStateFile::read(path_);
  EXPECT_EQ(f.meta().model_spec, meta_.model_spec);
  EXPECT_EQ(f.meta().dtype, "bf16");
  EXPECT_EQ(f.meta().optimizer, "adamw");
  EXPECT_EQ(f.meta().steps, 42);
  EXPECT_EQ(f.meta().attempted, 44);
  EXPECT_TRUE(f.meta().scaler_enabled);
  EXPECT_EQ(f.meta().scaler, meta_.scaler);
  EXPECT_EQ(f.meta().rng, meta_.rng);
  ASSERT_EQ(f.entries().size(), 2u);
  EXPECT_EQ(f.entries()[1].shape, Shape({7}));
  EXPECT_EQ(f.entries()[1].dtype, DType::kBF16);
  f.restore(tensors(), be_, kDefaultStream);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(a_.view().data<float>()[i], 1.0f + i);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(b_.view().data<std::uint16_t>()[i], f32_to_bf16(2.0f + i));
  }
}

TEST_F(TrainStateTest, InterruptedSaveLeavesThePreviousFileLoadable) {
  save();  // the good file, a[0] == 1
  const auto good = read_bytes(path_);
  fill(9.0f);
  meta_.steps = 99;
  for (std::int64_t after : {0, 10, 100, 600}) {
    SaveOptions o;
    o.fail_after_bytes = after;
    EXPECT_THROW(save(o), TrainStateError) << "after " << after;
    EXPECT_EQ(read_bytes(path_), good) << "after " << after;
    for (const auto& e : std::filesystem::directory_iterator(dir_of_path())) {
      EXPECT_EQ(e.path().string().find(path_ + ".tmp."), std::string::npos) << "temp file left";
    }
  }
  const TrainStateFile f = TrainStateFile::read(path_);
  EXPECT_EQ(f.meta().steps, 42);
  f.restore(tensors(), be_, kDefaultStream);
  EXPECT_EQ(a0(), 1.0f);
  // A save that completes replaces it.
  fill(9.0f);
  save();
  fill(0.0f);
  TrainStateFile::read(path_).restore(tensors(), be_, kDefaultStream);
  EXPECT_EQ(a0(), 9.0f);
}

// --resume of a directory, a FIFO or a device: refused by name before anything is read (a
// directory's size used to size a huge buffer).
TEST_F(TrainStateTest, ADirectoryOrAFifoIsRefusedBeforeAnythingIsRead) {
  const std::string dir = path_ + ".a_directory";
  std::filesystem::create_directories(dir);
  try {
    (void)TrainStateFile::read(dir);
    ADD_FAILURE() << "a directory was read";
  } catch (const TrainStateError& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
  }
  const std::string fifo = path_ + ".a_fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // O_RDONLY on a FIFO blocks until a writer opens it: hold the write end open first.
  const int w = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(w, 0);
  EXPECT_THROW((void)TrainStateFile::read(fifo), TrainStateError);
  ::close(w);
  ::unlink(fifo.c_str());
  std::filesystem::remove(dir);
}

// A symlink waiting under the old predictable temporary name redirects nothing.
TEST_F(TrainStateTest, APrePlacedSymlinkAtATemporarysNameRedirectsNothing) {
  const std::string victim = path_ + ".victim";
  { std::ofstream(victim) << "precious"; }
  const std::string trap = path_ + ".tmp." + std::to_string(::getpid());
  ASSERT_EQ(::symlink(victim.c_str(), trap.c_str()), 0);
  save();
  std::ifstream in(victim);
  std::string got;
  std::getline(in, got);
  EXPECT_EQ(got, "precious");
  EXPECT_NO_THROW((void)TrainStateFile::read(path_));
  ::unlink(trap.c_str());
  ::unlink(victim.c_str());
}

TEST_F(TrainStateTest, CorruptionAnywhereIsRejectedBeforeWriting) {
  save();
  const auto good = read_bytes(path_);
  fill(5.0f);
  // A flipped bit in the prefix, the header, the data and the checksum.
  for (std::size_t at : {std::size_t{9}, std::size_t{30}, good.size() / 2, good.size() - 12}) {
    auto bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x04);
    write_bytes(path_, bad);
    try {
      TrainStateFile::read(path_).restore(tensors(), be_, kDefaultStream);
      ADD_FAILURE() << "byte " << at << ": a corrupt file loaded";
    } catch (const TrainStateError& e) {
      EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
    }
    EXPECT_EQ(a0(), 5.0f) << "byte " << at;
  }
  // A data byte flip says "checksum".
  auto bad = good;
  bad[good.size() - 40] = static_cast<char>(bad[good.size() - 40] ^ 1);
  write_bytes(path_, bad);
  EXPECT_THROW(
      {
        try {
          TrainStateFile::read(path_);
        } catch (const TrainStateError& e) {
          EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
          throw;
        }
      },
      TrainStateError);
}

TEST_F(TrainStateTest, TruncatedAndForeignFilesAreRejected) {
  save();
  const auto good = read_bytes(path_);
  for (std::size_t keep : {std::size_t{0}, std::size_t{5}, std::size_t{30}, good.size() - 1}) {
    write_bytes(path_, std::vector<char>(good.begin(), good.begin() + static_cast<long>(keep)));
    try {
      TrainStateFile::read(path_);
      ADD_FAILURE() << keep << " bytes loaded";
    } catch (const TrainStateError& e) {
      EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    }
  }
  auto longer = good;
  longer.push_back('x');
  write_bytes(path_, longer);
  EXPECT_THROW(TrainStateFile::read(path_), TrainStateError);
  write_bytes(path_, std::vector<char>(100, 'z'));
  try {
    TrainStateFile::read(path_);
    ADD_FAILURE();
  } catch (const TrainStateError& e) {
    EXPECT_NE(std::string(e.what()).find("magic"), std::string::npos) << e.what();
  }
  auto future = good;
  future[8] = 7;  // version 7
  write_bytes(path_, future);
  try {
    TrainStateFile::read(path_);
    ADD_FAILURE();
  } catch (const TrainStateError& e) {
    EXPECT_NE(std::string(e.what()).find("version 7"), std::string::npos) << e.what();
  }
  std::remove(path_.c_str());
  EXPECT_THROW(TrainStateFile::read(path_), TrainStateError);
}

TEST_F(TrainStateTest, MismatchedEntriesNameTheEntryAndWriteNothing) {
  save();
  fill(3.0f);
  const TrainStateFile f = TrainStateFile::read(path_);
  OwnedTensor other =
      OwnedTensor::empty(alloc_, {3, 6}, DType::kF32, Device::kCpu, Category::kParameter);
  // The right name with the wrong shape: the first target (a) would have been fine, and it
  // must not be written either.
  std::vector<StateTensor> wrong_shape = {{"weight/a", a_.view()}, {"exp_avg/b", other.view()}};
  try {
    f.restore(wrong_shape, be_, kDefaultStream);
    ADD_FAILURE();
  } catch (const TrainStateError& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg/b"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a0(), 3.0f);
  std::vector<StateTensor> missing = {{"weight/a", a_.view()}, {"exp_avg/c", b_.view()}};
  EXPECT_THROW(f.restore(missing, be_, kDefaultStream), TrainStateError);
  std::vector<StateTensor> fewer = {{"weight/a", a_.view()}};
  EXPECT_THROW(f.restore(fewer, be_, kDefaultStream), TrainStateError);  // an extra entry
  EXPECT_EQ(a0(), 3.0f);
}

TEST_F(TrainStateTest, BadNamesAreRefusedAndNothingIsWritten) {
  std::vector<StateTensor> dup = {{"x", a_.view()}, {"x", b_.view()}};
  EXPECT_THROW(write_train_state(path_, meta_, dup, be_, kDefaultStream), TrainStateError);
  EXPECT_FALSE(exists(path_));
  EXPECT_THROW(write_train_state(testing::TempDir() + "no/such/dir/x.mfstate", meta_, tensors(),
                                 be_, kDefaultStream),
               TrainStateError);
}

// A state file around `header` (JSON text) with no data: the layout TrainStateFile::save
// writes (prefix, header, padding to 64, data, checksum, end magic), checksum included.
std::string state_bytes(const std::string& header) {
  std::string b = "MFSTATE1";
  const std::uint32_t version = kTrainStateVersion,
                      hbytes = static_cast<std::uint32_t>(header.size());
  const std::uint64_t dbytes = 0;
  b.append(reinterpret_cast<const char*>(&version), 4);
  b.append(reinterpret_cast<const char*>(&hbytes), 4);
  b.append(reinterpret_cast<const char*>(&dbytes), 8);
  b += header;
  b.resize((b.size() + 63) / 64 * 64, '\0');
  const std::uint64_t sum = Hash64::of(b.data(), b.size());
  b.append(reinterpret_cast<const char*>(&sum), 8);
  return b + "MFSTEND1";
}

std::string header_with(const std::string& field) {
  return R"({"format":"memfit training state","model_spec":"","dtype":"f32","optimizer":"adamw",)"
         R"("options":"{}","attempted":1,"scaler":{"enabled":false,"scale":1.0,"growth_tracker":0},)"
         R"("rng":{"s":[1,2,3,4],"has_spare":false,"spare_bits":0},"entries":[],)" +
         field + "}";
}

// A float or out-of-range number in an integer field is a "bad header" naming it; nlohmann's
// get<T>() cast it to T, undefined behaviour (UBSan under the fuzzer: 1e300 as steps).
TEST(TrainStateHeader, NumbersOutOfAnIntegerFieldsRangeAreRefusedByName) {
  EXPECT_EQ(TrainStateFile::from_bytes(state_bytes(header_with(R"("steps":7)")), "ok").meta().steps,
            7);
  for (const auto& [field, want] :
       {std::pair<std::string, std::string>{R"("steps":1e300)",
                                            "'steps' is 1e+300; valid: an integer"},
        {R"("steps":9223372036854775808)", "'steps' is 9223372036854775808"},
        {R"("steps":-1.5)", "'steps' is -1.5"}}) {
    try {
      (void)TrainStateFile::from_bytes(state_bytes(header_with(field)), "evil.mfstate");
      ADD_FAILURE() << field;
    } catch (const TrainStateError& e) {
      EXPECT_NE(std::string(e.what()).find("training state 'evil.mfstate': bad header: " + want),
                std::string::npos)
          << e.what();
    }
  }
  std::string spare = header_with(R"("steps":1)");
  spare.replace(spare.find(R"("spare_bits":0)"), 14, R"("spare_bits":4294967296)");
  EXPECT_THROW((void)TrainStateFile::from_bytes(state_bytes(spare), "evil"), TrainStateError);
  std::string words = header_with(R"("steps":1)");
  words.replace(words.find("[1,2,3,4]"), 9, "[1,2,3]");
  EXPECT_THROW((void)TrainStateFile::from_bytes(state_bytes(words), "evil"), TrainStateError);
}

}  // namespace
}  // namespace memfit
