// oneDNN matmul behind find_dnnl_matmul (gemm_dnnl.h): descriptors, the shape cache, execution.
#include "core/cpu/gemm_dnnl.h"

#include <omp.h>

#include <bit>
#include <cstdint>
#include <functional>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <utility>

#include "memory/check.h"

namespace memfit {
namespace cpu {

struct DnnlMatmul::State {
  dnnl::matmul::primitive_desc pd;
  dnnl::memory::desc a, b, c, scratch;
  std::once_flag created;
  dnnl::matmul prim;  // created on the first run: JIT code that a dry run never needs
};

namespace {

using dt = dnnl::memory::data_type;

dt to_dnnl(DType t) {
  switch (t) {
    case DType::kF32:
      return dt::f32;
    case DType::kF16:
      return dt::f16;
    case DType::kBF16:
      return dt::bf16;
  }
  return dt::undef;
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One operand of logical shape (rows, cols) per batch entry, stored row-major as (rows, cols),
// or as (cols, rows) when `trans`; batch entries `stride` elements apart, or one matrix for
// every entry when `broadcast`.
dnnl::memory::desc matrix(DType t, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                          bool trans, std::int64_t stride, bool broadcast) {
  const std::int64_t row_stride = trans ? 1 : cols;
  const std::int64_t col_stride = trans ? rows : 1;
  if (batch == 1) return dnnl::memory::desc({rows, cols}, to_dnnl(t), {row_stride, col_stride});
  if (broadcast) {
    return dnnl::memory::desc({1, rows, cols}, to_dnnl(t), {rows * cols, row_stride, col_stride});
  }
  return dnnl::memory::desc({batch, rows, cols}, to_dnnl(t), {stride, row_stride, col_stride});
}

struct Key {
  std::int64_t m, n, k, batch, stride_a, stride_b, stride_c;
  std::uint32_t alpha, beta;  // bit patterns
  bool trans_a, trans_b;
  DType a, b, c;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::size_t h = 0;
    auto mix = [&h](std::uint64_t v) {
      h ^= std::hash<std::uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    for (std::int64_t v : {k.m, k.n, k.k, k.batch, k.stride_a, k.stride_b, k.stride_c}) {
      mix(static_cast<std::uint64_t>(v));
    }
    mix((std::uint64_t{k.alpha} << 32) | k.beta);
    mix((static_cast<std::uint64_t>(k.a) << 16) | (static_cast<std::uint64_t>(k.b) << 8) |
        static_cast<std::uint64_t>(k.c) | (std::uint64_t{k.trans_a} << 24) |
        (std::uint64_t{k.trans_b} << 25));
    return h;
  }
};

Key make_key(const GemmDesc& d, DType a, DType b, DType c) {
  // With one batch entry the strides mean nothing: one key for every stride.
  const bool one = d.batch == 1;
  // -0.0 and 0.0 are the same beta (no sum post-op); alpha keeps its bits.
  const float beta = d.beta == 0.0f ? 0.0f : d.beta;
  return Key{d.m,
             d.n,
             d.k,
             d.batch,
             one ? 0 : d.stride_a,
             one ? 0 : d.stride_b,
             one ? 0 : d.stride_c,
             std::bit_cast<std::uint32_t>(d.alpha),
             std::bit_cast<std::uint32_t>(beta),
             d.trans_a,
             d.trans_b,
             a,
             b,
             c};
}

// nullptr when oneDNN has no implementation (unsupported dtypes on this CPU).
std::shared_ptr<const DnnlMatmul> create(const GemmDesc& d, DType a, DType b, DType c) {
  auto s = std::make_unique<DnnlMatmul::State>();
  s->a = matrix(a, d.batch, d.m, d.k, d.trans_a, d.stride_a, d.batch > 1 && d.stride_a == 0);
  s->b = matrix(b, d.batch, d.k, d.n, d.trans_b, d.stride_b, d.batch > 1 && d.stride_b == 0);
  s->c = matrix(c, d.batch, d.m, d.n, false, d.stride_c, false);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (d.alpha != 1.0f) attr.set_output_scales(0, {d.alpha});
  if (d.beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(d.beta);
    attr.set_post_ops(po);
  }
  try {
    s->pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(s->a, s->b, s->c), attr, cpu_engine());
  } catch (const dnnl::error&) {
    return nullptr;  // unimplemented: the caller widens and calls BLAS instead
  }
  s->scratch = s->pd.scratchpad_desc();
  return std::make_shared<const DnnlMatmul>(std::move(s));
}

struct Cache {
  static constexpr std::size_t kMaxEntries = 4096;
  std::mutex mu;
  // nullptr values remember "oneDNN cannot", so that is asked once per shape too.
  std::unordered_map<Key, std::shared_ptr<const DnnlMatmul>, KeyHash> entries;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: worker threads may use it during exit
  return *c;
}

}  // namespace

DnnlMatmul::DnnlMatmul(std::unique_ptr<State> state) : state_(std::move(state)) {
  scratch_bytes_ = state_->scratch.get_size();
  impl_ = state_->pd.impl_info_str();
}

DnnlMatmul::~DnnlMatmul() = default;

void DnnlMatmul::run(const void* a, const void* b, void* c, void* scratch) const {
  // Inside a parallel region oneDNN would run one thread's share of a kernel planned for a
  // team; the CPU backend calls GEMM from stream threads, never from inside a region.
  MEMFIT_CHECK(!omp_in_parallel()) << "oneDNN matmul called inside an OpenMP parallel region";
  State& s = *state_;
  std::call_once(s.created, [&s] { s.prim = dnnl::matmul(s.pd); });
  dnnl::engine& engine = cpu_engine();
  thread_local dnnl::stream stream(engine);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(s.a, engine, const_cast<void*>(a))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(s.b, engine, const_cast<void*>(b))},
      {DNNL_ARG_DST, dnnl::memory(s.c, engine, c)}};
  if (scratch_bytes_ > 0) args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(s.scratch, engine, scratch));
  try {
    s.prim.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    MEMFIT_CHECK(false) << "oneDNN matmul (" << impl_ << ") failed: " << e.what();
  }
}

