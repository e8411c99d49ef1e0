#include "tests/core/layer_testutil.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/dtype.h"
#include "memory/check.h"
#include "memory/snapshot.h"

namespace memfit::testing {

// ---- host access ------------------------------------------------------------------------------

Vec read(const Tensor& t) {
  std::vector<float> f(static_cast<std::size_t>(t.numel()));
  convert(t.raw(), t.dtype(), f.data(), DType::kF32, f.size());
  return Vec(f.begin(), f.end());
}

void write(const Tensor& t, const Vec& v) {
  MEMFIT_CHECK(static_cast<std::int64_t>(v.size()) == t.numel());
  std::vector<float> f(v.begin(), v.end());
  convert(f.data(), DType::kF32, t.raw(), t.dtype(), f.size());
}

std::vector<unsigned char> bits(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.raw());
  return std::vector<unsigned char>(p, p + t.nbytes());
}

Act make_input(LayerContext& ctx, Shape s, const Vec& v) {
  Act a = ctx.make(s, ctx.dtype, Category::kActivation, "input");
  write(a->view(), v);
  return a;
}

Vec rand_vec(std::size_t n, std::mt19937& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(n);
  for (double& x : v) x = u(rng);
  return v;
}

Params rand_params(const std::vector<Parameter*>& ps, std::mt19937& rng) {
  Params out;
  for (const Parameter* p : ps) {
    Vec v = rand_vec(static_cast<std::size_t>(p->numel()), rng, -0.5, 0.5);
    if (p->init.kind == ParamInit::Kind::kOnes) {
      for (double& x : v) x += 1.0;
    }
    out.push_back(std::move(v));
  }
  return out;
}

void set_params(const std::vector<Parameter*>& ps, const Params& v) {
  for (std::size_t i = 0; i < ps.size(); ++i) {
    write(ps[i]->weight.view(), v[i]);
    if (ps[i]->master_on_device()) write(ps[i]->master.view(), v[i]);
  }
}

Params stored_params(const std::vector<Parameter*>& ps) {
  Params out;
  for (const Parameter* p : ps) out.push_back(read(p->weight.view()));
  return out;
}

void zero_grads(LayerContext& ctx, const std::vector<Parameter*>& ps) {
  for (Parameter* p : ps) ctx.backend.fill(ctx.stream, p->grad.view(), 0.0f);
}

FreeOnExit::~FreeOnExit() {
  layer.release_saved();
  for (Parameter* p : layer.parameters()) {
    p->weight.reset();
    p->master.reset();
    p->grad.reset();
  }
}

std::int64_t live_bytes(const CachingAllocator& a) {
  return a.stats().allocated_bytes[kStatAll].current;
}
std::int64_t peak_bytes(const CachingAllocator& a) {
  return a.stats().allocated_bytes[kStatAll].peak;
}

// ---- references ---------------------------------------------------------------------------------

Vec ref_linear(const Vec& x, std::int64_t in, std::int64_t out, const Vec& w, const Vec* b) {
  const std::size_t n = x.size() / static_cast<std::size_t>(in);
  Vec y(n * static_cast<std::size_t>(out));
  for (std::size_t r = 0; r < n; ++r) {
    for (std::int64_t o = 0; o < out; ++o) {
      double s = b ? (*b)[static_cast<std::size_t>(o)] : 0.0;
      for (std::int64_t i = 0; i < in; ++i) {
        s += x[r * in + i] * w[static_cast<std::size_t>(o * in + i)];
      }
      y[r * out + o] = s;
    }
  }
  return y;
}

Vec ref_layernorm(const Vec& x, std::int64_t c, const Vec& w, const Vec& b, double eps) {
  const std::size_t n = x.size() / static_cast<std::size_t>(c);
  Vec y(x.size());
  for (std::size_t r = 0; r < n; ++r) {
    double m = 0, v = 0;
    for (std::int64_t i = 0; i < c; ++i) m += x[r * c + i];
    m /= static_cast<double>(c);
    for (std::int64_t i = 0; i < c; ++i) v += (x[r * c + i] - m) * (x[r * c + i] - m);
    v /= static_cast<double>(c);
    const double rs = 1.0 / std::sqrt(v + eps);
    for (std::int64_t i = 0; i < c; ++i) {
      y[r * c + i] =
          (x[r * c + i] - m) * rs * w[static_cast<std::size_t>(i)] + b[static_cast<std::size_t>(i)];
    }
  }
  return y;
}

