// The synthetic GPT-2 training trace (tests/support/gpt_trace.h): what it models is documented
// there.
#include "tests/support/gpt_trace.h"

#include <algorithm>
#include <string>

#include "memory/check.h"
#include "memory/error.h"
#include "memory/size.h"

namespace memfit {

namespace {

[[noreturn]] void bad_spec(const char* field, std::int64_t value, const char* valid) {
  throw InvalidArgument("GptTraceSpec." + std::string(field) + " = " + std::to_string(value) +
                        " is invalid: " + valid);
}

void check_spec(const GptTraceSpec& s) {
  if (s.layers < 1) bad_spec("layers", s.layers, "need >= 1");
  if (s.hidden < 1) bad_spec("hidden", s.hidden, "need >= 1");
  if (s.heads < 1) bad_spec("heads", s.heads, "need >= 1");
  if (s.hidden % s.heads != 0) bad_spec("hidden", s.hidden, "must be divisible by heads");
  if (s.seq_len < 1) bad_spec("seq_len", s.seq_len, "need >= 1");
  if (s.max_seq_len < s.seq_len) bad_spec("max_seq_len", s.max_seq_len, "need >= seq_len");
  if (s.vocab < 1) bad_spec("vocab", s.vocab, "need >= 1");
  if (s.micro_batch < 1) bad_spec("micro_batch", s.micro_batch, "need >= 1");
  if (s.steps < 1) bad_spec("steps", s.steps, "need >= 1");
  if (s.act_bytes != 2 && s.act_bytes != 4) bad_spec("act_bytes", s.act_bytes, "2 or 4");
  if (s.mixed_precision && s.act_bytes != 2)
    bad_spec("act_bytes", s.act_bytes, "mixed precision needs 2-byte activations");
  if (s.use_copy_stream && s.copy_stream == kDefaultStream)
    bad_spec("copy_stream", 0, "must differ from the default stream 0");
}

std::size_t z(std::int64_t v) { return static_cast<std::size_t>(v); }

// "h<l>.", what block l's tensor names start with. Appended, not "h" + std::to_string(l) + ".":
// GCC 12 at -O3 warns -Wrestrict (falsely) there.
std::string block_prefix(std::size_t l) {
  std::string h = "h";
  h += std::to_string(l);
  h += '.';
  return h;
}

// Products of the shapes, overflow-checked once here so the generator can add freely.
struct Shapes {
  std::size_t B, T, C, H, L, V, maxT, a;  // a: activation dtype bytes
  std::size_t p;                          // parameter/gradient/optimizer dtype bytes
  std::size_t ce;                         // cross-entropy dtype bytes
  std::size_t bt, btc, bhtt, btv;

  explicit Shapes(const GptTraceSpec& s)
      : B(z(s.micro_batch)),
        T(z(s.seq_len)),
        C(z(s.hidden)),
        H(z(s.heads)),
        L(z(s.layers)),
        V(z(s.vocab)),
        maxT(z(s.max_seq_len)),
        a(z(s.act_bytes)),
        p(s.mixed_precision ? 4 : a),
        ce(s.mixed_precision ? 4 : a) {
    bt = checked_mul(B, T, "B*T");
    btc = checked_mul(bt, C, "B*T*C");
    bhtt = checked_mul(checked_mul(checked_mul(B, H, "B*H"), T, "B*H*T"), T, "B*H*T*T");
    btv = checked_mul(bt, V, "B*T*V");
    // The largest byte counts used below; checking them bounds every smaller one.
    checked_mul(checked_mul(btc, 16, "16*B*T*C"), a, "activation bytes");
    checked_mul(bhtt, 4, "B*H*T*T bytes");
    checked_mul(btv, 4, "B*T*V bytes");
    checked_mul(
        checked_mul(checked_mul(V + maxT + 12 * C + 13, C, "parameters"), L + 1, "parameters"), 16,
        "parameter bytes");
  }
};

struct Param {
  std::string name;
  std::size_t numel;
  std::uint64_t id = 0;
  bool has_grad = false;  // the persistent gradient exists (from step 0's backward on)
};

class GptTraceGen {
 public:
  explicit GptTraceGen(const GptTraceSpec& spec) : spec_(spec), s_(spec) {}

