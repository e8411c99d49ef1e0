// Element types and exact conversions between them.
//
//   DType t = parse_dtype("bf16");                    // throws InvalidArgument on a bad name
//   std::uint16_t h = f32_to_f16(1.5f);               // round to nearest even, exact
//   convert(src, DType::kF32, dst, DType::kBF16, n);  // vectorized where the CPU allows
//
// f16 is IEEE 754 binary16; bf16 is the top half of binary32. Conversions from f32 round to
// nearest, ties to even; overflow gives infinity (|x| >= 65520 for f16); NaN stays NaN (quiet,
// sign kept; bf16 keeps the top payload bits). Conversions to f32 are exact. convert() uses
// F16C/AVX2 when the CPU has them (checked once at run time) and a scalar path otherwise; both
// give identical bits for every input, independent of the MXCSR rounding/DAZ/FTZ modes.
//
// NaN bits, exactly (the F16C instructions' rule, which the scalar path follows):
//   f32 -> f16:  sign | 0x7E00 | (f32 mantissa >> 13)          quiet bit set, top payload kept
//   f16 -> f32:  sign | 0x7FC00000 | (f16 mantissa << 13)      quiet bit set, payload kept
//   f32 -> bf16: (f32 bits >> 16) | 0x0040                     quiet bit set, top payload kept
//   bf16 -> f32: bf16 bits << 16                               unchanged (a signaling NaN stays so)
// f16 <-> bf16 go through f32 (exact), so they round once and follow the rules above.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace memfit {

enum class DType : std::uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

inline constexpr std::size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }
const char* dtype_name(DType t);        // "f32", "f16", "bf16"
DType parse_dtype(std::string_view s);  // inverse of dtype_name (also "float32", "fp16", ...)

float f16_to_f32(std::uint16_t h);
std::uint16_t f32_to_f16(float f);
float bf16_to_f32(std::uint16_t b);
std::uint16_t f32_to_bf16(float f);

// Converts n elements from src (of type st) to dst (of type dt). src and dst must not
// overlap unless they are the same pointer with st == dt (then it is a no-op).
void convert(const void* src, DType st, void* dst, DType dt, std::size_t n);

// The instruction set convert() dispatches to on this machine: "avx2+f16c" or "scalar".
const char* convert_isa();

namespace detail {
// Entry points of each implementation, exposed for tests and benchmarks that compare them.
// convert_scalar checks its arguments as convert() does.
void convert_scalar(const void* src, DType st, void* dst, DType dt, std::size_t n);
bool cpu_has_avx2_f16c();
// Defined only when the build compiled the AVX2 file; call only if cpu_has_avx2_f16c(), with
// arguments convert() would accept (it does not check them again).
void convert_avx2(const void* src, DType st, void* dst, DType dt, std::size_t n);
}  // namespace detail

}  // namespace memfit
