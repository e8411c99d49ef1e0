// The CPU backend's tiled causal attention (FlashAttention-2, Dao 2023), written once and
// compiled three times: flash_attention_generic.cpp (the build's baseline ISA),
// flash_attention_avx2_target.cpp (AVX2 + FMA) and flash_attention_avx512_target.cpp
// (AVX-512), each including this file inside its own namespace (MEMFIT_FLASH_NS).
// flash_attention.cpp picks one at run time. The ISA files are compiled with the baseline
// flags; only the code below the includes gets the wider ISA (a `#pragma GCC target` chosen by
// MEMFIT_FLASH_ISA_AVX2 / _AVX512), and all of it is internal to its file, so no inline function
// the library shares (std::, widen, ...) is ever emitted with instructions the CPU may lack.
// Internal to libmemfit; the contract is Backend::flash_attention_forward/backward
// (core/backend.h).
//
// Algorithm. Tiles of kTile = 64 queries against tiles of 64 keys. Per query row the forward
// keeps a running max m and sum l: for each key tile, s = scale * q.k, m' = max(m, max s),
// p = exp(s - m'), l = l * exp(m - m') + sum p, o = o * exp(m - m') + p @ v; at the end
// out = o / l and lse = m + log l. The backward recomputes p = exp(s - lse) per tile and forms
// dp = do @ v^T, ds = scale * p * (dp - delta), dv += p^T @ do, dq += ds @ k, dk += ds^T @ q.
// Only diagonal tiles are masked (-inf above the diagonal); tiles above it are skipped.
//
// Work and memory. The forward runs one task per (batch, query head); the backward one per
// (batch, kv head), which owns the dk and dv of that head and loops over its group's query
// heads, so no two threads ever add into the same element. OpenMP spreads the tasks;
// each task's arithmetic is in a fixed order, so the bits do not depend on the thread count.
// Scratch is heap memory outside any budget, per thread of min(tasks, OpenMP threads): f32
// copies of one kv head's k and v (forward: 2 * Tp * hsp floats; backward: k twice, v, dk and
// dv, 5 * Tp * hsp), where Tp is T rounded up to the tile and hsp the head size rounded up to
// 16, plus a few 64-row tiles: O(T * hs) per thread, never O(T^2). (GPT-2's hs = 64 at
// T = 4096: 2 MiB forward, 5 MiB backward per thread.) It is allocated before the parallel
// region, so a failure is std::bad_alloc to the caller.
//
// Arithmetic. FP32 on widened inputs, in GCC vector extensions of 16 floats (the compiler
// maps them onto the file's ISA: one ZMM, two YMM or four XMM registers). exp() of the
// probabilities is a Cephes-style polynomial (relative error ~2 ulp; inputs below -87.3 give
// 0); the per-row rescales use std::exp. The builds with FMA contract a * b + c, so the three
// variants differ in the last bits; each is deterministic.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <vector>

#include "core/backend.h"
#include "core/cpu/nn_util.h"

// 64-byte vectors in a build without AVX-512 change the ABI of functions passing them by value
// (-Wpsabi); every such function here is internal to its translation unit.
#pragma GCC diagnostic ignored "-Wpsabi"