std::shared_ptr<const DnnlMatmul> find_dnnl_matmul(const GemmDesc& d, DType a, DType b, DType c) {
  MEMFIT_CHECK(d.m > 0 && d.n > 0 && d.k > 0 && d.batch > 0)
      << "find_dnnl_matmul needs a GEMM with work: m=" << d.m << " n=" << d.n << " k=" << d.k
      << " batch=" << d.batch;
  const Key key = make_key(d, a, b, c);
  Cache& cc = cache();
  {
    std::lock_guard<std::mutex> lock(cc.mu);
    auto it = cc.entries.find(key);
    if (it != cc.entries.end()) return it->second;
  }
  // Created outside the lock (a primitive descriptor takes tens of microseconds); a thread
  // that raced here keeps the first entry, so every caller sees one scratch size.
  std::shared_ptr<const DnnlMatmul> made = create(d, a, b, c);
  std::lock_guard<std::mutex> lock(cc.mu);
  if (cc.entries.size() >= Cache::kMaxEntries) cc.entries.clear();  // callers hold theirs
  return cc.entries.emplace(key, std::move(made)).first->second;
}

const DnnlIsa& dnnl_isa() {
  static const DnnlIsa isa = [] {
    const auto bits = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    auto has = [bits](dnnl_cpu_isa_t want) {
      const auto w = static_cast<unsigned>(want);
      return (bits & w) == w;
    };
    DnnlIsa r;
    r.avx512_core = has(dnnl_cpu_isa_avx512_core);
    r.bf16 = has(dnnl_cpu_isa_avx512_core_bf16);
    r.amx = has(dnnl_cpu_isa_avx512_core_amx);
    r.name = r.amx           ? "avx512_core_amx"
             : r.bf16        ? "avx512_core_bf16"
             : has(dnnl_cpu_isa_avx512_core_vnni) ? "avx512_core_vnni"
             : r.avx512_core ? "avx512_core"
             : has(dnnl_cpu_isa_avx2) ? "avx2"
                                      : "older than avx2";
    return r;
  }();
  return isa;
}

}  // namespace cpu
}  // namespace memfit
