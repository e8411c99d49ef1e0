#include "core/dtype.h"

#include <cctype>
#include <cstring>
#include <string>

#include "memory/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define MEMFIT_DTYPE_X86 1
#endif

namespace memfit {

namespace {

constexpr std::size_t kDTypeCount = 3;
constexpr const char* kNames[kDTypeCount] = {"f32", "f16", "bf16"};

// Aliases users type (PyTorch's and numpy's spellings); matched case-insensitively.
struct Alias {
  const char* name;
  DType type;
};
constexpr Alias kAliases[] = {
    {"f32", DType::kF32},       {"float32", DType::kF32}, {"fp32", DType::kF32},
    {"float", DType::kF32},     {"f16", DType::kF16},     {"float16", DType::kF16},
    {"fp16", DType::kF16},      {"half", DType::kF16},    {"bf16", DType::kBF16},
    {"bfloat16", DType::kBF16},
};

bool valid_dtype(DType t) { return static_cast<std::size_t>(t) < kDTypeCount; }

bool iequals(std::string_view a, const char* b) {
  const std::size_t n = std::strlen(b);
  if (a.size() != n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != b[i]) return false;
  }
  return true;
}

std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_f32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// m >> s rounded to nearest, ties to even; 1 <= s <= 31.
std::uint32_t shift_rne(std::uint32_t m, unsigned s) {
  const std::uint32_t r = m >> s;
  const std::uint32_t rem = m & ((std::uint32_t{1} << s) - 1);
  const std::uint32_t half = std::uint32_t{1} << (s - 1);
  return r + ((rem > half || (rem == half && (r & 1))) ? 1 : 0);
}

// The element conversions, in integer arithmetic only, so the MXCSR rounding and DAZ/FTZ
// modes a caller may have set cannot change the result. They have internal linkage so the
// loops below inline them: calls to a shared library's exported functions are not inlined
// (they may be interposed), which made the scalar loops several times slower.
inline float f16_to_f32_impl(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) {
    // Inf, or NaN: quiet bit set, payload moved to the top of the f32 mantissa (what the
    // F16C instruction does, so both paths agree).
    return bits_f32(sign | 0x7F800000u | (mant ? (0x400000u | (mant << 13)) : 0u));
  }
  if (exp != 0) return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_f32(sign);
  // Denormal: mant * 2^-24. Normalize so the leading one sits at bit 10.
  std::uint32_t e = 113;  // the f32 exponent of 2^-14, the f16 denormal scale
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return bits_f32(sign | (e << 23) | ((mant & 0x3FFu) << 13));
}

inline std::uint16_t f32_to_f16_impl(float f) {
  const std::uint32_t x = f32_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {
    // NaN: quiet, sign kept, top 9 payload bits kept (F16C's rule).
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  }
  // 65520 = 65504 + half an ulp: the tie rounds to the even neighbour, 2^16, i.e. infinity.
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  const std::uint32_t exp = a >> 23;
  const std::uint32_t mant = a & 0x7FFFFFu;
  if (exp >= 113) {
    // Normal f16 range (>= 2^-14). Adding 0xFFF plus the lowest kept bit carries out of the
    // 13 dropped bits exactly when rounding to nearest even goes up, and a carry into the
    // exponent is the right answer. Branch-free: on real data rounding up is a coin flip.
    const std::uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((r >> 13) - (112u << 10)));
  }
  // Denormal f16 (or zero): value / 2^-24 = m * 2^(exp - 126), rounded. Below 2^-25 (and
  // every f32 denormal) that is under half the smallest f16 denormal: zero.
  if (exp < 102) return static_cast<std::uint16_t>(sign);
  const std::uint32_t m = mant | 0x800000u;
  return static_cast<std::uint16_t>(sign | shift_rne(m, 126u - exp));
}

inline float bf16_to_f32_impl(std::uint16_t b) {
  return bits_f32(static_cast<std::uint32_t>(b) << 16);
}

inline std::uint16_t f32_to_bf16_impl(float f) {
  const std::uint32_t x = f32_bits(f);
  // Round to nearest even on the low 16 bits; a carry into the exponent is the right answer
  // (the largest finite values round up to infinity).
  const std::uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  // NaN: rounding could carry a payload into the sign, truncating could clear every payload
  // bit left (making infinity); keep the top bits and set the quiet bit.
  const std::uint32_t quiet = (x >> 16) | 0x40u;
  return static_cast<std::uint16_t>((x & 0x7FFFFFFFu) > 0x7F800000u ? quiet : rounded);
}

// The element loops of the scalar path.
template <typename S, typename D, typename F>
void convert_loop(const void* src, void* dst, std::size_t n, F f) {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  for (std::size_t i = 0; i < n; ++i) {
    S x;
    std::memcpy(&x, s + i * sizeof(S), sizeof(S));  // src/dst need only byte alignment
    const D y = f(x);
    std::memcpy(d + i * sizeof(D), &y, sizeof(D));
  }
}