  AllocTrace run() {
    add_params();
    for (std::int64_t step = 0; step < spec_.steps; ++step) {
      t_.step(static_cast<std::uint64_t>(step));
      one_step(step == 0);
      if (step == 0 && spec_.empty_cache_after_first_step) t_.empty_cache();
    }
    return std::move(t_);
  }

 private:
  std::uint64_t A(std::size_t bytes, Category c, const std::string& tag,
                  StreamId stream = kDefaultStream) {
    return t_.alloc(bytes, c, stream, tag);
  }
  void F(std::uint64_t id) { t_.free(id); }
  std::uint64_t act(std::size_t bytes, const std::string& tag) {
    return A(bytes, Category::kActivation, tag);
  }
  std::uint64_t tmp(std::size_t bytes, const std::string& tag) {
    return A(bytes, Category::kTemporary, tag);
  }

  std::size_t param(const std::string& name, std::size_t numel) {
    params_.push_back({name, numel});
    return params_.size() - 1;
  }
  struct BlockParams {
    std::size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fpw, fpb;
  };
  void add_params() {
    const std::size_t C = s_.C;
    wte_ = param("wte", s_.V * C);     // (V,C), tied with the LM head
    wpe_ = param("wpe", s_.maxT * C);  // (maxT,C)
    for (std::size_t l = 0; l < s_.L; ++l) {
      const std::string h = block_prefix(l);
      blocks_.push_back({param(h + "ln1.w", C), param(h + "ln1.b", C),
                         param(h + "attn.qkv.w", C * 3 * C), param(h + "attn.qkv.b", 3 * C),
                         param(h + "attn.proj.w", C * C), param(h + "attn.proj.b", C),
                         param(h + "ln2.w", C), param(h + "ln2.b", C),
                         param(h + "mlp.fc.w", C * 4 * C), param(h + "mlp.fc.b", 4 * C),
                         param(h + "mlp.proj.w", 4 * C * C), param(h + "mlp.proj.b", C)});
    }
    lnfw_ = param("ln_f.w", C);
    lnfb_ = param("ln_f.b", C);
    for (Param& p : params_) p.id = A(p.numel * s_.p, Category::kParameter, p.name);
  }

  // A matmul weight in the activation dtype for this step (mixed precision only).
  std::uint64_t cast_weight(std::size_t i) {
    if (!spec_.mixed_precision) return kNone;
    return A(params_[i].numel * s_.a, Category::kParameter, params_[i].name + ".half");
  }
  void free_cast(std::uint64_t id) {
    if (id != kNone) F(id);
  }

  // Backward produced parameter i's gradient in `bytes_per_elem`: on step 0 the first
  // production becomes the persistent gradient (after a cast when the dtypes differ); every
  // later one is a temporary accumulated into it.
  void grad(std::size_t i, std::size_t bytes_per_elem) {
    Param& p = params_[i];
    const bool same_dtype = bytes_per_elem == s_.p;
    std::uint64_t t = kNone;
    if (!same_dtype || p.has_grad) t = tmp(p.numel * bytes_per_elem, p.name + ".grad.tmp");
    if (!p.has_grad) {
      A(p.numel * s_.p, Category::kGradient, p.name + ".grad");
      p.has_grad = true;
    }
    if (t != kNone) F(t);
  }
  std::size_t wgrad_bytes() const { return spec_.mixed_precision ? s_.a : s_.p; }

  struct Saved {  // what a block's forward keeps for its backward
    std::uint64_t x, mean1, rstd1, ln1, qkv, probs, y, xm, mean2, rstd2, ln2, fc, gelu;
    std::uint64_t wqkv, wproj, wfc, wfp;  // weight casts (kNone without mixed precision)
  };

