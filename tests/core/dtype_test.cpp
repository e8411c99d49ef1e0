// DType conversions against references written here independently of core/dtype.cpp:
// values decoded with ldexp, rounding done by searching the sorted table of every finite
// f16/bf16 value in double precision (ties to the even bit pattern), and the vector path
// compared bit for bit with the scalar path.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "memory/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define MEMFIT_TEST_X86 1
#endif

namespace memfit {
namespace {

using u16 = std::uint16_t;
using u32 = std::uint32_t;

u32 bits(float f) {
  u32 u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(u32 u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- independent references -----------------------------------------------------------------

// binary16: 5 exponent bits (bias 15), 10 mantissa bits.
double ref_f16_value(u16 h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0x1F) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

// bfloat16: 8 exponent bits (bias 127), 7 mantissa bits.
double ref_bf16_value(u16 b) {
  const int e = (b >> 7) & 0xFF, m = b & 0x7F;
  const double sign = (b & 0x8000) ? -1.0 : 1.0;
  if (e == 0xFF) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -133);
  return sign * std::ldexp(128 + m, e - 134);
}

// Every positive finite value of a 16-bit format, ascending, plus infinity placed where the
// next exponent would start (2^16 / 2^128): IEEE overflow is "rounds, with an unbounded
// exponent, to at least that", so treating it as one more (even) entry gives the right rule.
struct Table {
  std::vector<double> value;
  std::vector<u16> pattern;
};

Table make_table(double (*decode)(u16), u16 max_finite, u16 inf, double inf_at) {
  Table t;
  for (u32 p = 0; p <= max_finite; ++p) {
    t.value.push_back(decode(static_cast<u16>(p)));
    t.pattern.push_back(static_cast<u16>(p));
  }
  t.value.push_back(inf_at);
  t.pattern.push_back(inf);
  return t;
}

const Table& f16_table() {
  static const Table t = make_table(ref_f16_value, 0x7BFF, 0x7C00, 65536.0);
  return t;
}
const Table& bf16_table() {
  static const Table t = make_table(ref_bf16_value, 0x7F7F, 0x7F80, std::ldexp(1.0, 128));
  return t;
}

// Round a non-NaN f32 to the table's format: nearest value, ties to the even pattern.
u16 ref_round(const Table& t, float f) {
  const u16 sign = (bits(f) & 0x80000000u) ? 0x8000 : 0;
  const double v = std::fabs(static_cast<double>(f));  // exact
  if (v >= t.value.back()) return sign | t.pattern.back();
  const auto hi = std::upper_bound(t.value.begin(), t.value.end(), v) - t.value.begin();
  const auto lo = hi - 1;                                     // value[lo] <= v < value[hi]
  const double dlo = v - t.value[lo], dhi = t.value[hi] - v;  // exact: few significant bits
  std::size_t pick;
  if (dlo < dhi) {
    pick = lo;
  } else if (dhi < dlo) {
    pick = hi;
  } else {
    pick = (t.pattern[lo] & 1) ? hi : lo;
  }
  return sign | t.pattern[pick];
}

// The documented NaN rules (core/dtype.h).
u16 nan_to_f16(u32 x) { return ((x >> 16) & 0x8000) | 0x7E00 | ((x >> 13) & 0x3FF); }
u16 nan_to_bf16(u32 x) { return static_cast<u16>((x >> 16) | 0x40); }
bool is_nan_f32(u32 x) { return (x & 0x7FFFFFFFu) > 0x7F800000u; }

u16 expect_f16(float f) {
  return is_nan_f32(bits(f)) ? nan_to_f16(bits(f)) : ref_round(f16_table(), f);
}
u16 expect_bf16(float f) {
  return is_nan_f32(bits(f)) ? nan_to_bf16(bits(f)) : ref_round(bf16_table(), f);
}

// f32 inputs that probe every rounding case: all exponents with edge and random mantissas,
// every f16 and bf16 value, every midpoint between neighbours and one f32 ulp either side,
// the overflow thresholds, the denormal boundaries, infinities, -0 and NaNs with payloads.
std::vector<float> special_f32_inputs() {
  std::vector<u32> v;
  std::mt19937 rng(12345);
  const u32 edge_mantissas[] = {0,        1,        2,        3,        0xFFF,    0x1000,
                                0x1001,   0x1FFF,   0x2000,   0x3000,   0x5000,   0x7FFF,
                                0x8000,   0x8001,   0xFFFF,   0x10000,  0x18000,  0x400000,
                                0x400001, 0x7FDFFF, 0x7FE000, 0x7FF000, 0x7FFFFE, 0x7FFFFF};
  for (u32 sign = 0; sign < 2; ++sign) {
    for (u32 e = 0; e < 256; ++e) {
      for (u32 m : edge_mantissas) v.push_back((sign << 31) | (e << 23) | m);
      for (int k = 0; k < 64; ++k) v.push_back((sign << 31) | (e << 23) | (rng() & 0x7FFFFFu));
    }
  }
  auto around = [&v](float mid) {
    for (float s : {1.0f, -1.0f}) {
      const float m = s * mid;
      v.push_back(bits(m));
      v.push_back(bits(std::nextafter(m, INFINITY)));
      v.push_back(bits(std::nextafter(m, -INFINITY)));
    }
  };
  const Table& h = f16_table();
  for (std::size_t i = 0; i + 1 < h.value.size(); ++i) {
    around(static_cast<float>(h.value[i]));
    around(static_cast<float>((h.value[i] + h.value[i + 1]) / 2));  // 12 bits: exact in f32
  }
  for (u32 p = 0; p <= 0x7F7F; ++p) {
    around(from_bits(p << 16));
    around(from_bits((p << 16) | 0x8000));  // the midpoint to the next bf16 (or to infinity)
  }
  for (float f : {65504.0f, 65519.0f, 65520.0f, 65536.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f,
                  0x1p-26f, std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::denorm_min(), 1.0f, 1.5f, 0.1f}) {
    around(f);
  }
  for (u32 x : {0x7F800000u, 0x7F800001u, 0x7F801FFFu, 0x7F802000u, 0x7F80FFFFu, 0x7F808000u,
                0x7FBFFFFFu, 0x7FC00000u, 0x7FFFFFFFu, 0x7FA00000u, 0x00000000u}) {
    v.push_back(x);
    v.push_back(x | 0x80000000u);
  }
  for (int k = 0; k < 4096; ++k) v.push_back(0x7F800001u | (rng() & 0x807FFFFFu));  // NaNs
  std::vector<float> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

std::vector<float> random_f32_inputs(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> out(n);
  for (float& f : out) f = from_bits(rng());
  return out;
}

constexpr std::size_t kRandomInputs = std::size_t{4} << 20;

template <typename Ref>
void check_f32_to_16(const std::vector<float>& in, u16 (*fn)(float), Ref ref, const char* name) {
  std::size_t failures = 0;
  for (float f : in) {
    const u16 got = fn(f), want = ref(f);
    if (got != want && ++failures <= 10) {
      ADD_FAILURE() << name << "(0x" << std::hex << bits(f) << " = " << f << ") = 0x" << got
                    << ", want 0x" << want;
    }
  }
  EXPECT_EQ(failures, 0u) << name << " over " << in.size() << " inputs";
}

// ---- scalar conversions ---------------------------------------------------------------------

TEST(DTypeTest, F16ToF32IsExactForAllPatterns) {
  for (u32 p = 0; p < 0x10000; ++p) {
    const u16 h = static_cast<u16>(p);
    const float f = f16_to_f32(h);
    const double want = ref_f16_value(h);
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << p;
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << p;
      // Quiet bit set, payload in the top mantissa bits.
      ASSERT_EQ(bits(f), (u32(h & 0x8000) << 16) | 0x7FC00000u | (u32(h & 0x3FF) << 13)) << p;
    } else {
      ASSERT_EQ(static_cast<double>(f), want) << std::hex << p;
    }
  }
}

TEST(DTypeTest, BF16ToF32IsExactForAllPatterns) {
  for (u32 p = 0; p < 0x10000; ++p) {
    const u16 b = static_cast<u16>(p);
    const float f = bf16_to_f32(b);
    const double want = ref_bf16_value(b);
    ASSERT_EQ(std::signbit(f), (b & 0x8000) != 0) << std::hex << p;
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << p;
    } else {
      ASSERT_EQ(static_cast<double>(f), want) << std::hex << p;
    }
  }
}

TEST(DTypeTest, RoundTripsThroughF32ForAllPatterns) {
  for (u32 p = 0; p < 0x10000; ++p) {
    const u16 x = static_cast<u16>(p);
    const u16 h = f32_to_f16(f16_to_f32(x));
    const u16 b = f32_to_bf16(bf16_to_f32(x));
    if (std::isnan(ref_f16_value(x))) {
      EXPECT_EQ(h, x | 0x0200) << std::hex << p;  // quieted, sign and payload kept
      EXPECT_TRUE(std::isnan(f16_to_f32(h)));
    } else {
      ASSERT_EQ(h, x) << std::hex << p;
    }
    if (std::isnan(ref_bf16_value(x))) {
      EXPECT_EQ(b, x | 0x0040) << std::hex << p;
      EXPECT_TRUE(std::isnan(bf16_to_f32(b)));
    } else {
      ASSERT_EQ(b, x) << std::hex << p;
    }
  }
}

TEST(DTypeTest, F32ToF16RoundsToNearestEven) {
  check_f32_to_16(special_f32_inputs(), f32_to_f16, expect_f16, "f32_to_f16");
  check_f32_to_16(random_f32_inputs(kRandomInputs, 1), f32_to_f16, expect_f16, "f32_to_f16");
}

TEST(DTypeTest, F32ToBF16RoundsToNearestEven) {
  check_f32_to_16(special_f32_inputs(), f32_to_bf16, expect_bf16, "f32_to_bf16");
  check_f32_to_16(random_f32_inputs(kRandomInputs, 2), f32_to_bf16, expect_bf16, "f32_to_bf16");
}

TEST(DTypeTest, NamedBoundaries) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);                        // largest finite f16
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7BFF);  // just under the tie
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);                        // tie to even: inf
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xFC00);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);  // smallest denormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // tie to even: zero
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002);  // 1.5 ulp: tie to 2
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(f32_to_bf16(from_bits(0x7F80FFFFu)), 0x7FC0);             // truncation would give inf
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808000u)), 0x3F80);             // tie, even stays
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F818000u)), 0x3F82);             // tie, odd rounds up
}