Vec ref_gelu(const Vec& x) {
  Vec y(x.size());
  const double k = std::sqrt(2.0 / M_PI);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double u = x[i];
    y[i] = 0.5 * u * (1.0 + std::tanh(k * (u + 0.044715 * u * u * u)));
  }
  return y;
}

Vec add(const Vec& a, const Vec& b) {
  Vec y(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
  return y;
}

Vec ref_attention(const Vec& x, std::int64_t b, std::int64_t t, std::int64_t c, std::int64_t heads,
                  const Params& p, std::size_t off) {
  const Vec qkv = ref_linear(x, c, 3 * c, p[off], &p[off + 1]);
  const std::int64_t hs = c / heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Vec merged(static_cast<std::size_t>(b * t * c));
  auto at = [&](std::int64_t bb, std::int64_t tt, std::int64_t part, std::int64_t h,
                std::int64_t d) {
    return qkv[static_cast<std::size_t>((bb * t + tt) * 3 * c + part * c + h * hs + d)];
  };
  for (std::int64_t bb = 0; bb < b; ++bb) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t i = 0; i < t; ++i) {
        Vec s(static_cast<std::size_t>(i + 1));
        double mx = -1e300;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < hs; ++d) dot += at(bb, i, 0, h, d) * at(bb, j, 1, h, d);
          s[static_cast<std::size_t>(j)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        double z = 0;
        for (double& v : s) z += (v = std::exp(v - mx));
        for (std::int64_t d = 0; d < hs; ++d) {
          double o = 0;
          for (std::int64_t j = 0; j <= i; ++j) {
            o += s[static_cast<std::size_t>(j)] / z * at(bb, j, 2, h, d);
          }
          merged[static_cast<std::size_t>((bb * t + i) * c + h * hs + d)] = o;
        }
      }
    }
  }
  return ref_linear(merged, c, c, p[off + 2], &p[off + 3]);
}

Vec ref_mlp(const Vec& x, std::int64_t c, std::int64_t f, const Params& p, std::size_t off) {
  const Vec h = ref_gelu(ref_linear(x, c, f, p[off], &p[off + 1]));
  return ref_linear(h, f, c, p[off + 2], &p[off + 3]);
}

Vec ref_transformer_block(const Vec& x, std::int64_t b, std::int64_t t, std::int64_t c,
                          std::int64_t heads, std::int64_t f, const Params& p, double eps) {
  const Vec x1 = add(x, ref_attention(ref_layernorm(x, c, p[0], p[1], eps), b, t, c, heads, p, 2));
  return add(x1, ref_mlp(ref_layernorm(x1, c, p[6], p[7], eps), c, f, p, 8));
}

Vec ref_mlp_block(const Vec& x, std::int64_t c, std::int64_t f, const Params& p, double eps) {
  return add(x, ref_mlp(ref_layernorm(x, c, p[0], p[1], eps), c, f, p, 2));
}

// ---- checks -------------------------------------------------------------------------------------

namespace {

double max_abs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

double rms(const Vec& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return v.empty() ? 0.0 : std::sqrt(s / static_cast<double>(v.size()));
}

// Tolerance for an f32 computation against an exact value: the layers here sum at most a few
// hundred products of O(1) terms in FP32 (the CPU backend accumulates nn ops in double and
// GEMMs in f32), so the rounding error is ~K * 2^-24 ~ 1e-5 of the tensor's scale in the
// worst case; central differences in double with h = 1e-5 are exact to ~1e-9. 1e-4 of the
// scale leaves that margin; a wrong formula (missing term, transposed index, wrong scale)
// is off by O(scale).
void expect_matches(const Vec& got, const Vec& ref, const std::string& what, double rel = 1e-4) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const double scale = std::max(max_abs(ref), 1e-3);
  int bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double tol = rel * (scale + std::fabs(ref[i]));
    if (!std::isfinite(got[i]) || std::fabs(got[i] - ref[i]) > tol) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", reference " << ref[i]
                      << " (tolerance " << tol << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size() << " elements off";
}

}  // namespace

