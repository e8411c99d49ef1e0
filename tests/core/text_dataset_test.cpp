// TextDataset: windows and targets, determinism, the bundled corpus, and the errors.
#include "core/text_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include "core/rng.h"
#include "memory/error.h"

namespace memfit {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TextDataset, WindowsAreTextAndTargetsAreTheNextByte) {
  std::string text;
  for (int i = 0; i < 300; ++i) text.push_back(static_cast<char>(i % 251));
  const TextDataset d = TextDataset::from_text(text);
  Rng rng(7);
  const Batch b = d.sample(4, 16, rng);
  ASSERT_EQ(b.batch, 4);
  ASSERT_EQ(b.seq_len, 16);
  ASSERT_EQ(b.tokens.size(), 64u);
  ASSERT_EQ(b.targets.size(), 64u);
  for (int r = 0; r < 4; ++r) {
    // The row and its last target are a contiguous run of the text, targets shifted by one.
    std::string run;
    for (int t = 0; t < 16; ++t) {
      EXPECT_GE(b.tokens[r * 16 + t], 0);
      EXPECT_LT(b.tokens[r * 16 + t], TextDataset::kVocab);
      if (t + 1 < 16) EXPECT_EQ(b.targets[r * 16 + t], b.tokens[r * 16 + t + 1]);
      run.push_back(static_cast<char>(b.tokens[r * 16 + t]));
    }
    run.push_back(static_cast<char>(b.targets[r * 16 + 15]));
    EXPECT_NE(text.find(run), std::string::npos) << "row " << r;
  }
}

TEST(TextDataset, SamplingFollowsTheRngAndCoversTheFile) {
  std::string text(1000, 'a');
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>('a' + i % 26);
  const TextDataset d = TextDataset::from_text(text);
  Rng r1(123), r2(123), r3(124);
  const Batch a = d.sample(8, 32, r1);
  const Batch b = d.sample(8, 32, r2);
  const Batch c = d.sample(8, 32, r3);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_NE(a.tokens, c.tokens);
  // The last window (start = size - T - 1) is reachable and nothing reads past the end.
  const TextDataset small = TextDataset::from_text("abcdef");
  Rng rng(1);
  for (int i = 0; i < 200; ++i) {
    const Batch w = small.sample(1, 5, rng);
    EXPECT_EQ(w.tokens[0], 'a');
    EXPECT_EQ(w.targets[4], 'f');
  }
  std::set<std::int32_t> starts;
  const TextDataset mid = TextDataset::from_text("abcdefgh");
  for (int i = 0; i < 400; ++i) starts.insert(mid.sample(1, 3, rng).tokens[0]);
  EXPECT_EQ(starts, (std::set<std::int32_t>{'a', 'b', 'c', 'd', 'e'}));
}

TEST(TextDataset, SequentialIsDeterministicAndWraps) {
  const TextDataset d = TextDataset::from_text("0123456789");
  const Batch b = d.sequential(3, 4, 0);  // starts 0, 4, then 8 wraps (6 starts: 8 % 6 = 2)
  EXPECT_EQ(b.tokens, (std::vector<std::int32_t>{'0', '1', '2', '3', '4', '5', '6', '7', '2', '3',
                                                 '4', '5'}));
  EXPECT_EQ(b.targets[3], '4');
  EXPECT_EQ(b.targets[11], '6');
  EXPECT_EQ(d.sequential(3, 4, 0).tokens, b.tokens);
  EXPECT_EQ(d.sequential(1, 4, 1).tokens, (std::vector<std::int32_t>{'1', '2', '3', '4'}));
}

TEST(TextDataset, ErrorsNameTheFileAndWhatWouldBeValid) {
  const std::string missing = testing::TempDir() + "no_such_corpus.txt";
  EXPECT_NE(error_of([&] { TextDataset d(missing); }).find(missing), std::string::npos);

  const std::string empty = testing::TempDir() + "empty_corpus_" + std::to_string(getpid());
  { std::ofstream(empty).flush(); }
  const std::string e = error_of([&] { TextDataset d(empty); });
  EXPECT_NE(e.find(empty), std::string::npos) << e;
  EXPECT_NE(e.find("empty"), std::string::npos) << e;
  std::remove(empty.c_str());

  const TextDataset d = TextDataset::from_text("short text", "short.txt");
  Rng rng(1);
  const std::string s = error_of([&] { d.sample(2, 64, rng); });
  EXPECT_NE(s.find("short.txt"), std::string::npos) << s;
  EXPECT_NE(s.find("65"), std::string::npos) << s;  // the minimum length
  EXPECT_NE(error_of([&] { d.sample(0, 4, rng); }).find("batch"), std::string::npos);
  EXPECT_NE(error_of([&] { d.sequential(1, 0); }).find(">= 1"), std::string::npos);
  EXPECT_NE(error_of([&] { d.sample(INT64_MAX, 4, rng); }).find("overflow"), std::string::npos);
  EXPECT_NE(error_of([&] { d.sample(std::int64_t{1} << 30, 4, rng); }).find("2^31"),
            std::string::npos);
  EXPECT_NO_THROW(d.sample(1, 9, rng));  // exactly seq_len + 1 bytes
}

TEST(TextDataset, BundledCorpusIsThereAndLargeEnough) {
  const TextDataset d(std::string(MEMFIT_TEST_SOURCE_DIR) + "/data/corpus.txt");
  EXPECT_GT(d.size(), 64 * 1024);    // enough distinct windows for a few hundred steps
  EXPECT_LT(d.size(), 1024 * 1024);  // a few hundred KB at most
  d.require_seq_len(1024);
}

// Data parallel: rank r's rows of a global batch are rows [r B/N, (r+1) B/N), and the ranks'
// rows together are the batch.
TEST(RankRows, EachRankGetsItsContiguousRowsAndTogetherTheBatch) {
  Batch g;
  g.batch = 6;
  g.seq_len = 2;
  for (std::int32_t i = 0; i < 12; ++i) {
    g.tokens.push_back(i);
    g.targets.push_back(100 + i);
  }
  const Batch r1 = rank_rows(g, 1, 3);
  EXPECT_EQ(r1.batch, 2);
  EXPECT_EQ(r1.seq_len, 2);
  EXPECT_EQ(r1.tokens, (std::vector<std::int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(r1.targets, (std::vector<std::int32_t>{104, 105, 106, 107}));
  std::vector<std::int32_t> joined;
  for (int r = 0; r < 2; ++r) {
    const Batch b = rank_rows(g, r, 2);
    joined.insert(joined.end(), b.tokens.begin(), b.tokens.end());
  }
  EXPECT_EQ(joined, g.tokens);
  EXPECT_EQ(rank_rows(g, 0, 1).tokens, g.tokens);
  EXPECT_THROW(rank_rows(g, 0, 4), InvalidArgument);  // 6 rows over 4 ranks
  EXPECT_THROW(rank_rows(g, 3, 3), InvalidArgument);
}

}  // namespace
}  // namespace memfit