// ---- convert(): dispatch, pairs, tails, alignment, errors -----------------------------------

constexpr DType kAll[] = {DType::kF32, DType::kF16, DType::kBF16};

// Raw source bytes for n elements: every 16-bit pattern cycles through; f32 sources mix the
// special inputs with random bit patterns.
std::vector<unsigned char> source_bytes(DType t, std::size_t n, std::uint32_t seed) {
  std::vector<unsigned char> b(n * dtype_size(t));
  if (t == DType::kF32) {
    std::vector<float> sp = special_f32_inputs();
    std::mt19937 rng(seed);
    std::shuffle(sp.begin(), sp.end(), rng);
    for (std::size_t i = 0; i < n; ++i) {
      const float f = (i % 2 && i / 2 < sp.size()) ? sp[i / 2] : from_bits(rng());
      std::memcpy(b.data() + 4 * i, &f, 4);
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const u16 x = static_cast<u16>((i * 40503u + seed) & 0xFFFF);  // odd step: all patterns
      std::memcpy(b.data() + 2 * i, &x, 2);
    }
  }
  return b;
}

// One element through the scalar functions, as raw bits.
u32 convert_one(const unsigned char* src, DType st, DType dt) {
  float f;
  if (st == DType::kF32) {
    std::memcpy(&f, src, 4);
  } else {
    u16 x;
    std::memcpy(&x, src, 2);
    f = st == DType::kF16 ? f16_to_f32(x) : bf16_to_f32(x);
  }
  if (st == dt) {  // identity copies bits, NaN payloads included
    u32 r = 0;
    std::memcpy(&r, src, dtype_size(st));
    return r;
  }
  if (dt == DType::kF32) return bits(f);
  return dt == DType::kF16 ? f32_to_f16(f) : f32_to_bf16(f);
}

