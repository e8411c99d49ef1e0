#include "core/text_dataset.h"

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "core/rng.h"
#include "memory/error.h"
#include "memory/size.h"
#include "profiler/read_file.h"

namespace memfit {

namespace {

std::string read_file(const std::string& path) {
  BoundedRead r = try_read_file_bounded(path, kMaxDataFileBytes, "data file");
  if (!r.error.empty()) {
    throw InvalidArgument(r.error + " (a text file, e.g. data/corpus.txt)");
  }
  return std::move(r.bytes);
}

}  // namespace

TextDataset::TextDataset(const std::string& path) : TextDataset(read_file(path), path) {}

TextDataset::TextDataset(std::string text, std::string source)
    : bytes_(std::move(text)), source_(std::move(source)) {
  if (bytes_.empty()) {
    throw InvalidArgument("data file '" + source_ +
                          "' is empty: a byte-level dataset needs at least seq_len + 1 bytes");
  }
}

TextDataset TextDataset::from_text(std::string text, std::string source) {
  return TextDataset(std::move(text), std::move(source));
}

void TextDataset::require_seq_len(std::int64_t seq_len) const {
  if (seq_len < 1) {
    throw InvalidArgument("sequence length " + std::to_string(seq_len) + " must be >= 1");
  }
  if (size() < seq_len + 1) {
    throw InvalidArgument("data file '" + source_ + "' has " + std::to_string(size()) +
                          " bytes; sequences of " + std::to_string(seq_len) +
                          " tokens need at least " + std::to_string(seq_len + 1) +
                          " (seq_len + 1: each token's target is the next byte)");
  }
}

Batch TextDataset::make(std::int64_t batch, std::int64_t seq_len) const {
  if (batch < 1) throw InvalidArgument("batch " + std::to_string(batch) + " must be >= 1");
  require_seq_len(seq_len);
  const std::size_t n = checked_mul(static_cast<std::size_t>(batch),
                                    static_cast<std::size_t>(seq_len), "batch * seq_len");
  // Token ids are int32 and a GEMM's rows (B*T) are 32-bit in BLAS: a larger batch is no use.
  if (n > static_cast<std::size_t>(INT32_MAX)) {
    throw InvalidArgument("batch " + std::to_string(batch) + " x " + std::to_string(seq_len) +
                          " is " + std::to_string(n) + " tokens; at most 2^31 - 1 per batch");
  }
  Batch b;
  b.batch = batch;
  b.seq_len = seq_len;
  b.tokens.resize(n);
  b.targets.resize(n);
  return b;
}

void TextDataset::fill_window(Batch& b, std::int64_t row, std::int64_t start) const {
  const auto* src = reinterpret_cast<const unsigned char*>(bytes_.data()) + start;
  const std::size_t off = static_cast<std::size_t>(row * b.seq_len);
  for (std::size_t t = 0; t < static_cast<std::size_t>(b.seq_len); ++t) {
    b.tokens[off + t] = src[t];
    b.targets[off + t] = src[t + 1];
  }
}

Batch TextDataset::sample(std::int64_t batch, std::int64_t seq_len, Rng& rng) const {
  Batch b = make(batch, seq_len);
  const std::int64_t starts = size() - seq_len;  // >= 1 after require_seq_len
  for (std::int64_t i = 0; i < batch; ++i) fill_window(b, i, rng.below(starts));
  return b;
}

Batch TextDataset::sequential(std::int64_t batch, std::int64_t seq_len, std::int64_t pos) const {
  Batch b = make(batch, seq_len);
  if (pos < 0) throw InvalidArgument("position " + std::to_string(pos) + " must be >= 0");
  const std::int64_t starts = size() - seq_len;
  std::int64_t s = pos % starts;
  for (std::int64_t i = 0; i < batch; ++i) {
    fill_window(b, i, s);
    s = (s + seq_len) % starts;
  }
  return b;
}

Batch rank_rows(const Batch& global, int r, int ranks) {
  if (ranks < 1 || r < 0 || r >= ranks || global.batch % ranks != 0) {
    throw InvalidArgument("rank_rows: rank " + std::to_string(r) + " of " +
                          std::to_string(ranks) + " from a batch of " +
                          std::to_string(global.batch) +
                          "; valid: 0 <= rank < ranks, a batch divisible by the ranks");
  }
  if (ranks == 1) return global;
  const std::int64_t per = global.batch / ranks;
  const auto first = static_cast<std::ptrdiff_t>(r * per * global.seq_len);
  const auto last = static_cast<std::ptrdiff_t>((r + 1) * per * global.seq_len);
  Batch b;
  b.batch = per;
  b.seq_len = global.seq_len;
  b.tokens.assign(global.tokens.begin() + first, global.tokens.begin() + last);
  b.targets.assign(global.targets.begin() + first, global.targets.begin() + last);
  return b;
}

}  // namespace memfit