  std::uint64_t block_forward(std::size_t l, std::uint64_t x, Saved& sv) {
    const BlockParams& bp = blocks_[l];
    const std::string h = block_prefix(l);
    const std::size_t a = s_.a, btc = s_.btc;
    sv.x = x;
    // ln1: x (B,T,C) -> out (B,T,C); mean, rstd (B,T) FP32
    sv.mean1 = act(s_.bt * 4, h + "ln1.mean");
    sv.rstd1 = act(s_.bt * 4, h + "ln1.rstd");
    sv.ln1 = act(btc * a, h + "ln1.out");
    // qkv: (B,T,C) @ (C,3C) -> (B,T,3C)
    sv.wqkv = cast_weight(bp.qkvw);
    sv.qkv = act(3 * btc * a, h + "attn.qkv");
    // scores q k^T / sqrt(C/H): (B,H,T,T), masked in place, softmax -> probs (B,H,T,T)
    const std::uint64_t scores = tmp(s_.bhtt * a, h + "attn.scores");
    sv.probs = act(s_.bhtt * a, h + "attn.probs");
    F(scores);
    // probs @ v: (B,H,T,C/H), re-laid out to (B,T,C)
    const std::uint64_t yh = tmp(btc * a, h + "attn.y_heads");
    sv.y = act(btc * a, h + "attn.y");
    F(yh);
    // proj: (B,T,C) @ (C,C) -> (B,T,C); residual x + proj -> xm (B,T,C)
    sv.wproj = cast_weight(bp.projw);
    const std::uint64_t ao = tmp(btc * a, h + "attn.proj.out");
    sv.xm = act(btc * a, h + "res1");
    F(ao);
    // ln2 as ln1
    sv.mean2 = act(s_.bt * 4, h + "ln2.mean");
    sv.rstd2 = act(s_.bt * 4, h + "ln2.rstd");
    sv.ln2 = act(btc * a, h + "ln2.out");
    // fc: (B,T,C) @ (C,4C) -> pre-GELU (B,T,4C); GELU -> (B,T,4C)
    sv.wfc = cast_weight(bp.fcw);
    sv.fc = act(4 * btc * a, h + "mlp.fc");
    sv.gelu = act(4 * btc * a, h + "mlp.gelu");
    // proj: (B,T,4C) @ (4C,C) -> (B,T,C); residual xm + mlp -> block output (B,T,C)
    sv.wfp = cast_weight(bp.fpw);
    const std::uint64_t mo = tmp(btc * a, h + "mlp.proj.out");
    const std::uint64_t out = act(btc * a, h + "res2");
    F(mo);
    return out;
  }