TEST(DTypeTest, ConvertEveryPairMatchesElementFunctions) {
  const std::size_t n = 0x10000 * 3 + 5;
  for (DType st : kAll) {
    for (DType dt : kAll) {
      const std::vector<unsigned char> src = source_bytes(st, n, 7);
      std::vector<unsigned char> dst(n * dtype_size(dt), 0xAB);
      convert(src.data(), st, dst.data(), dt, n);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        u32 got = 0;
        std::memcpy(&got, dst.data() + i * dtype_size(dt), dtype_size(dt));
        const u32 want = convert_one(src.data() + i * dtype_size(st), st, dt);
        if (got != want && ++bad <= 5) {
          ADD_FAILURE() << dtype_name(st) << "->" << dtype_name(dt) << " [" << i << "] = 0x"
                        << std::hex << got << ", want 0x" << want;
        }
      }
      EXPECT_EQ(bad, 0u) << dtype_name(st) << "->" << dtype_name(dt);
    }
  }
}

// f16 <-> bf16 round once, from the exact value: checked against the table reference over
// every source pattern (each 16-bit value is exact in f32, so the reference input is exact).
TEST(DTypeTest, SixteenBitPairsRoundOnceFromTheExactValue) {
  std::vector<u16> all(0x10000), out(0x10000);
  for (u32 p = 0; p < 0x10000; ++p) all[p] = static_cast<u16>(p);
  convert(all.data(), DType::kF16, out.data(), DType::kBF16, all.size());
  for (u32 p = 0; p < 0x10000; ++p) {
    const double v = ref_f16_value(all[p]);
    if (std::isnan(v)) continue;  // NaN rules: checked through f32 above
    ASSERT_EQ(out[p], ref_round(bf16_table(), static_cast<float>(v))) << std::hex << p;
  }
  convert(all.data(), DType::kBF16, out.data(), DType::kF16, all.size());
  for (u32 p = 0; p < 0x10000; ++p) {
    const double v = ref_bf16_value(all[p]);
    if (std::isnan(v)) {
      ASSERT_TRUE(std::isnan(ref_f16_value(out[p]))) << std::hex << p;
      continue;
    }
    ASSERT_EQ(out[p], ref_round(f16_table(), static_cast<float>(v))) << std::hex << p;
  }
}