void check_gradients(Layer& layer, Shape in_shape, const RefFn& ref, std::uint32_t seed) {
  SCOPED_TRACE("gradient check of " + layer.name());
  CpuEnv env(DType::kF32);
  layer.allocate({env.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  FreeOnExit free_params{layer};
  const std::vector<Parameter*> ps = layer.parameters();
  std::mt19937 rng(seed);
  const Params p = rand_params(ps, rng);
  set_params(ps, p);
  const Vec xv = rand_vec(static_cast<std::size_t>(in_shape.numel()), rng);
  Act x = make_input(env.ctx, in_shape, xv);
  zero_grads(env.ctx, ps);

  Act y = layer.forward(env.ctx, x, /*save=*/true);
  const Vec yref = ref(xv, p);
  expect_matches(read(y->view()), yref, layer.name() + " forward");

  const Vec dyv = rand_vec(yref.size(), rng);
  Act dy = env.ctx.make(y->view().shape(), DType::kF32, Category::kTemporary, "dy");
  write(dy->view(), dyv);
  Act dx = layer.backward(env.ctx, dy);
  ASSERT_EQ(dx->view().shape(), in_shape);

  // h = 1e-5: see expect_matches for why that step is exact enough here.
  constexpr double kStep = 1e-5;
  expect_matches(read(dx->view()),
                 fd_grad([&](const Vec& xx) { return dot(dyv, ref(xx, p)); }, xv, kStep),
                 layer.name() + " dx");
  for (std::size_t k = 0; k < ps.size(); ++k) {
    const Vec g = fd_grad(
        [&](const Vec& pk) {
          Params q = p;
          q[k] = pk;
          return dot(dyv, ref(xv, q));
        },
        p[k], kStep);
    expect_matches(read(ps[k]->grad.view()), g, ps[k]->name + " grad");
  }
}

void check_low_precision(const std::function<std::unique_ptr<Layer>()>& make, DType dt,
                         Shape in_shape, const RefFn& ref, double k, std::uint32_t seed) {
  std::unique_ptr<Layer> lp = make();
  SCOPED_TRACE(std::string("low precision ") + dtype_name(dt) + " of " + lp->name());
  CpuEnv env(dt);
  lp->allocate({env.alloc, dt, Device::kCpu, kDefaultStream});
  FreeOnExit free_lp{*lp};
  std::mt19937 rng(seed);
  set_params(lp->parameters(), rand_params(lp->parameters(), rng));
  const Params stored = stored_params(lp->parameters());
  Act x = make_input(env.ctx, in_shape, rand_vec(static_cast<std::size_t>(in_shape.numel()), rng));
  const Vec xr = read(x->view());
  zero_grads(env.ctx, lp->parameters());
  Act y = lp->forward(env.ctx, x, true);
  EXPECT_EQ(y->view().dtype(), dt);
  const Vec yref = ref(xr, stored);
  // Unit roundoff of the dtype; every stored intermediate (and the output) is rounded once,
  // so errors are a small multiple k of it, relative to the output's size.
  const double u = dt == DType::kF16 ? 0x1.0p-11 : dt == DType::kBF16 ? 0x1.0p-8 : 0x1.0p-24;
  const Vec yv = read(y->view());
  const double r = rms(yref);
  int bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < yv.size(); ++i) {
    worst = std::max(worst, std::fabs(yv[i] - yref[i]) / (u * (r + std::fabs(yref[i]))));
    if (!(std::fabs(yv[i] - yref[i]) <= k * u * (r + std::fabs(yref[i]))) && ++bad <= 5) {
      ADD_FAILURE() << "forward [" << i << "]: " << yv[i] << " vs " << yref[i];
    }
  }
  EXPECT_EQ(bad, 0);

  // dx against the same layer in f32 on the same (rounded) inputs and parameters.
  Act dy = env.ctx.make(y->view().shape(), dt, Category::kTemporary, "dy");
  const Vec dyv = rand_vec(yv.size(), rng);
  write(dy->view(), dyv);
  const Vec dyr = read(dy->view());
  const Vec dx_lp = read(lp->backward(env.ctx, dy)->view());

  std::unique_ptr<Layer> f32 = make();
  CpuEnv e32(DType::kF32);
  f32->allocate({e32.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  FreeOnExit free_f32{*f32};
  set_params(f32->parameters(), stored);
  zero_grads(e32.ctx, f32->parameters());
  Act x32 = make_input(e32.ctx, in_shape, xr);
  f32->forward(e32.ctx, x32, true).reset();
  Act dy32 = make_input(e32.ctx, y->view().shape(), dyr);
  const Vec dx_ref = read(f32->backward(e32.ctx, dy32)->view());
  const double rd = rms(dx_ref);
  bad = 0;
  double worst_dx = 0;
  for (std::size_t i = 0; i < dx_ref.size(); ++i) {
    worst_dx =
        std::max(worst_dx, std::fabs(dx_lp[i] - dx_ref[i]) / (u * (rd + std::fabs(dx_ref[i]))));
    if (!(std::fabs(dx_lp[i] - dx_ref[i]) <= k * u * (rd + std::fabs(dx_ref[i]))) && ++bad <= 5) {
      ADD_FAILURE() << "dx [" << i << "]: " << dx_lp[i] << " vs " << dx_ref[i];
    }
  }
  EXPECT_EQ(bad, 0);
  if (std::getenv("MEMFIT_LAYER_ERRORS")) {
    std::printf("%s %s: worst forward %.2f, dx %.2f units (k = %.0f)\n", lp->name().c_str(),
                dtype_name(dt), worst, worst_dx, k);
  }
}

void check_recompute(Layer& layer, Shape in_shape, std::uint32_t seed) {
  SCOPED_TRACE("recompute of " + layer.name());
  CpuEnv env(DType::kF32);
  layer.allocate({env.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  FreeOnExit free_params{layer};
  const std::vector<Parameter*> ps = layer.parameters();
  std::mt19937 rng(seed);
  set_params(ps, rand_params(ps, rng));
  Act x = make_input(env.ctx, in_shape, rand_vec(static_cast<std::size_t>(in_shape.numel()), rng));
  const auto y0 = bits(layer.forward(env.ctx, x, false)->view());
  Act dy;
  std::vector<std::vector<unsigned char>> first;
  // Passes 0 and 1: forward saving; pass 2: forward_for_backward (no output) before backward.
  for (int pass = 0; pass < 3; ++pass) {
    zero_grads(env.ctx, ps);
    if (pass == 2) {
      layer.forward_for_backward(env.ctx, x);
      EXPECT_TRUE(layer.has_saved());
    } else {
      Act y = layer.forward(env.ctx, x, true);
      EXPECT_EQ(bits(y->view()), y0) << "pass " << pass;
      if (!dy) dy = make_input(env.ctx, y->view().shape(), rand_vec(y->view().numel(), rng));
    }
    std::vector<std::vector<unsigned char>> got{bits(layer.backward(env.ctx, dy)->view())};
    for (Parameter* p : ps) got.push_back(bits(p->grad.view()));
    if (pass == 0) {
      first = std::move(got);
    } else {
      ASSERT_EQ(got.size(), first.size());
      for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], first[i]) << "tensor " << i;
    }
  }
}

void check_saved_state(Layer& layer, LayerContext& ctx, Shape in_shape) {
  SCOPED_TRACE("saved state of " + layer.name() + " on " + ctx.backend.name());
  Act x = ctx.make(in_shape, ctx.dtype, Category::kActivation, "input");
  ctx.backend.fill(ctx.stream, x->view(), 0.25f);
  const std::int64_t base = live_bytes(ctx.alloc);
  const std::int64_t act_base =
      ctx.alloc.stats().category_bytes[category_index(Category::kActivation)].current;

  Act y = layer.forward(ctx, x, false);
  EXPECT_FALSE(layer.has_saved());
  EXPECT_EQ(live_bytes(ctx.alloc) - base,
            static_cast<std::int64_t>(ctx.alloc.round_size(y->view().nbytes())));
  y.reset();
  EXPECT_EQ(live_bytes(ctx.alloc), base);

  y = layer.forward(ctx, x, true);
  EXPECT_TRUE(layer.has_saved());
  const std::int64_t held = live_bytes(ctx.alloc);
  EXPECT_THROW(layer.forward(ctx, x, true), CheckFailure);
  EXPECT_THROW(layer.forward(ctx, x, false), CheckFailure);
  EXPECT_EQ(live_bytes(ctx.alloc), held) << "a refused forward allocated";
  EXPECT_TRUE(layer.has_saved());
  layer.release_saved();
  EXPECT_FALSE(layer.has_saved());
  y.reset();
  EXPECT_EQ(live_bytes(ctx.alloc), base);

  y = layer.forward(ctx, x, true);
  Act dy = ctx.make(y->view().shape(), ctx.dtype, Category::kTemporary, "dy");
  ctx.backend.fill(ctx.stream, dy->view(), 0.5f);
  y.reset();
  Act dx = layer.backward(ctx, dy);
  EXPECT_FALSE(layer.has_saved());
  EXPECT_EQ(dx->view().shape(), in_shape);
  EXPECT_EQ(dx->view().dtype(), ctx.dtype);
  EXPECT_THROW(layer.backward(ctx, dy), CheckFailure);
  dx.reset();
  dy.reset();
  EXPECT_EQ(live_bytes(ctx.alloc), base);
  EXPECT_EQ(ctx.alloc.stats().category_bytes[category_index(Category::kActivation)].current,
            act_base);
}

void check_memory(Layer& layer, MetaEnv& env, Shape in_shape, std::int64_t seq_len,
                  const MemoryExpect& e) {
  SCOPED_TRACE("memory of " + layer.name() + " in " + dtype_name(env.ctx.dtype));
  LayerContext& ctx = env.ctx;
  const std::int64_t b = in_shape.numel() / (seq_len * in_shape[in_shape.ndim() - 1]);
  auto rounded = [&](const Act& a) {
    const auto n = static_cast<std::int64_t>(a->view().nbytes());
    // The sizes are chosen as whole granules, so no rounding hides in the comparisons.
    EXPECT_EQ(static_cast<std::int64_t>(env.alloc.round_size(a->view().nbytes())), n);
    return n;
  };
  EXPECT_EQ(e.cost.workspace_bytes, e.peaks.workspace());

  Act x = ctx.make(in_shape, ctx.dtype, Category::kActivation, "input");
  const std::int64_t base = live_bytes(env.alloc);
  env.alloc.reset_peak_stats();
  env.be.reset_stats();
  Act y = layer.forward(ctx, x, true);
  EXPECT_EQ(env.be.stats().gemm_flops, b * e.cost.forward_flops);
  const std::int64_t yb = rounded(y);
  EXPECT_EQ(yb, b * e.cost.output_bytes);
  const std::int64_t held = live_bytes(env.alloc) - base - yb;
  EXPECT_EQ(held, b * e.cost.saved_bytes);
  EXPECT_EQ(peak_bytes(env.alloc) - base - yb - held, b * e.peaks.forward);

  // Everything alive is tagged: the input, or the layer's own (its name or a sublayer's,
  // which starts with it); nothing temporary survives a forward.
  std::int64_t tagged = 0;
  for (const SegmentInfo& s : env.alloc.snapshot().segments) {
    for (const BlockInfo& bl : s.blocks) {
      if (bl.state != BlockState::kActiveAllocated) continue;
      EXPECT_NE(bl.category, Category::kTemporary) << bl.tag;
      if (bl.category != Category::kActivation || bl.tag == "input") continue;
      EXPECT_EQ(bl.tag.rfind(layer.name(), 0), 0u) << "tag '" << bl.tag << "'";
      tagged += static_cast<std::int64_t>(bl.size);
    }
  }
  EXPECT_EQ(tagged, held + yb);

  const Shape out_shape = y->view().shape();
  y.reset();
  Act dy = ctx.make(out_shape, ctx.dtype, Category::kTemporary, "dy");
  const std::int64_t base_b = live_bytes(env.alloc);
  env.alloc.reset_peak_stats();
  env.be.reset_stats();
  Act dx = layer.backward(ctx, dy);
  EXPECT_EQ(env.be.stats().gemm_flops, b * e.cost.backward_flops);
  const std::int64_t dxb = rounded(dx);
  EXPECT_EQ(dx->view().shape(), in_shape);
  EXPECT_EQ(peak_bytes(env.alloc) - base_b - dxb, b * e.peaks.backward);
  EXPECT_EQ(live_bytes(env.alloc) - base_b, dxb - held);
  EXPECT_EQ(env.alloc.stats().category_bytes[category_index(Category::kActivation)].current,
            static_cast<std::int64_t>(x->view().nbytes()));
  dx.reset();
  dy.reset();
  EXPECT_EQ(live_bytes(env.alloc), base);

  // forward_for_backward: the flops cost() says, and what forward saves, no output; its peak no
  // higher than the forward's (the DP and simulate() price it as one).
  env.be.reset_stats();
  env.alloc.reset_peak_stats();
  layer.forward_for_backward(ctx, x);
  EXPECT_LE(peak_bytes(env.alloc) - base - held, yb + b * e.peaks.forward);
  EXPECT_EQ(env.be.stats().gemm_flops, b * e.cost.flops_for_backward());
  EXPECT_LE(e.cost.flops_for_backward(), e.cost.forward_flops);
  EXPECT_EQ(live_bytes(env.alloc) - base, held);
  layer.release_saved();
  EXPECT_EQ(live_bytes(env.alloc), base);

  // save == false: only the output survives; the peak stays within saved + workspace.
  env.alloc.reset_peak_stats();
  y = layer.forward(ctx, x, false);
  EXPECT_EQ(live_bytes(env.alloc) - base, yb);
  EXPECT_LE(peak_bytes(env.alloc) - base - yb,
            b * (e.cost.saved_bytes + std::max<std::int64_t>(e.peaks.forward, 0)));
  EXPECT_FALSE(layer.has_saved());
}

}  // namespace memfit::testing
