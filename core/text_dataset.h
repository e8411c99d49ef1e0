// TextDataset: byte-level language-model data from a text file (vocabulary 256: a token is a
// byte), and Batch, one global batch of token windows on the host.
//
//   TextDataset data("data/corpus.txt");             // the bundled corpus, or any file
//   Batch b = data.sample(16, 128, rng);             // 16 random windows of 128 tokens
//   Batch e = data.sequential(16, 128, /*pos=*/0);   // windows at 0, 128, 256, ... (evaluation)
//
// A window starting at byte s has tokens bytes[s, s+T) and targets bytes[s+1, s+T+1) (the next
// byte), so a file of n bytes holds n - T windows of length T and needs n >= T + 1.
// sample() draws each start uniformly from [0, n - T - 1] with rng.below (core/rng.h), so the
// windows follow the Rng's state: a resumed run that restores the Rng draws the same batches.
// sequential() is deterministic and needs no Rng: window i starts at (pos + i*T) mod (n - T).
// Errors (InvalidArgument, naming the file and what would be valid): a file that cannot be
// read, an empty file, B or T < 1, B*T overflowing, and a file shorter than T + 1 bytes.
// The whole file is held in memory (the bundled corpus is a few hundred KB). Immutable after
// construction, so it may be shared between threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memfit {

class Rng;

// One global batch on the host: tokens and next-token targets, (batch, seq_len) row-major.
struct Batch {
  std::int64_t batch = 0;
  std::int64_t seq_len = 0;
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> targets;
};

// Rank r's rows of a global batch under data parallelism: rows [r B/N, (r+1) B/N), B/N each.
// InvalidArgument unless 0 <= r < ranks and ranks divides the batch. One rank: the batch.
Batch rank_rows(const Batch& global, int r, int ranks);

class TextDataset {
 public:
  static constexpr std::int64_t kVocab = 256;

  explicit TextDataset(const std::string& path);
  // Text already in memory; `source` names it in errors.
  static TextDataset from_text(std::string text, std::string source = "<text>");

  std::int64_t size() const { return static_cast<std::int64_t>(bytes_.size()); }
  const std::string& source() const { return source_; }
  const std::string& text() const { return bytes_; }

  // InvalidArgument unless 1 <= seq_len and size() >= seq_len + 1 (says both lengths).
  void require_seq_len(std::int64_t seq_len) const;

  Batch sample(std::int64_t batch, std::int64_t seq_len, Rng& rng) const;
  Batch sequential(std::int64_t batch, std::int64_t seq_len, std::int64_t pos = 0) const;

 private:
  TextDataset(std::string text, std::string source);
  Batch make(std::int64_t batch, std::int64_t seq_len) const;  // checks, sizes the vectors
  void fill_window(Batch& b, std::int64_t row, std::int64_t start) const;

  std::string bytes_;
  std::string source_;
};

}  // namespace memfit