TEST(DTypeTest, ConvertSamePointerSameDTypeIsANoOp) {
  std::vector<unsigned char> buf = source_bytes(DType::kBF16, 100, 3);
  const std::vector<unsigned char> before = buf;
  convert(buf.data(), DType::kBF16, buf.data(), DType::kBF16, 100);
  EXPECT_EQ(buf, before);
}

TEST(DTypeTest, ConvertRejectsBadArguments) {
  float f[8] = {};
  u16 h[8] = {};
  EXPECT_THROW(convert(nullptr, DType::kF32, h, DType::kF16, 8), InvalidArgument);
  EXPECT_THROW(convert(f, DType::kF32, nullptr, DType::kF16, 8), InvalidArgument);
  EXPECT_NO_THROW(convert(nullptr, DType::kF32, nullptr, DType::kF16, 0));
  // f32 -> f16 in place overlaps (a plain loop would read what it already wrote).
  EXPECT_THROW(convert(f, DType::kF32, f, DType::kF16, 8), InvalidArgument);
  EXPECT_THROW(convert(f, DType::kF32, reinterpret_cast<char*>(f) + 30, DType::kF16, 8),
               InvalidArgument);
  EXPECT_NO_THROW(convert(f, DType::kF32, reinterpret_cast<char*>(f) + 32, DType::kF16, 0));
  EXPECT_THROW(convert(f, static_cast<DType>(7), h, DType::kF16, 8), InvalidArgument);
  EXPECT_THROW(detail::convert_scalar(f, DType::kF32, f, DType::kBF16, 8), InvalidArgument);
  try {
    convert(f, DType::kF32, f, DType::kF16, 8);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
  }
}

TEST(DTypeTest, NamesParseBack) {
  for (DType t : kAll) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(parse_dtype("float32"), DType::kF32);
  EXPECT_EQ(parse_dtype("FP16"), DType::kF16);
  EXPECT_EQ(parse_dtype("half"), DType::kF16);
  EXPECT_EQ(parse_dtype("BFloat16"), DType::kBF16);
  EXPECT_STREQ(dtype_name(static_cast<DType>(9)), "invalid");
  for (const char* bad : {"", "f64", "bf", "f16 ", "int8"}) {
    try {
      parse_dtype(bad);
      ADD_FAILURE() << "parse_dtype(\"" << bad << "\") did not throw";
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
      for (const char* name : {"f32", "f16", "bf16"}) {
        EXPECT_NE(msg.find(name), std::string::npos) << msg;
      }
    }
  }
}

TEST(DTypeTest, IsaMatchesCpu) {
  EXPECT_STREQ(convert_isa(), detail::cpu_has_avx2_f16c() ? "avx2+f16c" : "scalar");
}

// ---- vector path == scalar path, bit for bit ------------------------------------------------

#ifdef MEMFIT_TEST_X86

#define REQUIRE_AVX2()                                                                 \
  if (!detail::cpu_has_avx2_f16c())                                                    \
  GTEST_SKIP() << "this CPU lacks AVX2/F16C: convert() uses the scalar path only, so " \
                  "there is no vector path to compare"