#if defined(MEMFIT_FLASH_ISA_AVX512)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#elif defined(MEMFIT_FLASH_ISA_AVX2)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace memfit::cpu::MEMFIT_FLASH_NS {
namespace {

using i64 = std::int64_t;

// v16, load/store/splat, vexp, hsum, hmax: 16-float lanes in this file's ISA.
#include "core/cpu/vmath.h"

constexpr int kTile = 64;  // query rows and key columns of a tile
constexpr int kVecs = kTile / kLanes;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// c (64 x 64) = a (64 x hsp, row-major) @ bt (hsp x 64, row-major): the scores of a query
// tile against a key tile stored transposed (or do against v, in the backward).
void tile_scores(const float* a, const float* bt, i64 hsp, float* c) {
  for (int r0 = 0; r0 < kTile; r0 += 4) {
    v16 acc[4][kVecs] = {};
    for (i64 d = 0; d < hsp; ++d) {
      v16 b[kVecs];
      for (int k = 0; k < kVecs; ++k) b[k] = load(bt + d * kTile + k * kLanes);
      for (int rr = 0; rr < 4; ++rr) {
        const v16 x = splat(a[(r0 + rr) * hsp + d]);
        for (int k = 0; k < kVecs; ++k) acc[rr][k] += x * b[k];
      }
    }
    for (int rr = 0; rr < 4; ++rr) {
      for (int k = 0; k < kVecs; ++k) store(c + (r0 + rr) * kTile + k * kLanes, acc[rr][k]);
    }
  }
}

// c (64 x hsp) += a (64 x 64) @ b (64 x hsp), NC vectors of c's columns from column d0.
template <int NC>
void tile_accumulate_cols(float* c, const float* a, const float* b, i64 hsp, i64 d0) {
  for (int r0 = 0; r0 < kTile; r0 += 4) {
    v16 acc[4][NC];
    for (int rr = 0; rr < 4; ++rr) {
      for (int j = 0; j < NC; ++j) acc[rr][j] = load(c + (r0 + rr) * hsp + d0 + j * kLanes);
    }
    for (int k = 0; k < kTile; ++k) {
      v16 bv[NC];
      for (int j = 0; j < NC; ++j) bv[j] = load(b + k * hsp + d0 + j * kLanes);
      for (int rr = 0; rr < 4; ++rr) {
        const v16 x = splat(a[(r0 + rr) * kTile + k]);
        for (int j = 0; j < NC; ++j) acc[rr][j] += x * bv[j];
      }
    }
    for (int rr = 0; rr < 4; ++rr) {
      for (int j = 0; j < NC; ++j) store(c + (r0 + rr) * hsp + d0 + j * kLanes, acc[rr][j]);
    }
  }
}

// c (64 x hsp) += a (64 x 64) @ b (64 x hsp).
void tile_accumulate(float* c, const float* a, const float* b, i64 hsp) {
  i64 d0 = 0;
  for (; d0 + 4 * kLanes <= hsp; d0 += 4 * kLanes) tile_accumulate_cols<4>(c, a, b, hsp, d0);
  switch ((hsp - d0) / kLanes) {
    case 3:
      tile_accumulate_cols<3>(c, a, b, hsp, d0);
      break;
    case 2:
      tile_accumulate_cols<2>(c, a, b, hsp, d0);
      break;
    case 1:
      tile_accumulate_cols<1>(c, a, b, hsp, d0);
      break;
    default:
      break;
  }
}

void transpose_tile(const float* a, float* at) {
  for (int r = 0; r < kTile; ++r) {
    for (int c = 0; c < kTile; ++c) at[c * kTile + r] = a[r * kTile + c];
  }
}

// -inf above the diagonal of a diagonal tile (column > row), which also covers the key
// columns past T in the last tile.
void mask_diagonal(float* s) {
  for (int r = 0; r < kTile; ++r) std::fill(s + r * kTile + r + 1, s + (r + 1) * kTile, kNegInf);
}

struct Layout {
  i64 b, t, heads, kv_heads, hs, hsp, row, tiles;
  explicit Layout(const AttentionDims& d)
      : b(d.b),
        t(d.t),
        heads(d.heads),
        kv_heads(d.kv_heads),
        hs(d.hs),
        hsp((d.hs + kLanes - 1) / kLanes * kLanes),
        row(d.row()),
        tiles((d.t + kTile - 1) / kTile) {}
  i64 tp() const { return tiles * kTile; }
  // Element offsets into qkv (and dqkv) of token t's q head h, k head g, v head g.
  i64 q_at(i64 bi, i64 ti, i64 h) const { return (bi * t + ti) * row + h * hs; }
  i64 k_at(i64 bi, i64 ti, i64 g) const { return (bi * t + ti) * row + (heads + g) * hs; }
  i64 v_at(i64 bi, i64 ti, i64 g) const {
    return (bi * t + ti) * row + (heads + kv_heads + g) * hs;
  }
  i64 out_at(i64 bi, i64 ti, i64 h) const { return ((bi * t + ti) * heads + h) * hs; }
  i64 stat_at(i64 bi, i64 h, i64 ti) const { return (bi * heads + h) * t + ti; }
};

// dst (rows x hsp) = rows of `src` from element offsets at(r), zero beyond hs and beyond n.
template <typename At>
void widen_rows(const Tensor& src, i64 n, i64 hs, i64 hsp, i64 rows, At at, float* dst) {
  std::fill(dst, dst + rows * hsp, 0.0f);
  for (i64 r = 0; r < n; ++r) widen(src, at(r), hs, dst + r * hsp);
}

// One kv head's keys as tiles stored transposed: kt[j] is (hsp x 64) with kt[j][d][c] = k of
// token j*64 + c; zero past T and past hs. `row` is an hsp-float buffer.
template <typename At>
void widen_transposed(const Tensor& src, const Layout& L, At at, float* kt, float* row) {
  std::fill(kt, kt + L.tp() * L.hsp, 0.0f);
  for (i64 ti = 0; ti < L.t; ++ti) {
    widen(src, at(ti), L.hs, row);
    float* tile = kt + (ti / kTile) * L.hsp * kTile + ti % kTile;
    for (i64 d = 0; d < L.hs; ++d) tile[d * kTile] = row[d];
  }
}

// Threads for `tasks` independent tasks over all B*H heads: small calls (work ~ B*H*T^2*hs
// below 2^20) stay on one thread, as the other ops do; never more threads than tasks.
int team_for(i64 tasks, const Layout& L) {
  const i64 work = L.b * L.heads * L.t * std::min<i64>(L.t, 1 << 16) * L.hs;
  if (work < kNnParallelMin * 16) return 1;
  return static_cast<int>(std::min<i64>(tasks, omp_get_max_threads()));
}

// A run of floats inside a thread's scratch.
struct Span {
  float* p;
  std::size_t n;
  float* data() const { return p; }
  float* begin() const { return p; }
  float* end() const { return p + n; }
  std::size_t size() const { return n; }
};

// Every thread's scratch, allocated before the parallel region (so running out of host memory
// throws std::bad_alloc to the caller instead of ending the process inside OpenMP) and carved
// into spans of the given sizes.
class Scratch {
 public:
  Scratch(int team, std::initializer_list<std::size_t> sizes) : sizes_(sizes) {
    for (std::size_t n : sizes_) per_ += n;
    buf_.resize(per_ * static_cast<std::size_t>(team));
  }
  Span span(int thread, std::size_t k) {
    float* p = buf_.data() + per_ * static_cast<std::size_t>(thread);
    for (std::size_t i = 0; i < k; ++i) p += sizes_[i];
    return {p, sizes_[k]};
  }