  // dout: gradient of the block output (B,T,C); returns the gradient of its input.
  std::uint64_t block_backward(std::size_t l, std::uint64_t dout, const Saved& sv) {
    const BlockParams& bp = blocks_[l];
    const std::string h = block_prefix(l);
    const std::size_t a = s_.a, btc = s_.btc;
    // mlp.proj: dgelu (B,T,4C) = dout @ W^T; dW = gelu^T @ dout; db = sum(dout)
    const std::uint64_t dgelu = tmp(4 * btc * a, h + "mlp.gelu.grad");
    grad(bp.fpw, wgrad_bytes());
    grad(bp.fpb, s_.p);
    F(sv.gelu);
    free_cast(sv.wfp);
    // GELU backward: dfc (B,T,4C)
    const std::uint64_t dfc = tmp(4 * btc * a, h + "mlp.fc.grad");
    F(dgelu);
    F(sv.fc);
    // mlp.fc: dln2 (B,T,C)
    const std::uint64_t dln2 = tmp(btc * a, h + "ln2.out.grad");
    grad(bp.fcw, wgrad_bytes());
    grad(bp.fcb, s_.p);
    F(dfc);
    F(sv.ln2);
    free_cast(sv.wfc);
    // ln2 backward: dxm (B,T,C); dout accumulates into it (residual)
    const std::uint64_t dxm = tmp(btc * a, h + "res1.grad");
    grad(bp.ln2w, s_.p);
    grad(bp.ln2b, s_.p);
    F(dln2);
    F(sv.mean2);
    F(sv.rstd2);
    F(sv.xm);
    F(dout);
    // attn.proj: dy (B,T,C)
    const std::uint64_t dy = tmp(btc * a, h + "attn.y.grad");
    grad(bp.projw, wgrad_bytes());
    grad(bp.projb, s_.p);
    F(sv.y);
    free_cast(sv.wproj);
    // attention: dqkv (B,T,3C) collects dq, dk, dv; dprobs = dy @ v^T (B,H,T,T)
    const std::uint64_t dqkv = tmp(3 * btc * a, h + "attn.qkv.grad");
    const std::uint64_t dprobs = tmp(s_.bhtt * a, h + "attn.probs.grad");
    F(dy);
    // softmax backward: dscores (B,H,T,T); dq = dscores @ k, dk = dscores^T @ q
    const std::uint64_t dscores = tmp(s_.bhtt * a, h + "attn.scores.grad");
    F(dprobs);
    F(sv.probs);
    F(dscores);
    // qkv: dln1 (B,T,C)
    const std::uint64_t dln1 = tmp(btc * a, h + "ln1.out.grad");
    grad(bp.qkvw, wgrad_bytes());
    grad(bp.qkvb, s_.p);
    F(dqkv);
    F(sv.qkv);
    F(sv.ln1);
    free_cast(sv.wqkv);
    // ln1 backward: dx (B,T,C); dxm accumulates into it (residual)
    const std::uint64_t dx = tmp(btc * a, h + "x.grad");
    grad(bp.ln1w, s_.p);
    grad(bp.ln1b, s_.p);
    F(dln1);
    F(sv.mean1);
    F(sv.rstd1);
    F(sv.x);
    F(dxm);
    return dx;
  }