// Both paths over the same bytes; returns the number of differing elements (first few shown).
std::size_t compare_paths(const unsigned char* src, DType st, DType dt, std::size_t n,
                          std::size_t dst_offset = 0) {
  const std::size_t ds = dtype_size(dt);
  std::vector<unsigned char> a(n * ds + dst_offset + 64, 0x5A), b(a);
  detail::convert_scalar(src, st, a.data() + dst_offset, dt, n);
  detail::convert_avx2(src, st, b.data() + dst_offset, dt, n);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(a.data() + dst_offset + i * ds, b.data() + dst_offset + i * ds, ds) != 0 &&
        ++bad <= 5) {
      u32 x = 0, y = 0, s = 0;
      std::memcpy(&x, a.data() + dst_offset + i * ds, ds);
      std::memcpy(&y, b.data() + dst_offset + i * ds, ds);
      std::memcpy(&s, src + i * dtype_size(st), dtype_size(st));
      ADD_FAILURE() << dtype_name(st) << "->" << dtype_name(dt) << " src 0x" << std::hex << s
                    << ": scalar 0x" << x << ", avx2 0x" << y;
    }
  }
  // Nothing written outside [dst, dst + n).
  for (std::size_t k = 0; k < a.size(); ++k) {
    if (k >= dst_offset && k < dst_offset + n * ds) continue;
    if (a[k] != 0x5A || b[k] != 0x5A) {
      ADD_FAILURE() << "byte " << k << " outside the destination written (n=" << n << ")";
      return bad + 1;
    }
  }
  return bad;
}

TEST(DTypeAvx2Test, AllSixteenBitPatternsMatchScalar) {
  REQUIRE_AVX2();
  std::vector<u16> all(0x10000);
  for (u32 p = 0; p < 0x10000; ++p) all[p] = static_cast<u16>(p);
  const auto* src = reinterpret_cast<const unsigned char*>(all.data());
  for (DType st : {DType::kF16, DType::kBF16}) {
    for (DType dt : kAll) EXPECT_EQ(compare_paths(src, st, dt, all.size()), 0u);
  }
}

TEST(DTypeAvx2Test, F32InputsMatchScalar) {
  REQUIRE_AVX2();
  for (const std::vector<float>& in : {special_f32_inputs(), random_f32_inputs(kRandomInputs, 3)}) {
    const auto* src = reinterpret_cast<const unsigned char*>(in.data());
    for (DType dt : kAll) EXPECT_EQ(compare_paths(src, DType::kF32, dt, in.size()), 0u);
  }
}

TEST(DTypeAvx2Test, TailsAndUnalignedPointersMatchScalar) {
  REQUIRE_AVX2();
  for (DType st : kAll) {
    const std::vector<unsigned char> bytes = source_bytes(st, 67 + 4, 11);
    for (DType dt : kAll) {
      for (std::size_t n = 0; n <= 67; ++n) {
        for (std::size_t off = 0; off < 4; ++off) {  // byte offsets: any alignment
          ASSERT_EQ(compare_paths(bytes.data() + off, st, dt, n, (off * 3) % 5), 0u)
              << dtype_name(st) << "->" << dtype_name(dt) << " n=" << n << " off=" << off;
        }
      }
    }
  }
}

// The rounding is fixed by the code, not by MXCSR: round-toward-zero with FTZ and DAZ set
// must change nothing on either path.
TEST(DTypeAvx2Test, IgnoresMxcsrModes) {
  REQUIRE_AVX2();
  std::vector<float> in = special_f32_inputs();
  std::vector<u16> all(0x10000);
  for (u32 p = 0; p < 0x10000; ++p) all[p] = static_cast<u16>(p);
  auto run = [&](auto fn) {
    std::vector<u16> h(in.size()), b(in.size());
    std::vector<float> wf(all.size()), wb(all.size());
    fn(in.data(), DType::kF32, h.data(), DType::kF16, in.size());
    fn(in.data(), DType::kF32, b.data(), DType::kBF16, in.size());
    fn(all.data(), DType::kF16, wf.data(), DType::kF32, all.size());
    fn(all.data(), DType::kBF16, wb.data(), DType::kF32, all.size());
    std::vector<u32> out;
    for (u16 x : h) out.push_back(x);
    for (u16 x : b) out.push_back(x);
    for (float x : wf) out.push_back(bits(x));
    for (float x : wb) out.push_back(bits(x));
    return out;
  };
  const std::vector<u32> plain = run(detail::convert_scalar);
  const unsigned csr = _mm_getcsr();
  _mm_setcsr((csr & ~0x6000u) | 0x6000u /* RZ */ | 0x8000u /* FTZ */ | 0x0040u /* DAZ */);
  const std::vector<u32> scalar_rz = run(detail::convert_scalar);
  const std::vector<u32> avx_rz = run(detail::convert_avx2);
  _mm_setcsr(csr);
  EXPECT_TRUE(plain == scalar_rz);
  EXPECT_TRUE(plain == avx_rz);
}

#endif  // MEMFIT_TEST_X86

}  // namespace
}  // namespace memfit
