// Training-state files: everything a run needs to continue bit-exactly (weights, FP32 masters,
// Adam moments, step counts, loss-scaler state, the Rng) in one file, written atomically and
// verified in full before anything is loaded.
//
//   TrainStateMeta meta; meta.steps = opt.steps(); ...
//   write_train_state("run.mfstate", meta, tensors, backend, stream);  // temp, fsync, rename
//   TrainStateFile f = TrainStateFile::read("run.mfstate");  // magic, version, sizes, checksum
//   f.restore(tensors, backend, stream);   // names, dtypes, shapes all checked, then copied
//
// Trainer::save/load (policies/trainer.h) are the usual callers.
//
// Layout (little-endian; version 1):
//   [0, 8)      magic "MFSTATE1"
//   [8, 12)     u32 version
//   [12, 16)    u32 H: bytes of the JSON header
//   [16, 24)    u64 D: bytes of the data section
//   [24, 24+H)  JSON: the meta fields and the entries [{name, dtype, shape, offset, nbytes}]
//   padding to a multiple of 64, then D bytes of tensor data (each entry 64-byte aligned,
//   offsets relative to the data section), then
//   u64 checksum of every byte before it (hash64 below), and the end magic "MFSTEND1".
// A file whose size is not what its header says is truncated (or has trailing bytes); a
// checksum mismatch is corruption. Both are found before any tensor is written.
//
// Atomicity: the file is written to "<path>.tmp.<pid>" in the same directory, fsync'ed, renamed
// over <path>, and the directory is fsync'ed, so <path> is always either the old file or the
// new one; a failed write removes the temporary file and leaves <path> untouched.
// Errors are TrainStateError (a memfit::Error) naming the file, what is wrong and, where it
// applies, the entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"
#include "core/optimizer.h"
#include "core/rng.h"
#include "memory/error.h"
#include "policies/loss_scaler.h"

namespace memfit {

class TrainStateError : public Error {
 public:
  using Error::Error;
};

inline constexpr std::uint32_t kTrainStateVersion = 1;

// What a state file says about the run besides its tensors. The model spec and the trainer's
// options are there so a load can refuse a file from a different model or optimizer with a
// clear message instead of a shape mismatch deep in the entries.
struct TrainStateMeta {
  std::string model_spec;      // ModelSpec::to_yaml()
  std::string dtype;           // compute dtype name: "f32", "f16", "bf16"
  std::string optimizer;       // Optimizer::name()
  std::string options_json;    // the trainer's options as JSON text (informational)
  std::int64_t steps = 0;      // optimizer updates done
  std::int64_t attempted = 0;  // steps attempted (skipped ones included)
  bool scaler_enabled = false;
  LossScalerState scaler;
  RngState rng;
};

struct SaveOptions {
  // Tests: the write fails (as on a full disk) once this many bytes of the file are written;
  // negative: never.
  std::int64_t fail_after_bytes = -1;
  bool fsync = true;  // false skips the fsyncs (tests that write many files)
};

// Copies each tensor to the host (backend.copy on `stream`, then synchronize) and writes the
// file atomically. Names must be unique and non-empty; tensors on the meta device cannot be
// saved (a dry run has no values). TrainStateError on any failure; <path> is unchanged then.
void write_train_state(const std::string& path, const TrainStateMeta& meta,
                       const std::vector<StateTensor>& tensors, Backend& backend, StreamId stream,
                       const SaveOptions& options = {});

// A state file read into memory and verified (magic, version, sizes, checksum, header, every
// entry's dtype/shape/extent).
class TrainStateFile {
 public:
  struct Entry {
    std::string name;
    DType dtype = DType::kF32;
    Shape shape;
    std::size_t offset = 0;  // in the data section
    std::size_t nbytes = 0;
  };

  // read: the file (a regular file, else refused by name before reading) through from_bytes,
  // which checks bytes already in memory; `path` names them in errors.
  static TrainStateFile read(const std::string& path);
  static TrainStateFile from_bytes(std::string_view bytes, const std::string& path);

  const std::string& path() const { return path_; }
  const TrainStateMeta& meta() const { return meta_; }
  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* find(std::string_view name) const;

  // Checks that the file holds exactly the entries named by `targets` (no missing, no extra),
  // each with the target's dtype and shape, THEN copies them in (backend.copy from the host,
  // then synchronize). Throws TrainStateError naming the first mismatch, having written
  // nothing.
  void restore(const std::vector<StateTensor>& targets, Backend& backend, StreamId stream) const;

 private:
  std::string path_;
  TrainStateMeta meta_;
  std::vector<Entry> entries_;
  std::vector<std::byte> data_;  // the data section
};

// The file checksum: a 64-bit hash built from xxHash64's round and avalanche steps
// (Collet; 4 lanes of 8-byte words, so it runs at several GB/s). Streaming: update() any
// number of times, then digest(); equal input gives equal output however it is chunked.
class Hash64 {
 public:
  void update(const void* data, std::size_t n);
  std::uint64_t digest() const;
  static std::uint64_t of(const void* data, std::size_t n);

 private:
  void stripe(const unsigned char* p);
  std::uint64_t v_[4] = {0x60EA27EEADC0B5D6ull, 0xC2B2AE3D27D4EB4Full, 0ull,
                         0x61C8864E7A143579ull};  // xxh64's seed-0 lane starts
  std::uint64_t total_ = 0;
  unsigned char buf_[32] = {};
  std::size_t buffered_ = 0;
};

}  // namespace memfit
