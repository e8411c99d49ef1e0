#include "memory/alloc_trace.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>

#include "memory/error.h"
#include "tests/support/gpt_trace.h"

namespace memfit {
namespace {

std::string validate_error(const AllocTrace& t) {
  try {
    t.validate();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(AllocTraceValidate, RefusesMalformedTracesNamingTheOp) {
  AllocTrace t;
  t.alloc(100, Category::kActivation, 0, "a");  // id 0
  t.free(7);
  EXPECT_NE(validate_error(t).find("op 1 (free id 7): id was never allocated"), std::string::npos)
      << validate_error(t);

  AllocTrace twice;
  twice.ops.push_back({TraceOpKind::kAlloc, 3, 64, Category::kTemporary, 0, "x"});
  twice.ops.push_back({TraceOpKind::kAlloc, 3, 64, Category::kTemporary, 0, "y"});
  EXPECT_NE(validate_error(twice).find("op 1 (alloc id 3): id is already live (allocated at op 0"),
            std::string::npos)
      << validate_error(twice);

  AllocTrace double_free;
  const std::uint64_t id = double_free.alloc(64, Category::kTemporary, 0, "x");
  double_free.empty_cache();
  double_free.free(id);
  double_free.free(id);
  EXPECT_NE(
      validate_error(double_free).find("op 3 (free id 0): id is not live: already freed at op 2"),
      std::string::npos)
      << validate_error(double_free);

  AllocTrace dead_record;
  const std::uint64_t d = dead_record.alloc(64, Category::kTemporary, 0, "x");
  dead_record.free(d);
  dead_record.record_stream(d, 1);
  EXPECT_NE(validate_error(dead_record).find("op 2 (record_stream id 0)"), std::string::npos)
      << validate_error(dead_record);

  AllocTrace zero;
  zero.alloc(0, Category::kTemporary, 0, "x");
  EXPECT_NE(validate_error(zero).find("op 0 (alloc id 0): size 0"), std::string::npos);

  AllocTrace steps;
  steps.step(2);
  steps.step(2);
  EXPECT_NE(validate_error(steps).find("op 1 (step): step 2 after step 2"), std::string::npos)
      << validate_error(steps);

  // An id may be reused once freed (real traces name blocks by address).
  AllocTrace reuse;
  reuse.ops.push_back({TraceOpKind::kAlloc, 5, 64, Category::kTemporary, 0, "x"});
  reuse.ops.push_back({TraceOpKind::kFree, 5, 0, {}, 0, {}});
  reuse.ops.push_back({TraceOpKind::kAlloc, 5, 32, Category::kTemporary, 0, "y"});
  EXPECT_EQ(validate_error(reuse), "");
  EXPECT_EQ(reuse.validate().persistent_bytes, 32u);
}

TEST(AllocTraceText, RoundTripsAndNamesBadLines) {
  GptTraceSpec spec;  // a small GPT, so every kind of op and tag appears
  spec.layers = 1, spec.hidden = 16, spec.heads = 4, spec.seq_len = 8, spec.max_seq_len = 8;
  spec.vocab = 64, spec.micro_batch = 2, spec.steps = 2;
  const AllocTrace t = make_gpt_training_trace(spec);
  std::ostringstream out;
  write_trace(out, t);
  std::istringstream in(out.str());
  const AllocTrace back = read_trace(in);
  ASSERT_EQ(back.ops.size(), t.ops.size());
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    const TraceOp &a = t.ops[i], &b = back.ops[i];
    ASSERT_EQ(a.kind, b.kind) << i;
    EXPECT_EQ(a.id, b.id) << i;
    EXPECT_EQ(a.tag, b.tag) << i;
    if (a.kind == TraceOpKind::kAlloc) {
      EXPECT_EQ(a.size, b.size) << i;
      EXPECT_EQ(a.category, b.category) << i;
    }
    if (a.kind == TraceOpKind::kAlloc || a.kind == TraceOpKind::kRecordStream)
      EXPECT_EQ(a.stream, b.stream) << i;
  }
  // Builder ids continue above the ids read, so appending never collides.
  AllocTrace more = back;
  more.alloc(8, Category::kTemporary, 0, "appended");
  EXPECT_NO_THROW(more.validate());

  auto error_of = [](const std::string& text) -> std::string {
    std::istringstream in(text);
    try {
      read_trace(in, "t.trace");
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of("# c\nalloc 1 64 activation 0 x\nfree one\n").find("t.trace:3: id 'one'"),
            std::string::npos);
  EXPECT_NE(error_of("alloc 1 64 weights 0\n").find("t.trace:1: unknown memory category"),
            std::string::npos);
  EXPECT_NE(error_of("\n\nmalloc 3\n").find("t.trace:3: unknown operation 'malloc'"),
            std::string::npos);
  EXPECT_NE(error_of("free 3 4\n").find("t.trace:1: unexpected text"), std::string::npos);
  EXPECT_NE(error_of("alloc 1 64 activation\n").find("missing stream"), std::string::npos);
  EXPECT_EQ(error_of("alloc 1 64 activation 0 a tag with spaces\nfree 1\n"), "");
}

// A trace written on Windows (or through git's autocrlf) reads the same ("step number '1' is
// not a non-negative integer" before).
TEST(AllocTraceText, CrlfLineEndingsReadAsLf) {
  const std::string lf = "# t\nalloc 1 4096 activation 0 h0.qkv\nstep 1\nphase forward\nfree 1\n";
  std::string crlf;
  for (char c : lf) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  const AllocTrace a = parse_trace(lf, "lf.trace");
  const AllocTrace b = parse_trace(crlf, "crlf.trace");
  ASSERT_EQ(b.ops.size(), 4u);
  std::ostringstream wa, wb;
  write_trace(wa, a);
  write_trace(wb, b);
  EXPECT_EQ(wa.str(), wb.str());
  EXPECT_EQ(b.ops[0].tag, "h0.qkv");
  EXPECT_EQ(b.ops[1].id, 1u);
  EXPECT_EQ(b.ops[2].tag, "forward");
  std::istringstream in(crlf);
  EXPECT_EQ(read_trace(in, "crlf.trace").ops.size(), 4u);
  try {
    parse_trace("step 1\r\nstep x\r\n", "bad.trace");
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bad.trace:2: step number 'x'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace memfit