using ConvertFn = void (*)(const void*, DType, void*, DType, std::size_t);

ConvertFn pick_convert() {
#ifdef MEMFIT_DTYPE_X86
  if (detail::cpu_has_avx2_f16c()) return &detail::convert_avx2;
#endif
  return &detail::convert_scalar;
}

// Decided once: the CPU does not change under a running process.
ConvertFn dispatched() {
  static const ConvertFn fn = pick_convert();
  return fn;
}

void check_convert_args(const void* src, DType st, void* dst, DType dt, std::size_t n) {
  if (!valid_dtype(st) || !valid_dtype(dt)) {
    throw InvalidArgument("convert: invalid dtype value " +
                          std::to_string(static_cast<int>(valid_dtype(st) ? dt : st)) +
                          "; valid: f32, f16, bf16");
  }
  if (n == 0) return;
  if (src == nullptr || dst == nullptr) {
    throw InvalidArgument(std::string("convert: null ") + (src ? "dst" : "src") +
                          " pointer with n = " + std::to_string(n) + " elements");
  }
  if (src == dst && st == dt) return;
  // Byte ranges; n * size cannot wrap for buffers that exist, but compare as integers so a
  // bogus n does not make this check itself undefined.
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  const std::uintptr_t s_end = s + n * dtype_size(st);
  const std::uintptr_t d_end = d + n * dtype_size(dt);
  if (s < d_end && d < s_end) {
    throw InvalidArgument(std::string("convert: src and dst overlap (") + dtype_name(st) + " -> " +
                          dtype_name(dt) + ", n = " + std::to_string(n) +
                          "); valid: disjoint buffers, or the same pointer with equal dtypes");
  }
}

}  // namespace

const char* dtype_name(DType t) {
  return valid_dtype(t) ? kNames[static_cast<std::size_t>(t)] : "invalid";
}

DType parse_dtype(std::string_view s) {
  for (const Alias& a : kAliases) {
    if (iequals(s, a.name)) return a.type;
  }
  std::string valid;
  for (const Alias& a : kAliases) {
    valid += (valid.empty() ? "" : ", ");
    valid += a.name;
  }
  throw InvalidArgument("unknown dtype '" + std::string(s) + "'; valid: " + valid);
}

float f16_to_f32(std::uint16_t h) { return f16_to_f32_impl(h); }
std::uint16_t f32_to_f16(float f) { return f32_to_f16_impl(f); }
float bf16_to_f32(std::uint16_t b) { return bf16_to_f32_impl(b); }
std::uint16_t f32_to_bf16(float f) { return f32_to_bf16_impl(f); }

void convert(const void* src, DType st, void* dst, DType dt, std::size_t n) {
  check_convert_args(src, st, dst, dt, n);
  if (n == 0 || (src == dst && st == dt)) return;
  dispatched()(src, st, dst, dt, n);
}

const char* convert_isa() {
#ifdef MEMFIT_DTYPE_X86
  if (dispatched() == &detail::convert_avx2) return "avx2+f16c";
#endif
  return "scalar";
}

namespace detail {

void convert_scalar(const void* src, DType st, void* dst, DType dt, std::size_t n) {
  check_convert_args(src, st, dst, dt, n);
  if (n == 0 || (src == dst && st == dt)) return;
  using u16 = std::uint16_t;
  if (st == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  // Lambdas, not function pointers, so each loop gets its element function inlined. Pairs of
  // 16-bit types go through f32, which holds both exactly: one rounding in total.
  switch (st) {
    case DType::kF32:
      if (dt == DType::kF16) {
        return convert_loop<float, u16>(src, dst, n, [](float f) { return f32_to_f16_impl(f); });
      }
      return convert_loop<float, u16>(src, dst, n, [](float f) { return f32_to_bf16_impl(f); });
    case DType::kF16:
      if (dt == DType::kF32) {
        return convert_loop<u16, float>(src, dst, n, [](u16 h) { return f16_to_f32_impl(h); });
      }
      return convert_loop<u16, u16>(src, dst, n,
                                    [](u16 h) { return f32_to_bf16_impl(f16_to_f32_impl(h)); });
    case DType::kBF16:
      if (dt == DType::kF32) {
        return convert_loop<u16, float>(src, dst, n, [](u16 b) { return bf16_to_f32_impl(b); });
      }
      return convert_loop<u16, u16>(src, dst, n,
                                    [](u16 b) { return f32_to_f16_impl(bf16_to_f32_impl(b)); });
  }
}

bool cpu_has_avx2_f16c() {
#ifdef MEMFIT_DTYPE_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29);
  if (!osxsave || !avx || !f16c) return false;
  // The OS must save the YMM registers on context switch (XCR0 bits 1 and 2).
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0x6u) != 0x6u) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (b & (1u << 5)) != 0;  // AVX2
#else
  return false;
#endif
}

}  // namespace detail

}  // namespace memfit
