#include "core/layers/transformer_block.h"

#include <algorithm>

#include "memory/check.h"
#include "memory/error.h"

namespace memfit {

using layers::mul;
using layers::nbytes;

namespace {

// Replays a block's allocations and frees as byte counts, relative to what was live before.
struct Tracker {
  std::int64_t cur = 0, peak = 0;
  void add(std::int64_t n) {
    cur += n;
    peak = std::max(peak, cur);
  }
  void touch(std::int64_t extra) { peak = std::max(peak, cur + extra); }
  // A sublayer's forward(save=true): its own peak, then saved + output stay.
  void forward(const LayerCost& k, const PeakExcess& p) {
    touch(k.saved_bytes + k.output_bytes + p.forward);
    add(k.saved_bytes + k.output_bytes);
  }
  // A sublayer's backward: dx (the size of its input, `in`) comes, its saved state goes.
  void backward(const LayerCost& k, const PeakExcess& p, std::int64_t in) {
    touch(in + p.backward);
    add(in - k.saved_bytes);
  }
};

// out = a + b in place over a, which the block holds alone (the sublayers here never keep
// their outputs).
void residual_add(LayerContext& ctx, const Act& a, const Act& b) {
  MEMFIT_CHECK(a.use_count() == 1) << "a sublayer kept its output; the in-place add would "
                                      "overwrite saved state";
  ctx.backend.add(ctx.stream, a->view(), b->view(), a->view());
}

Act copy_of(LayerContext& ctx, const Act& dy, const std::string& tag) {
  Act d = ctx.make(dy->view().shape(), ctx.dtype, Category::kTemporary, tag);
  ctx.backend.copy(ctx.stream, dy->view(), d->view());
  return d;
}

}  // namespace

// ---- PreNormBlock: TransformerBlock (GPT-2) and LlamaBlock ------------------------------------

template <>
PreNormBlock<LayerNorm, MLP>::PreNormBlock(std::string name, std::int64_t hidden,
                                           std::int64_t heads, std::int64_t mlp_ratio,
                                           std::int64_t n_layers, float ln_eps,
                                           AttentionImpl attention)
    : Layer(name),
      hidden_(hidden),
      ln1_(name + ".ln1", hidden, ln_eps),
      attn_(name + ".attn", hidden, heads, layers::residual_init_std(n_layers), attention),
      ln2_(name + ".ln2", hidden, ln_eps),
      mlp_(name + ".mlp", hidden, mul(std::max<std::int64_t>(mlp_ratio, 1), hidden),
           layers::residual_init_std(n_layers)) {
  layers::check_dim("TransformerBlock", name, "mlp_ratio", mlp_ratio);
}

template <>
PreNormBlock<RMSNorm, GatedMLP>::PreNormBlock(std::string name, std::int64_t hidden,
                                              const LlamaBlockShape& shape, std::int64_t n_layers,
                                              AttentionImpl attention)
    : Layer(name),
      hidden_(hidden),
      ln1_(name + ".input_layernorm", hidden, shape.rms_eps),
      attn_(name + ".self_attn", hidden, shape.attention, layers::kInitStd, attention),
      ln2_(name + ".post_attention_layernorm", hidden, shape.rms_eps),
      mlp_(name + ".mlp", hidden, shape.inner, shape.mlp_bias, layers::kInitStd) {
  (void)n_layers;  // HF's Llama does not scale the residual projections' init by depth
}

template <class Norm, class Ffn>
std::vector<Parameter*> PreNormBlock<Norm, Ffn>::parameters() {
  std::vector<Parameter*> ps;
  for (Layer* l : std::initializer_list<Layer*>{&ln1_, &attn_, &ln2_, &mlp_}) {
    for (Parameter* p : l->parameters()) ps.push_back(p);
  }
  return ps;
}

template <class Norm, class Ffn>
bool PreNormBlock<Norm, Ffn>::has_saved() const {
  return ln1_.has_saved() || attn_.has_saved() || ln2_.has_saved() || mlp_.has_saved();
}

template <class Norm, class Ffn>
void PreNormBlock<Norm, Ffn>::release_saved() noexcept {
  ln1_.release_saved();
  attn_.release_saved();
  ln2_.release_saved();
  mlp_.release_saved();
}

template <class Norm, class Ffn>
Act PreNormBlock<Norm, Ffn>::forward(LayerContext& ctx, const Act& x, bool save) {
  MEMFIT_CHECK(!has_saved()) << "block '" << name() << "': forward while holding saved state";
  try {
    Act a = ln1_.forward(ctx, x, save);
    Act x1 = attn_.forward(ctx, a, save);
    a.reset();  // attention's qkv keeps it when saving
    residual_add(ctx, x1, x);
    Act b = ln2_.forward(ctx, x1, save);
    Act y = mlp_.forward(ctx, b, save);
    b.reset();
    residual_add(ctx, y, x1);
    return y;
  } catch (...) {
    release_saved();
    throw;
  }
}

template <class Norm, class Ffn>
void PreNormBlock<Norm, Ffn>::forward_for_backward(LayerContext& ctx, const Act& x) {
  MEMFIT_CHECK(!has_saved()) << "block '" << name() << "': forward while holding saved state";
  try {
    Act a = ln1_.forward(ctx, x, true);
    Act x1 = attn_.forward(ctx, a, true);
    a.reset();
    residual_add(ctx, x1, x);
    Act b = ln2_.forward(ctx, x1, true);
    mlp_.forward_for_backward(ctx, b);
  } catch (...) {
    release_saved();
    throw;
  }
}

template <class Norm, class Ffn>
Act PreNormBlock<Norm, Ffn>::backward(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "block '" << name() << "': backward without a saved forward";
  layers::check_grad("block", name(), dy, dy ? dy->view().shape() : Shape{}, ctx);
  // dres carries the residual stream's gradient; the LayerNorms add their dx into it.
  Act dres = copy_of(ctx, dy, name());
  {
    Act db = mlp_.backward(ctx, dy);
    ln2_.backward_into(ctx, db, dres->view());
  }
  {
    Act da = attn_.backward(ctx, dres);
    ln1_.backward_into(ctx, da, dres->view());
  }
  return dres;
}

template <class Norm, class Ffn>
PeakExcess PreNormBlock<Norm, Ffn>::peaks(std::int64_t seq_len, DType dtype) const {
  const LayerCost k1 = ln1_.cost(seq_len, dtype), ka = attn_.cost(seq_len, dtype),
                  k2 = ln2_.cost(seq_len, dtype), km = mlp_.cost(seq_len, dtype);
  const PeakExcess p1 = ln1_.peaks(seq_len, dtype), pa = attn_.peaks(seq_len, dtype),
                   p2 = ln2_.peaks(seq_len, dtype), pm = mlp_.peaks(seq_len, dtype);
  const std::int64_t c = nbytes(mul(seq_len, hidden_), dtype);
  PeakExcess p;
  Tracker f;
  f.forward(k1, p1);
  f.forward(ka, pa);
  f.forward(k2, p2);
  f.forward(km, pm);
  p.forward = f.peak - f.cur;
  Tracker b;
  b.add(c);                 // dres
  b.backward(km, pm, c);    // db comes, the MLP's saved state goes
  b.add(-k2.output_bytes);  // ... and ln2's output, the MLP's input, which only it held
  b.add(-k2.saved_bytes - ka.output_bytes);  // ln2 into dres: its stats and x1 go
  b.add(-c);                                 // db
  b.backward(ka, pa, c);                     // da
  b.add(-k1.output_bytes);                   // ln1's output, attention's input
  b.add(-k1.saved_bytes - c);                // ln1 into dres: its stats; then da
  p.backward = b.peak - c;
  return p;
}

template <class Norm, class Ffn>
LayerCost PreNormBlock<Norm, Ffn>::cost(std::int64_t seq_len, DType dtype) const {
  LayerCost k;
  for (const LayerCost& s : {ln1_.cost(seq_len, dtype), attn_.cost(seq_len, dtype),
                             ln2_.cost(seq_len, dtype), mlp_.cost(seq_len, dtype)}) {
    // Each sublayer's output is the next one's saved input (or, for the attention, the middle
    // residual stream ln2 saves), so everything but the last output stays.
    k.saved_bytes += s.saved_bytes + s.output_bytes;
    k.forward_flops += s.forward_flops;
    k.backward_flops += s.backward_flops;
  }
  const LayerCost km = mlp_.cost(seq_len, dtype);
  k.output_bytes = km.output_bytes;
  k.saved_bytes -= k.output_bytes;
  k.saves_input = true;
  // forward_for_backward: everything but the MLP's own skip (and the residual add, no flops).
  k.for_backward_flops = k.forward_flops - km.forward_flops + km.flops_for_backward();
  k.workspace_bytes = peaks(seq_len, dtype).workspace();
  return k;
}

template class PreNormBlock<LayerNorm, MLP>;
template class PreNormBlock<RMSNorm, GatedMLP>;

// ---- MLPBlock --------------------------------------------------------------------------------

MLPBlock::MLPBlock(std::string name, std::int64_t hidden, std::int64_t mlp_ratio,
                   std::int64_t n_layers, float ln_eps)
    : Layer(name),
      hidden_(hidden),
      ln_(name + ".ln", hidden, ln_eps),
      mlp_(name + ".mlp", hidden, mul(std::max<std::int64_t>(mlp_ratio, 1), hidden),
           layers::residual_init_std(n_layers)) {
  layers::check_dim("MLPBlock", name, "mlp_ratio", mlp_ratio);
}

std::vector<Parameter*> MLPBlock::parameters() {
  std::vector<Parameter*> ps = ln_.parameters();
  for (Parameter* p : mlp_.parameters()) ps.push_back(p);
  return ps;
}

bool MLPBlock::has_saved() const { return ln_.has_saved() || mlp_.has_saved(); }

void MLPBlock::release_saved() noexcept {
  ln_.release_saved();
  mlp_.release_saved();
}

Act MLPBlock::forward(LayerContext& ctx, const Act& x, bool save) {
  MEMFIT_CHECK(!has_saved()) << "MLPBlock '" << name() << "': forward while holding saved state";
  try {
    Act a = ln_.forward(ctx, x, save);
    Act y = mlp_.forward(ctx, a, save);
    a.reset();
    residual_add(ctx, y, x);
    return y;
  } catch (...) {
    release_saved();
    throw;
  }
}

Act MLPBlock::backward(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "MLPBlock '" << name() << "': backward without a saved forward";
  layers::check_grad("MLPBlock", name(), dy, dy ? dy->view().shape() : Shape{}, ctx);
  Act dres = copy_of(ctx, dy, name());
  Act da = mlp_.backward(ctx, dy);
  ln_.backward_into(ctx, da, dres->view());
  return dres;
}

PeakExcess MLPBlock::peaks(std::int64_t seq_len, DType dtype) const {
  const LayerCost kl = ln_.cost(seq_len, dtype), km = mlp_.cost(seq_len, dtype);
  const PeakExcess pl = ln_.peaks(seq_len, dtype), pm = mlp_.peaks(seq_len, dtype);
  const std::int64_t c = nbytes(mul(seq_len, hidden_), dtype);
  PeakExcess p;
  Tracker f;
  f.forward(kl, pl);
  f.forward(km, pm);
  p.forward = f.peak - f.cur;
  Tracker b;
  b.add(c);
  b.backward(km, pm, c);
  b.add(-kl.output_bytes);
  p.backward = b.peak - c;
  return p;
}

LayerCost MLPBlock::cost(std::int64_t seq_len, DType dtype) const {
  const LayerCost kl = ln_.cost(seq_len, dtype), km = mlp_.cost(seq_len, dtype);
  LayerCost k;
  k.saves_input = true;
  k.saved_bytes = kl.saved_bytes + kl.output_bytes + km.saved_bytes;
  k.output_bytes = km.output_bytes;
  k.workspace_bytes = peaks(seq_len, dtype).workspace();
  k.forward_flops = kl.forward_flops + km.forward_flops;
  k.backward_flops = kl.backward_flops + km.backward_flops;
  return k;
}

}  // namespace memfit