  void one_step(bool first) {
    const std::size_t a = s_.a, btc = s_.btc;
    // The batch: inputs and targets (B,T) int64, copied in on the copy stream.
    const StreamId in_stream = spec_.use_copy_stream ? spec_.copy_stream : kDefaultStream;
    const std::uint64_t inp = A(s_.bt * 8, Category::kInput, "batch.inputs", in_stream);
    const std::uint64_t tgt = A(s_.bt * 8, Category::kInput, "batch.targets", in_stream);
    if (spec_.use_copy_stream) {
      t_.record_stream(inp, kDefaultStream);
      t_.record_stream(tgt, kDefaultStream);
    }

    t_.phase("forward");
    // Embeddings: wte[inputs] (B,T,C) + wpe[0:T] (T,C) -> x0 (B,T,C)
    const std::uint64_t tok = tmp(btc * a, "wte.out");
    const std::uint64_t pos = tmp(s_.T * s_.C * a, "wpe.out");
    std::uint64_t x = act(btc * a, "emb.out");
    F(tok);
    F(pos);
    std::vector<Saved> saved(s_.L);
    for (std::size_t l = 0; l < s_.L; ++l) x = block_forward(l, x, saved[l]);
    // ln_f: (B,T,C) -> (B,T,C), mean/rstd (B,T) FP32
    const std::uint64_t meanf = act(s_.bt * 4, "ln_f.mean");
    const std::uint64_t rstdf = act(s_.bt * 4, "ln_f.rstd");
    const std::uint64_t lnf = act(btc * a, "ln_f.out");
    // LM head: (B,T,C) @ wte^T (C,V) -> logits (B,T,V); cross-entropy on log-softmax (B,T,V)
    const std::uint64_t wte_half = cast_weight(wte_);
    const std::uint64_t logits = act(s_.btv * a, "lm_head.logits");
    std::uint64_t logp;
    if (spec_.mixed_precision) {  // autocast runs cross-entropy in FP32
      const std::uint64_t logits32 = tmp(s_.btv * 4, "lm_head.logits.float");
      F(logits);
      logp = act(s_.btv * s_.ce, "ce.log_softmax");
      F(logits32);
    } else {
      logp = act(s_.btv * s_.ce, "ce.log_softmax");
      F(logits);
    }
    const std::uint64_t loss = act(4, "loss");

    t_.phase("backward");
    // nll backward: dlogp (B,T,V); log-softmax backward: dlogits (B,T,V)
    const std::uint64_t dlogp = tmp(s_.btv * s_.ce, "ce.log_softmax.grad");
    std::uint64_t dlogits = tmp(s_.btv * s_.ce, "lm_head.logits.grad");
    F(dlogp);
    F(logp);
    if (spec_.mixed_precision) {  // back to the activation dtype for the matmul
      const std::uint64_t d = tmp(s_.btv * a, "lm_head.logits.grad.half");
      F(dlogits);
      dlogits = d;
    }
    // LM head: dlnf (B,T,C) = dlogits @ wte; dwte (V,C) = dlogits^T @ lnf
    const std::uint64_t dlnf = tmp(btc * a, "ln_f.out.grad");
    grad(wte_, wgrad_bytes());
    F(dlogits);
    F(lnf);
    free_cast(wte_half);
    // ln_f backward: dx (B,T,C)
    std::uint64_t dx = tmp(btc * a, "ln_f.x.grad");
    grad(lnfw_, s_.p);
    grad(lnfb_, s_.p);
    F(dlnf);
    F(meanf);
    F(rstdf);
    F(x);
    for (std::size_t l = s_.L; l-- > 0;) dx = block_backward(l, dx, saved[l]);
    // Embedding backward: dense (V,C) and (maxT,C) gradients from dx
    grad(wte_, a);
    grad(wpe_, a);
    F(dx);
    F(loss);
    F(inp);
    F(tgt);

    t_.phase("optimizer");
    if (first) {  // AdamW state, created lazily by the first step
      for (const Param& p : params_) {
        A(p.numel * 4, Category::kOptimizerState, p.name + ".exp_avg");
        A(p.numel * 4, Category::kOptimizerState, p.name + ".exp_avg_sq");
      }
    }
    // clip_grad_norm_: per-tensor norms, stacked, total norm, clip coefficient
    std::vector<std::uint64_t> norms;
    for (const Param& p : params_) norms.push_back(tmp(4, p.name + ".grad.norm"));
    const std::uint64_t stacked = tmp(4 * params_.size(), "clip.norms");
    const std::uint64_t total = tmp(4, "clip.total_norm");
    const std::uint64_t coef = tmp(4, "clip.coef");
    F(coef);
    F(total);
    F(stacked);
    for (auto it = norms.rbegin(); it != norms.rend(); ++it) F(*it);
    // foreach AdamW: sqrt(exp_avg_sq) denominators, one per parameter, alive together
    std::vector<std::uint64_t> denom;
    for (const Param& p : params_) denom.push_back(tmp(p.numel * 4, p.name + ".adam.denom"));
    for (std::uint64_t d : denom) F(d);
  }

  static constexpr std::uint64_t kNone = ~std::uint64_t{0};
  const GptTraceSpec& spec_;
  const Shapes s_;
  AllocTrace t_;
  std::vector<Param> params_;
  std::vector<BlockParams> blocks_;
  std::size_t wte_ = 0, wpe_ = 0, lnfw_ = 0, lnfb_ = 0;
};

}  // namespace

AllocTrace make_gpt_training_trace(const GptTraceSpec& spec) {
  check_spec(spec);
  return GptTraceGen(spec).run();
}

GptTraceBytes gpt_trace_bytes(const GptTraceSpec& spec) {
  check_spec(spec);
  const Shapes s(spec);
  GptTraceBytes b;
  b.parameter_count = s.V * s.C + s.maxT * s.C + s.L * (12 * s.C * s.C + 13 * s.C) + 2 * s.C;
  b.saved_per_block = 16 * s.btc * s.a + s.bhtt * s.a + 16 * s.bt;
  b.head_saved = s.btc * s.a + 2 * s.bt * 4 + s.btv * s.ce;
  return b;
}

}  // namespace memfit
