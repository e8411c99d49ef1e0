// CPU elementwise ops: FP32 math over 4096-element chunks, widened from and rounded back to
// each tensor's dtype with memfit::convert; OpenMP across chunks once a tensor is large
// enough for threads to pay off.
#include "core/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace memfit {
namespace {

constexpr std::int64_t kChunk = 4096;             // 16 KiB of f32: stays in L1/L2
constexpr std::int64_t kParallelMin = 64 * 1024;  // below this a thread team costs more
constexpr std::int64_t kSumBlock = 64 * 1024;     // sumsq partial-sum granule

char* element(const Tensor& t, std::int64_t offset) {
  return static_cast<char*>(t.raw()) + static_cast<std::size_t>(offset) * dtype_size(t.dtype());
}

// Runs f(offset, count) over [0, n) in chunks; in parallel when n is large. f must not throw.
template <typename F>
void for_chunks(std::int64_t n, F&& f) {
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < chunks; ++i) {
    const std::int64_t off = i * kChunk;
    f(off, std::min(kChunk, n - off));
  }
}

// f32 pointer to `count` elements of t from `off`: t's memory when it is f32, else `buf`
// holding them widened. Writes through it reach t only after store().
float* load(const Tensor& t, std::int64_t off, std::int64_t count, float* buf) {
  if (t.dtype() == DType::kF32) return reinterpret_cast<float*>(element(t, off));
  convert(element(t, off), t.dtype(), buf, DType::kF32, static_cast<std::size_t>(count));
  return buf;
}

void store(const float* v, const Tensor& t, std::int64_t off, std::int64_t count) {
  if (t.dtype() == DType::kF32) return;  // v was t's own memory
  convert(v, DType::kF32, element(t, off), t.dtype(), static_cast<std::size_t>(count));
}

}  // namespace

void CpuBackend::do_fill(StreamId, const Tensor& x, float value) {
  if (x.dtype() == DType::kF32) {
    float* p = static_cast<float*>(x.raw());
    for_chunks(x.numel(),
               [&](std::int64_t off, std::int64_t n) { std::fill_n(p + off, n, value); });
    return;
  }
  std::uint16_t bits = 0;
  convert(&value, DType::kF32, &bits, x.dtype(), 1);
  std::uint16_t* p = static_cast<std::uint16_t*>(x.raw());
  for_chunks(x.numel(), [&](std::int64_t off, std::int64_t n) { std::fill_n(p + off, n, bits); });
}

void CpuBackend::do_copy(StreamId, const Tensor& src, const Tensor& dst) {
  if (src.nbytes() > 0) std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

void CpuBackend::do_cast(StreamId, const Tensor& src, const Tensor& dst) {
  for_chunks(src.numel(), [&](std::int64_t off, std::int64_t n) {
    convert(element(src, off), src.dtype(), element(dst, off), dst.dtype(),
            static_cast<std::size_t>(n));
  });
}

void CpuBackend::do_axpy(StreamId, float a, const Tensor& x, const Tensor& y) {
  for_chunks(x.numel(), [&](std::int64_t off, std::int64_t n) {
    float bx[kChunk];
    float by[kChunk];
    const float* xv = load(x, off, n, bx);
    float* yv = load(y, off, n, by);
    for (std::int64_t i = 0; i < n; ++i) yv[i] += a * xv[i];
    store(yv, y, off, n);
  });
}

void CpuBackend::do_scale(StreamId, float a, const Tensor& x) {
  for_chunks(x.numel(), [&](std::int64_t off, std::int64_t n) {
    float bx[kChunk];
    float* xv = load(x, off, n, bx);
    for (std::int64_t i = 0; i < n; ++i) xv[i] *= a;
    store(xv, x, off, n);
  });
}

void CpuBackend::do_sumsq(StreamId, const Tensor& x, const Tensor& out) {
  const std::int64_t n = x.numel();
  const std::int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  // One partial per fixed-size block, added in block order: the same bits for any number
  // of threads.
  std::vector<double> sums(static_cast<std::size_t>(blocks), 0.0);
  std::vector<std::int64_t> bad(static_cast<std::size_t>(blocks), 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    float buf[kChunk];
    double s = 0.0;
    std::int64_t nf = 0;
    const std::int64_t end = std::min(n, (blk + 1) * kSumBlock);
    for (std::int64_t off = blk * kSumBlock; off < end; off += kChunk) {
      const std::int64_t m = std::min(kChunk, end - off);
      const float* v = load(x, off, m, buf);
      for (std::int64_t i = 0; i < m; ++i) {
        const double d = v[i];
        if (std::isfinite(v[i])) {
          s += d * d;
        } else {
          ++nf;
        }
      }
    }
    sums[static_cast<std::size_t>(blk)] = s;
    bad[static_cast<std::size_t>(blk)] = nf;
  }
  double total = 0.0;
  std::int64_t nonfinite = 0;
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    total += sums[static_cast<std::size_t>(blk)];
    nonfinite += bad[static_cast<std::size_t>(blk)];
  }
  float* o = static_cast<float*>(out.raw());
  o[0] = static_cast<float>(static_cast<double>(o[0]) + total);
  o[1] = static_cast<float>(static_cast<double>(o[1]) + static_cast<double>(nonfinite));
}

}  // namespace memfit