 private:
  std::vector<std::size_t> sizes_;
  std::size_t per_ = 0;
  std::vector<float> buf_;
};

}  // namespace

void flash_forward(const Tensor& qkv, const AttentionDims& dims, const Tensor& out,
                   const Tensor& lse) {
  const Layout L(dims);
  const i64 tasks = L.b * L.heads, group = dims.group(), tp = L.tp(), hsp = L.hsp;
  const float scale = 1.0f / std::sqrt(static_cast<float>(L.hs));
  const int team = team_for(tasks, L);
  float* lse_f = f32(lse);
  const std::size_t head = static_cast<std::size_t>(tp * hsp), tile = kTile * hsp;
  Scratch scratch(team, {head, head, static_cast<std::size_t>(hsp), tile, tile, kTile * kTile});
#pragma omp parallel num_threads(team)
  {
    const int me = omp_get_thread_num();
    const Span kt = scratch.span(me, 0), vf = scratch.span(me, 1), row = scratch.span(me, 2),
               qf = scratch.span(me, 3), o = scratch.span(me, 4), s = scratch.span(me, 5);
    float m[kTile], l[kTile];
    i64 widened = -1;  // the (batch, kv head) whose k and v kt and vf hold
#pragma omp for schedule(dynamic, 1)
    for (i64 task = 0; task < tasks; ++task) {
      const i64 bi = task / L.heads, h = task % L.heads, g = h / group;
      if (widened != bi * L.kv_heads + g) {
        widened = bi * L.kv_heads + g;
        widen_transposed(
            qkv, L, [&](i64 ti) { return L.k_at(bi, ti, g); }, kt.data(), row.data());
        widen_rows(
            qkv, L.t, L.hs, hsp, tp, [&](i64 ti) { return L.v_at(bi, ti, g); }, vf.data());
      }
      for (i64 i = 0; i < L.tiles; ++i) {
        const i64 t0 = i * kTile, n = std::min<i64>(kTile, L.t - t0);
        widen_rows(
            qkv, n, L.hs, hsp, kTile, [&](i64 r) { return L.q_at(bi, t0 + r, h); }, qf.data());
        std::fill(o.begin(), o.end(), 0.0f);
        std::fill(m, m + kTile, kNegInf);
        std::fill(l, l + kTile, 0.0f);
        for (i64 j = 0; j <= i; ++j) {
          tile_scores(qf.data(), kt.data() + j * hsp * kTile, hsp, s.data());
          for (float& x : s) x *= scale;
          if (j == i) mask_diagonal(s.data());
          for (int r = 0; r < kTile; ++r) {
            float* sr = s.data() + r * kTile;
            v16 mx = load(sr);
            for (int k = 1; k < kVecs; ++k) {
              const v16 x = load(sr + k * kLanes);
              mx = x > mx ? x : mx;
            }
            const float m_new = std::max(m[r], hmax(mx));
            const float corr = std::exp(m[r] - m_new);  // 0 on the first tile (m = -inf)
            v16 sum{};
            for (int k = 0; k < kVecs; ++k) {
              const v16 p = vexp(load(sr + k * kLanes) - m_new);
              store(sr + k * kLanes, p);
              sum += p;
            }
            l[r] = l[r] * corr + hsum(sum);
            m[r] = m_new;
            if (corr != 1.0f) {
              float* orow = o.data() + r * hsp;
              for (i64 d = 0; d < hsp; d += kLanes) store(orow + d, load(orow + d) * corr);
            }
          }
          tile_accumulate(o.data(), s.data(), vf.data() + j * kTile * hsp, hsp);
        }
        for (i64 r = 0; r < n; ++r) {
          float* orow = o.data() + r * hsp;
          const float inv = 1.0f / l[r];
          for (i64 d = 0; d < L.hs; ++d) orow[d] *= inv;
          narrow(orow, out, L.out_at(bi, t0 + r, h), L.hs);
          lse_f[L.stat_at(bi, h, t0 + r)] = m[r] + std::log(l[r]);
        }
      }
    }
  }
}

