// Helpers for the layer tests: CPU and meta environments, host reads and writes of device
// tensors (CPU only), double-precision references of every built-in layer, and the generic
// checks each layer runs (gradients by central differences, memory against cost(), low
// precision, recomputation, the meta backend).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/layer.h"
#include "core/layers/layer_util.h"
#include "core/meta/meta_backend.h"
#include "memory/caching_allocator.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"
#include "tests/core/nn_testutil.h"

namespace memfit::testing {

using Vec = std::vector<double>;
using Params = std::vector<Vec>;  // in a layer's parameters() order

struct CpuEnv {
  explicit CpuEnv(DType dt = DType::kF32)
      : alloc(host, {}, &be.stream_sync()), ctx{be, alloc, kDefaultStream, dt} {}
  HostProvider host;
  CpuBackend be;
  CachingAllocator alloc;
  LayerContext ctx;
};

struct MetaEnv {
  explicit MetaEnv(DType dt = DType::kF32)
      : alloc(null, {}, &be.stream_sync()), ctx{be, alloc, kDefaultStream, dt} {}
  NullProvider null;
  MetaBackend be;
  CachingAllocator alloc;
  LayerContext ctx;
};

// ---- host access (CPU tensors only) -----------------------------------------------------------
Vec read(const Tensor& t);
void write(const Tensor& t, const Vec& v);  // rounded to t's dtype
std::vector<unsigned char> bits(const Tensor& t);
Act make_input(LayerContext& ctx, Shape s, const Vec& v);  // kActivation, tag "input"
Vec rand_vec(std::size_t n, std::mt19937& rng, double lo = -1.0, double hi = 1.0);
// Random values for each parameter by its init kind: kOnes -> 1 + U(-.5,.5), else U(-.5,.5).
Params rand_params(const std::vector<Parameter*>& ps, std::mt19937& rng);
// Writes weight (rounded) and master (f32) of each parameter.
void set_params(const std::vector<Parameter*>& ps, const Params& v);
// The values as stored in the working copies (rounded to the compute dtype).
Params stored_params(const std::vector<Parameter*>& ps);
void zero_grads(LayerContext& ctx, const std::vector<Parameter*>& ps);
// Frees a layer's parameters and saved state (before the environment that allocated them goes:
// blocks must not outlive their allocator), so the layer can be allocated again elsewhere.
struct FreeOnExit {
  Layer& layer;
  ~FreeOnExit();
};
std::int64_t live_bytes(const CachingAllocator& a);  // allocated_bytes.all.current
std::int64_t peak_bytes(const CachingAllocator& a);

// ---- double-precision references -------------------------------------------------------------
// Rows of width `in` -> rows of width `out`; p: W (out,in) [, b (out)].
Vec ref_linear(const Vec& x, std::int64_t in, std::int64_t out, const Vec& w, const Vec* b);
Vec ref_layernorm(const Vec& x, std::int64_t c, const Vec& w, const Vec& b, double eps);
Vec ref_gelu(const Vec& x);
// x (B,T,C); p: qkv.w, qkv.b, proj.w, proj.b.
Vec ref_attention(const Vec& x, std::int64_t b, std::int64_t t, std::int64_t c, std::int64_t heads,
                  const Params& p, std::size_t off = 0);
// p: fc.w, fc.b, proj.w, proj.b.
Vec ref_mlp(const Vec& x, std::int64_t c, std::int64_t f, const Params& p, std::size_t off = 0);
Vec ref_transformer_block(const Vec& x, std::int64_t b, std::int64_t t, std::int64_t c,
                          std::int64_t heads, std::int64_t f, const Params& p, double eps);
Vec ref_mlp_block(const Vec& x, std::int64_t c, std::int64_t f, const Params& p, double eps);
Vec add(const Vec& a, const Vec& b);

// ---- generic checks
// ------------------------------------------------------------------------------ y = ref(x, params)
// in double for a layer's forward.
using RefFn = std::function<Vec(const Vec& x, const Params& p)>;

// On CPU in f32: forward against ref; backward (dy random) against central differences of
// <dy, ref(x, p)> with respect to x and every parameter element.
void check_gradients(Layer& layer, Shape in_shape, const RefFn& ref, std::uint32_t seed);

// On CPU in dt (f16/bf16): forward and dx against the double reference evaluated on the same
// rounded inputs and parameters, within k * eps(dt) * (rms(ref) + |ref_i|).
void check_low_precision(const std::function<std::unique_ptr<Layer>()>& make, DType dt,
                         Shape in_shape, const RefFn& ref, double k, std::uint32_t seed);

// Recomputed forwards give the same bits (save true or false); two forward+backward passes
// give the same dx and parameter-gradient bits.
void check_recompute(Layer& layer, Shape in_shape, std::uint32_t seed);

// The contract's bookkeeping on any backend: has_saved, a second forward while saved is a
// CheckFailure, release_saved frees everything, backward returns to the baseline.
void check_saved_state(Layer& layer, LayerContext& ctx, Shape in_shape);

// Memory against cost(): on the meta backend at batch b (sizes chosen so every tensor is a
// whole number of 512-byte granules, so the comparison is exact), in dt. Checks saved bytes,
// output bytes, the forward and backward peaks (PeakExcess), save == false leaving only the
// output, tags and categories in the snapshot, and the GEMM flops the meta backend counted.
struct MemoryExpect {
  LayerCost cost;
  PeakExcess peaks;
};
void check_memory(Layer& layer, MetaEnv& env, Shape in_shape, std::int64_t seq_len,
                  const MemoryExpect& e);

template <class L>
void check_memory_of(L& layer, DType dt, Shape in_shape) {
  MetaEnv env(dt);
  layer.allocate({env.alloc, dt, Device::kMeta, kDefaultStream});
  FreeOnExit free_params{layer};
  const std::int64_t t = in_shape[1];
  MemoryExpect e{layer.cost(t, dt), layer.peaks(t, dt)};
  check_memory(layer, env, in_shape, t, e);
}

}  // namespace memfit::testing