void flash_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                    const AttentionDims& dims, const Tensor& delta, const Tensor& dqkv) {
  const Layout L(dims);
  const i64 group = dims.group(), tp = L.tp(), hsp = L.hsp;
  const float scale = 1.0f / std::sqrt(static_cast<float>(L.hs));
  const float* lse_f = f32(lse);
  float* delta_f = f32(delta);
  // delta[b,h,t] = dout . out over the head's hs columns (FP32, in column order).
  const i64 stat_rows = L.b * L.heads * L.t;
#pragma omp parallel if (stat_rows * L.hs >= kNnParallelMin)
  {
    std::vector<float> a(static_cast<std::size_t>(L.hs)), c(a.size());
#pragma omp for schedule(static)
    for (i64 sr = 0; sr < stat_rows; ++sr) {
      const i64 ti = sr % L.t, h = sr / L.t % L.heads, bi = sr / (L.t * L.heads);
      widen(dout, L.out_at(bi, ti, h), L.hs, a.data());
      widen(out, L.out_at(bi, ti, h), L.hs, c.data());
      float acc = 0.0f;
      for (i64 d = 0; d < L.hs; ++d)
        acc += a[static_cast<std::size_t>(d)] * c[static_cast<std::size_t>(d)];
      delta_f[sr] = acc;
    }
  }
  const i64 tasks = L.b * L.kv_heads;
  const int team = team_for(tasks, L);
  const std::size_t head = static_cast<std::size_t>(tp * hsp), tile = kTile * hsp;
  const std::size_t sq = kTile * kTile;
  Scratch scratch(team, {head, head, head, head, head, static_cast<std::size_t>(hsp), tile, tile,
                         tile, sq, sq, sq});
#pragma omp parallel num_threads(team)
  {
    const int me = omp_get_thread_num();
    const Span kt = scratch.span(me, 0), vt = scratch.span(me, 1), kf = scratch.span(me, 2),
               dk = scratch.span(me, 3), dv = scratch.span(me, 4), row = scratch.span(me, 5),
               qf = scratch.span(me, 6), dof = scratch.span(me, 7), dq = scratch.span(me, 8),
               p = scratch.span(me, 9), dp = scratch.span(me, 10), pt = scratch.span(me, 11);
    float lse_r[kTile], delta_r[kTile];
#pragma omp for schedule(dynamic, 1)
    for (i64 task = 0; task < tasks; ++task) {
      const i64 bi = task / L.kv_heads, g = task % L.kv_heads;
      auto k_at = [&](i64 ti) { return L.k_at(bi, ti, g); };
      widen_transposed(qkv, L, k_at, kt.data(), row.data());
      widen_transposed(
          qkv, L, [&](i64 ti) { return L.v_at(bi, ti, g); }, vt.data(), row.data());
      widen_rows(qkv, L.t, L.hs, hsp, tp, k_at, kf.data());
      std::fill(dk.begin(), dk.end(), 0.0f);
      std::fill(dv.begin(), dv.end(), 0.0f);
      for (i64 h = g * group; h < (g + 1) * group; ++h) {
        for (i64 i = 0; i < L.tiles; ++i) {
          const i64 t0 = i * kTile, n = std::min<i64>(kTile, L.t - t0);
          widen_rows(
              qkv, n, L.hs, hsp, kTile, [&](i64 r) { return L.q_at(bi, t0 + r, h); }, qf.data());
          widen_rows(
              dout, n, L.hs, hsp, kTile, [&](i64 r) { return L.out_at(bi, t0 + r, h); },
              dof.data());
          for (i64 r = 0; r < kTile; ++r) {
            lse_r[r] = r < n ? lse_f[L.stat_at(bi, h, t0 + r)] : 0.0f;
            delta_r[r] = r < n ? delta_f[L.stat_at(bi, h, t0 + r)] : 0.0f;
          }
          std::fill(dq.begin(), dq.end(), 0.0f);
          for (i64 j = 0; j <= i; ++j) {
            tile_scores(qf.data(), kt.data() + j * hsp * kTile, hsp, p.data());
            for (float& x : p) x *= scale;
            if (j == i) mask_diagonal(p.data());
            tile_scores(dof.data(), vt.data() + j * hsp * kTile, hsp, dp.data());
            for (int r = 0; r < kTile; ++r) {
              float* pr = p.data() + r * kTile;
              float* dpr = dp.data() + r * kTile;
              if (r >= n) {  // rows past T contribute nothing
                std::fill(pr, pr + kTile, 0.0f);
                std::fill(dpr, dpr + kTile, 0.0f);
                continue;
              }
              for (int k = 0; k < kVecs; ++k) {
                const v16 pv = vexp(load(pr + k * kLanes) - lse_r[r]);
                store(pr + k * kLanes, pv);
                // dp becomes ds = scale * p * (dp - delta)
                store(dpr + k * kLanes, pv * (load(dpr + k * kLanes) - delta_r[r]) * scale);
              }
            }
            float* dv_j = dv.data() + j * kTile * hsp;
            float* dk_j = dk.data() + j * kTile * hsp;
            transpose_tile(p.data(), pt.data());
            tile_accumulate(dv_j, pt.data(), dof.data(), hsp);  // dv += p^T @ do
            tile_accumulate(dq.data(), dp.data(), kf.data() + j * kTile * hsp, hsp);  // ds @ k
            transpose_tile(dp.data(), pt.data());
            tile_accumulate(dk_j, pt.data(), qf.data(), hsp);  // dk += ds^T @ q
          }
          for (i64 r = 0; r < n; ++r)
            narrow(dq.data() + r * hsp, dqkv, L.q_at(bi, t0 + r, h), L.hs);
        }
      }
      for (i64 ti = 0; ti < L.t; ++ti) {
        narrow(dk.data() + ti * hsp, dqkv, L.k_at(bi, ti, g), L.hs);
        narrow(dv.data() + ti * hsp, dqkv, L.v_at(bi, ti, g), L.hs);
      }
    }
  }
}

}  // namespace memfit::cpu::MEMFIT_FLASH_NS

#if defined(MEMFIT_FLASH_ISA_AVX512) || defined(MEMFIT_FLASH_ISA_AVX2)
#pragma GCC pop_options
#endif
