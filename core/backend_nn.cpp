// Argument checks of the neural-network ops (core/backend.h) and the attention composition.
// As in backend.cpp, every backend accepts and rejects exactly the same calls, and nothing is
// queued until all of a call's checks have passed.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/backend.h"
#include "core/backend_check.h"
#include "memory/error.h"

namespace memfit {

using namespace backend_check;  // NOLINT: the checks' home, as backend.cpp

namespace {

std::string num(std::int64_t v) { return std::to_string(v); }

// Product of every dimension but the last (the rows of a row-wise op); t has >= 1 dims.
std::int64_t leading(const Where& w, const char* role, const Tensor& t) {
  std::int64_t n = 1;
  for (int i = 0; i + 1 < t.ndim(); ++i) {
    n = mul_or_neg(n, t.size(i));
    if (n < 0) {
      throw InvalidArgument(w + ": " + role + " is " + tensor_desc(t) +
                            ", whose leading dimensions multiply past 2^63; valid: a shape whose "
                            "rows fit int64");
    }
  }
  return n;
}

void need_ndim(const Where& w, const char* role, const Tensor& t, int lo, int hi,
               const char* layout) {
  if (t.ndim() < lo || t.ndim() > hi) {
    throw InvalidArgument(w + ": " + role + " is " + tensor_desc(t) + "; valid: a tensor shaped " +
                          layout);
  }
}

void need_numel(const Where& w, const char* role, const Tensor& t, std::int64_t n,
                const std::string& layout) {
  if (t.numel() != n) {
    throw InvalidArgument(w + ": " + role + " is " + tensor_desc(t) + " (" + num(t.numel()) +
                          " elements); valid: " + num(n) + " elements, " + layout);
  }
}

void need_f32(const Where& w, const char* role, const Tensor& t) {
  if (t.dtype() != DType::kF32) {
    throw InvalidArgument(w + ": " + role + " is " + tensor_desc(t) +
                          "; valid: f32 (statistics and parameter gradients are FP32)");
  }
}

void need_same_dtype(const Where& w, const char* ra, const Tensor& a, const char* rb,
                     const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    throw InvalidArgument(w + ": " + ra + " is " + tensor_desc(a) + " and " + rb + " is " +
                          tensor_desc(b) + "; valid: one dtype for both");
  }
}

void need_finite(const Where& w, const char* what, float v, bool positive) {
  if (!std::isfinite(v) || (positive && !(v > 0.0f))) {
    throw InvalidArgument(w + ": " + what + " = " + std::to_string(v) + "; valid: finite" +
                          (positive ? ", > 0" : ""));
  }
}

void check_index(const Where& w, const char* role, const IndexTensor& t, Device dev) {
  if (t.device != dev) {
    throw InvalidArgument(w + ": " + role + " (int32 " + t.shape.str() + ") is on " +
                          device_name(t.device) + "; valid: on " + device_name(dev));
  }
  if (t.numel() > 0 && t.data == nullptr) {
    throw InvalidArgument(w + ": " + role + " (int32 " + t.shape.str() +
                          ") has no memory (null data); valid: a view of allocated memory");
  }
  if (reinterpret_cast<std::uintptr_t>(t.data) % 4 != 0) {
    throw InvalidArgument(w + ": " + role + " (int32 " + t.shape.str() +
                          ") is not 4-byte aligned; valid: an address aligned to int32");
  }
}

using Named = std::pair<const char*, const Tensor*>;
void check_operands(const Where& w, Device dev, std::initializer_list<Named> ts) {
  for (const Named& t : ts) check_operand(w, t.first, *t.second, dev, false);
}

// One operand of the overlap check. Outputs may not overlap anything, except an input named
// in `alias` (a bit per argument index) when they are exactly that input: same span, dtype.
struct Arg {
  const char* role;
  Span span;
  bool output;
  int dtype;  // -1 for int32 indices
  unsigned alias = 0;
};
Arg rd(const char* role, const Tensor& t) {
  return {role, span_of(t), false, static_cast<int>(t.dtype())};
}
Arg rd(const char* role, const IndexTensor& t) {
  const auto p = reinterpret_cast<std::uintptr_t>(t.data);
  return {role, {p, p + static_cast<std::uintptr_t>(t.numel()) * 4}, false, -1};
}
Arg wr(const char* role, const Tensor& t, unsigned alias = 0) {
  return {role, span_of(t), true, static_cast<int>(t.dtype()), alias};
}

void check_disjoint(const Where& w, std::initializer_list<Arg> args) {
  const Arg* a = args.begin();
  const int n = static_cast<int>(args.size());
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      if (!a[i].output && !a[j].output) continue;
      if (!overlaps(a[i].span, a[j].span)) continue;
      const bool declared = (a[i].alias >> j & 1u) || (a[j].alias >> i & 1u);
      const bool exact = a[i].span.begin == a[j].span.begin && a[i].span.end == a[j].span.end &&
                         a[i].dtype == a[j].dtype;
      if (declared && exact) continue;
      const Arg& o = a[i].output ? a[i] : a[j];
      const Arg& x = a[i].output ? a[j] : a[i];
      check_no_overlap(w, o.role, o.span, x.role, x.span);  // throws
    }
  }
}

// A view of elements [off, off + n) of t, for the attention composition's q/k/v parts.
Tensor part(const Tensor& t, std::int64_t off, std::int64_t n) {
  char* p = static_cast<char*>(t.raw());
  if (p != nullptr) p += static_cast<std::size_t>(off) * dtype_size(t.dtype());
  return Tensor(p, Shape{n}, t.dtype(), t.device());
}

}  // namespace

void Backend::layernorm_forward(StreamId stream, const Tensor& inp, const Tensor& weight,
                                const Tensor& bias, float eps, const Tensor& out,
                                const Tensor& mean, const Tensor& rstd) {
  const Where w{name(), "layernorm_forward"};
  check_stream(stream, w.op);
  check_operands(w, device(),
                 {{"inp", &inp},
                  {"weight", &weight},
                  {"bias", &bias},
                  {"out", &out},
                  {"mean", &mean},
                  {"rstd", &rstd}});
  need_ndim(w, "inp", inp, 1, kMaxDims, "(N..., C)");
  const std::int64_t c = inp.size(inp.ndim() - 1);
  const std::int64_t n = leading(w, "inp", inp);
  if (c == 0) {
    throw InvalidArgument(w + ": inp is " + tensor_desc(inp) +
                          "; valid: C (the last dimension) >= 1, rows have a mean");
  }
  need_numel(w, "weight", weight, c, "(C) with C inp's last dimension");
  need_numel(w, "bias", bias, c, "(C) with C inp's last dimension");
  need_numel(w, "out", out, inp.numel(), "as many as inp");
  need_f32(w, "mean", mean);
  need_f32(w, "rstd", rstd);
  need_numel(w, "mean", mean, n, "(N), one per row of inp");
  need_numel(w, "rstd", rstd, n, "(N), one per row of inp");
  need_finite(w, "eps", eps, true);
  check_disjoint(w, {rd("inp", inp), rd("weight", weight), rd("bias", bias), wr("out", out),
                     wr("mean", mean), wr("rstd", rstd)});
  do_layernorm_forward(stream, inp, weight, bias, eps, out, mean, rstd);
}

void Backend::layernorm_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                                 const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                 const Tensor& dinp, const Tensor& dweight, const Tensor& dbias) {
  const Where w{name(), "layernorm_backward"};
  check_stream(stream, w.op);
  check_operands(w, device(),
                 {{"dout", &dout},
                  {"inp", &inp},
                  {"weight", &weight},
                  {"mean", &mean},
                  {"rstd", &rstd},
                  {"dinp", &dinp},
                  {"dweight", &dweight},
                  {"dbias", &dbias}});
  need_ndim(w, "inp", inp, 1, kMaxDims, "(N..., C)");
  const std::int64_t c = inp.size(inp.ndim() - 1);
  const std::int64_t n = leading(w, "inp", inp);
  need_numel(w, "dout", dout, inp.numel(), "as many as inp");
  need_numel(w, "dinp", dinp, inp.numel(), "as many as inp");
  need_numel(w, "weight", weight, c, "(C) with C inp's last dimension");
  need_f32(w, "mean", mean);
  need_f32(w, "rstd", rstd);
  need_f32(w, "dweight", dweight);
  need_f32(w, "dbias", dbias);
  need_numel(w, "mean", mean, n, "(N), one per row of inp");
  need_numel(w, "rstd", rstd, n, "(N), one per row of inp");
  need_numel(w, "dweight", dweight, c, "(C) with C inp's last dimension");
  need_numel(w, "dbias", dbias, c, "(C) with C inp's last dimension");
  check_disjoint(w,
                 {rd("dout", dout), rd("inp", inp), rd("weight", weight), rd("mean", mean),
                  rd("rstd", rstd), wr("dinp", dinp), wr("dweight", dweight), wr("dbias", dbias)});
  do_layernorm_backward(stream, dout, inp, weight, mean, rstd, dinp, dweight, dbias);
}

void Backend::gelu_forward(StreamId stream, const Tensor& inp, const Tensor& out) {
  const Where w{name(), "gelu_forward"};
  check_stream(stream, w.op);
  check_operand(w, "inp", inp, device(), false);
  check_operand(w, "out", out, device(), false);
  check_same_numel(w, "inp", inp, "out", out);
  check_disjoint(w, {rd("inp", inp), wr("out", out, 1u)});
  do_gelu_forward(stream, inp, out);
}

void Backend::gelu_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                            const Tensor& dinp) {
  const Where w{name(), "gelu_backward"};
  check_stream(stream, w.op);
  check_operand(w, "dout", dout, device(), false);
  check_operand(w, "inp", inp, device(), false);
  check_operand(w, "dinp", dinp, device(), false);
  check_same_numel(w, "dout", dout, "inp", inp);
  check_same_numel(w, "dout", dout, "dinp", dinp);
  check_disjoint(w, {rd("dout", dout), rd("inp", inp), wr("dinp", dinp, 1u)});
  do_gelu_backward(stream, dout, inp, dinp);
}

void Backend::add(StreamId stream, const Tensor& a, const Tensor& b, const Tensor& out) {
  const Where w{name(), "add"};
  check_stream(stream, w.op);
  check_operand(w, "a", a, device(), false);
  check_operand(w, "b", b, device(), false);
  check_operand(w, "out", out, device(), false);
  check_same_numel(w, "a", a, "b", b);
  check_same_numel(w, "a", a, "out", out);
  check_disjoint(w, {rd("a", a), rd("b", b), wr("out", out, 3u)});
  do_add(stream, a, b, out);
}

void Backend::add_bias(StreamId stream, const Tensor& bias, const Tensor& out) {
  const Where w{name(), "add_bias"};
  check_stream(stream, w.op);
  check_operand(w, "bias", bias, device(), false);
  check_operand(w, "out", out, device(), false);
  need_ndim(w, "out", out, 1, kMaxDims, "(N..., OC)");
  need_numel(w, "bias", bias, out.size(out.ndim() - 1), "(OC) with OC out's last dimension");
  check_disjoint(w, {rd("bias", bias), wr("out", out)});
  do_add_bias(stream, bias, out);
}

void Backend::bias_backward(StreamId stream, const Tensor& dout, const Tensor& dbias) {
  const Where w{name(), "bias_backward"};
  check_stream(stream, w.op);
  check_operand(w, "dout", dout, device(), false);
  check_operand(w, "dbias", dbias, device(), false);
  need_ndim(w, "dout", dout, 1, kMaxDims, "(N..., OC)");
  need_f32(w, "dbias", dbias);
  need_numel(w, "dbias", dbias, dout.size(dout.ndim() - 1), "(OC) with OC dout's last dimension");
  check_disjoint(w, {rd("dout", dout), wr("dbias", dbias)});
  do_bias_backward(stream, dout, dbias);
}

namespace {

// T of a (..., T, T) score tensor.
std::int64_t score_t(const Where& w, const char* role, const Tensor& t) {
  need_ndim(w, role, t, 2, kMaxDims, "(..., T, T)");
  const std::int64_t tt = t.size(t.ndim() - 1);
  if (t.size(t.ndim() - 2) != tt) {
    throw InvalidArgument(w + ": " + role + " is " + tensor_desc(t) +
                          "; valid: square score matrices (..., T, T)");
  }
  return tt;
}

}  // namespace

void Backend::softmax_causal_forward(StreamId stream, const Tensor& preatt, float scale,
                                     const Tensor& att) {
  const Where w{name(), "softmax_causal_forward"};
  check_stream(stream, w.op);
  check_operand(w, "preatt", preatt, device(), false);
  check_operand(w, "att", att, device(), false);
  const std::int64_t t = score_t(w, "preatt", preatt);
  need_numel(w, "att", att, preatt.numel(), "as many as preatt");
  need_finite(w, "scale", scale, false);
  check_disjoint(w, {rd("preatt", preatt), wr("att", att, 1u)});
  do_softmax_causal_forward(stream, preatt, scale, att, t);
}

void Backend::softmax_causal_backward(StreamId stream, const Tensor& datt, const Tensor& att,
                                      float scale, const Tensor& dpreatt) {
  const Where w{name(), "softmax_causal_backward"};
  check_stream(stream, w.op);
  check_operand(w, "datt", datt, device(), false);
  check_operand(w, "att", att, device(), false);
  check_operand(w, "dpreatt", dpreatt, device(), false);
  const std::int64_t t = score_t(w, "att", att);
  need_numel(w, "datt", datt, att.numel(), "as many as att");
  need_numel(w, "dpreatt", dpreatt, att.numel(), "as many as att");
  need_finite(w, "scale", scale, false);
  check_disjoint(w, {rd("datt", datt), rd("att", att), wr("dpreatt", dpreatt, 1u)});
  do_softmax_causal_backward(stream, datt, att, scale, dpreatt, t);
}

namespace {

struct AttnDims {
  std::int64_t b, t, c, heads, hs, btc, scores;
};

// B, T, C from a 3-D (B,T,C*mult) tensor; checks heads and every size the GEMMs need.
AttnDims attn_dims(const Where& w, const char* role, const Tensor& x, std::int64_t mult,
                   std::int64_t heads, std::int64_t max_dim) {
  need_ndim(w, role, x, 3, 3, mult == 3 ? "(B, T, 3C)" : "(B, T, C)");
  AttnDims d{x.size(0), x.size(1), x.size(2) / mult, heads, 0, 0, 0};
  if (x.size(2) % mult != 0 || heads < 1 || d.c < heads || d.c % heads != 0) {
    throw InvalidArgument(w + ": " + role + " is " + tensor_desc(x) +
                          " with heads = " + num(heads) + "; valid: heads >= 1 dividing C" +
                          (mult == 3 ? " = last dimension / 3" : ""));
  }
  d.hs = d.c / heads;
  d.btc = x.numel() / mult;
  const std::int64_t bh = mul_or_neg(d.b, heads);
  d.scores = mul_or_neg(bh, mul_or_neg(d.t, d.t));
  if (bh < 0 || d.scores < 0 || mul_or_neg(d.btc, 3) < 0) {
    throw InvalidArgument(w + ": B*H*T*T for " + role + " " + tensor_desc(x) + " and heads " +
                          num(heads) + " exceeds 2^63; valid: smaller B, T or heads");
  }
  if (bh > max_dim || d.t > max_dim || d.hs > max_dim) {
    throw InvalidArgument(w + ": B*H = " + num(bh) + ", T = " + num(d.t) + ", hs = " + num(d.hs) +
                          "; valid on this backend: each <= " + num(max_dim) +
                          " (the batched GEMMs' limit)");
  }
  return d;
}

GemmDesc attn_gemm(const AttnDims& d, std::int64_t m, std::int64_t n, std::int64_t k, bool ta,
                   bool tb) {
  GemmDesc g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.trans_a = ta;
  g.trans_b = tb;
  g.batch = d.b * d.heads;
  g.stride_a = m * k;
  g.stride_b = k * n;
  g.stride_c = m * n;
  return g;
}

}  // namespace

void Backend::attention_forward(StreamId stream, const Tensor& qkv, std::int64_t heads,
                                const Tensor& qkvr, const Tensor& att, const Tensor& scratch,
                                const Tensor& out) {
  const Where w{name(), "attention_forward"};
  check_stream(stream, w.op);
  check_operands(
      w, device(),
      {{"qkv", &qkv}, {"qkvr", &qkvr}, {"att", &att}, {"scratch", &scratch}, {"out", &out}});
  const AttnDims d = attn_dims(w, "qkv", qkv, 3, heads, max_gemm_dim());
  need_numel(w, "qkvr", qkvr, 3 * d.btc, "(3, B, H, T, hs)");
  need_numel(w, "att", att, d.scores, "(B, H, T, T)");
  need_numel(w, "scratch", scratch, d.btc, "(B, H, T, hs)");
  need_numel(w, "out", out, d.btc, "(B, T, C)");
  check_disjoint(w, {rd("qkv", qkv), wr("qkvr", qkvr), wr("att", att), wr("scratch", scratch),
                     wr("out", out)});
  if (d.btc == 0) return;
  const Tensor q = part(qkvr, 0, d.btc), k = part(qkvr, d.btc, d.btc),
               v = part(qkvr, 2 * d.btc, d.btc);
  do_split_heads(stream, qkv, qkvr, {d.b, d.t, 3, d.heads, d.hs});
  do_gemm(stream, attn_gemm(d, d.t, d.t, d.hs, false, true), q, k, att);  // q @ k^T
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));
  do_softmax_causal_forward(stream, att, scale, att, d.t);
  do_gemm(stream, attn_gemm(d, d.t, d.hs, d.t, false, false), att, v, scratch);  // att @ v
  do_merge_heads(stream, scratch, out, {d.b, d.t, 1, d.heads, d.hs});
}

void Backend::attention_backward(StreamId stream, const Tensor& dout, const Tensor& qkvr,
                                 const Tensor& att, std::int64_t heads, const Tensor& datt,
                                 const Tensor& dqkvr, const Tensor& dqkv) {
  const Where w{name(), "attention_backward"};
  check_stream(stream, w.op);
  check_operands(w, device(),
                 {{"dout", &dout},
                  {"qkvr", &qkvr},
                  {"att", &att},
                  {"datt", &datt},
                  {"dqkvr", &dqkvr},
                  {"dqkv", &dqkv}});
  const AttnDims d = attn_dims(w, "dout", dout, 1, heads, max_gemm_dim());
  need_numel(w, "qkvr", qkvr, 3 * d.btc, "(3, B, H, T, hs)");
  need_numel(w, "att", att, d.scores, "(B, H, T, T)");
  need_numel(w, "datt", datt, d.scores, "(B, H, T, T)");
  need_numel(w, "dqkvr", dqkvr, 3 * d.btc, "(3, B, H, T, hs)");
  need_numel(w, "dqkv", dqkv, 3 * d.btc, "(B, T, 3C)");
  check_disjoint(w, {rd("dout", dout), rd("qkvr", qkvr), rd("att", att), wr("datt", datt),
                     wr("dqkvr", dqkvr), wr("dqkv", dqkv)});
  if (d.btc == 0) return;
  const Tensor q = part(qkvr, 0, d.btc), k = part(qkvr, d.btc, d.btc),
               v = part(qkvr, 2 * d.btc, d.btc);
  const Tensor dq = part(dqkvr, 0, d.btc), dk = part(dqkvr, d.btc, d.btc),
               dv = part(dqkvr, 2 * d.btc, d.btc);
  const Tensor dy = part(dqkv, 0, d.btc);  // dead before merge_heads overwrites it
  do_split_heads(stream, dout, dy, {d.b, d.t, 1, d.heads, d.hs});
  do_gemm(stream, attn_gemm(d, d.t, d.hs, d.t, true, false), att, dy, dv);  // att^T @ dy
  do_gemm(stream, attn_gemm(d, d.t, d.t, d.hs, false, true), dy, v, datt);  // dy @ v^T
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));
  do_softmax_causal_backward(stream, datt, att, scale, datt, d.t);
  do_gemm(stream, attn_gemm(d, d.t, d.hs, d.t, false, false), datt, k, dq);  // datt @ k
  do_gemm(stream, attn_gemm(d, d.t, d.hs, d.t, true, false), datt, q, dk);   // datt^T @ q
  do_merge_heads(stream, dqkvr, dqkv, {d.b, d.t, 3, d.heads, d.hs});
}

namespace {

// B, T, H, G, hs of a flash attention call from its 3-D qkv (B,T,(H+2G)*hs).
AttentionDims flash_dims(const Where& w, const Tensor& qkv, std::int64_t heads,
                         std::int64_t kv_heads) {
  need_ndim(w, "qkv", qkv, 3, 3, "(B, T, (H + 2G) * hs)");
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0) {
    throw InvalidArgument(w + ": heads = " + num(heads) + ", kv_heads = " + num(kv_heads) +
                          "; valid: heads >= 1, kv_heads >= 1 dividing heads");
  }
  const std::int64_t width = qkv.size(2);
  std::int64_t parts = -1;  // stays -1 when heads + 2 * kv_heads overflows
  if (__builtin_mul_overflow(kv_heads, 2, &parts) || __builtin_add_overflow(parts, heads, &parts)) {
    parts = -1;
  }
  if (parts <= 0 || width % parts != 0 || width / parts < 1 ||
      width / parts > Backend::kMaxAttentionHeadSize) {
    throw InvalidArgument(w + ": qkv is " + tensor_desc(qkv) + " with heads = " + num(heads) +
                          ", kv_heads = " + num(kv_heads) + "; valid: a last dimension of " +
                          "(heads + 2 * kv_heads) * hs with hs from 1 to " +
                          num(Backend::kMaxAttentionHeadSize));
  }
  AttentionDims d{qkv.size(0), qkv.size(1), heads, kv_heads, width / parts};
  // qkv's own numel fits int64 (a Tensor invariant), so B*T*H*hs and B*H*T, each at most that,
  // fit too.
  return d;
}

}  // namespace

void Backend::flash_attention_forward(StreamId stream, const Tensor& qkv, std::int64_t heads,
                                      std::int64_t kv_heads, const Tensor& out, const Tensor& lse) {
  const Where w{name(), "flash_attention_forward"};
  check_stream(stream, w.op);
  check_operands(w, device(), {{"qkv", &qkv}, {"out", &out}, {"lse", &lse}});
  const AttentionDims d = flash_dims(w, qkv, heads, kv_heads);
  const std::int64_t rows = d.b * d.t;
  need_numel(w, "out", out, rows * d.heads * d.hs, "(B, T, H * hs)");
  need_f32(w, "lse", lse);
  need_numel(w, "lse", lse, rows * d.heads, "(B, H, T)");
  check_disjoint(w, {rd("qkv", qkv), wr("out", out), wr("lse", lse)});
  if (rows == 0) return;
  do_flash_attention_forward(stream, qkv, d, out, lse);
}

void Backend::flash_attention_backward(StreamId stream, const Tensor& dout, const Tensor& qkv,
                                       const Tensor& out, const Tensor& lse, std::int64_t heads,
                                       std::int64_t kv_heads, const Tensor& delta,
                                       const Tensor& dqkv) {
  const Where w{name(), "flash_attention_backward"};
  check_stream(stream, w.op);
  check_operands(w, device(),
                 {{"dout", &dout},
                  {"qkv", &qkv},
                  {"out", &out},
                  {"lse", &lse},
                  {"delta", &delta},
                  {"dqkv", &dqkv}});
  const AttentionDims d = flash_dims(w, qkv, heads, kv_heads);
  const std::int64_t rows = d.b * d.t;
  need_numel(w, "dout", dout, rows * d.heads * d.hs, "(B, T, H * hs)");
  need_numel(w, "out", out, rows * d.heads * d.hs, "(B, T, H * hs)");
  need_f32(w, "lse", lse);
  need_numel(w, "lse", lse, rows * d.heads, "(B, H, T)");
  need_f32(w, "delta", delta);
  need_numel(w, "delta", delta, rows * d.heads, "(B, H, T)");
  need_numel(w, "dqkv", dqkv, qkv.numel(), "(B, T, (H + 2G) * hs), as qkv");
  check_disjoint(w, {rd("dout", dout), rd("qkv", qkv), rd("out", out), rd("lse", lse),
                     wr("delta", delta), wr("dqkv", dqkv)});
  if (rows == 0) return;
  do_flash_attention_backward(stream, dout, qkv, out, lse, d, delta, dqkv);
}

void Backend::rmsnorm_forward(StreamId stream, const Tensor& inp, const Tensor& weight, float eps,
                              const Tensor& out, const Tensor& rstd) {
  const Where w{name(), "rmsnorm_forward"};
  check_stream(stream, w.op);
  check_operands(w, device(), {{"inp", &inp}, {"weight", &weight}, {"out", &out}, {"rstd", &rstd}});
  need_ndim(w, "inp", inp, 1, kMaxDims, "(N..., C)");
  const std::int64_t c = inp.size(inp.ndim() - 1);
  const std::int64_t n = leading(w, "inp", inp);
  if (c == 0) {
    throw InvalidArgument(w + ": inp is " + tensor_desc(inp) +
                          "; valid: C (the last dimension) >= 1, rows have a mean square");
  }
  need_numel(w, "weight", weight, c, "(C) with C inp's last dimension");
  need_numel(w, "out", out, inp.numel(), "as many as inp");
  need_f32(w, "rstd", rstd);
  need_numel(w, "rstd", rstd, n, "(N), one per row of inp");
  need_finite(w, "eps", eps, true);
  check_disjoint(w, {rd("inp", inp), rd("weight", weight), wr("out", out), wr("rstd", rstd)});
  do_rmsnorm_forward(stream, inp, weight, eps, out, rstd);
}

void Backend::rmsnorm_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                               const Tensor& weight, const Tensor& rstd, const Tensor& dinp,
                               const Tensor& dweight) {
  const Where w{name(), "rmsnorm_backward"};
  check_stream(stream, w.op);
  check_operands(w, device(),
                 {{"dout", &dout},
                  {"inp", &inp},
                  {"weight", &weight},
                  {"rstd", &rstd},
                  {"dinp", &dinp},
                  {"dweight", &dweight}});
  need_ndim(w, "inp", inp, 1, kMaxDims, "(N..., C)");
  const std::int64_t c = inp.size(inp.ndim() - 1);
  const std::int64_t n = leading(w, "inp", inp);
  need_numel(w, "dout", dout, inp.numel(), "as many as inp");
  need_numel(w, "dinp", dinp, inp.numel(), "as many as inp");
  need_numel(w, "weight", weight, c, "(C) with C inp's last dimension");
  need_f32(w, "rstd", rstd);
  need_f32(w, "dweight", dweight);
  need_numel(w, "rstd", rstd, n, "(N), one per row of inp");
  need_numel(w, "dweight", dweight, c, "(C) with C inp's last dimension");
  check_disjoint(w, {rd("dout", dout), rd("inp", inp), rd("weight", weight), rd("rstd", rstd),
                     wr("dinp", dinp), wr("dweight", dweight)});
  do_rmsnorm_backward(stream, dout, inp, weight, rstd, dinp, dweight);
}

void Backend::rope(StreamId stream, const Tensor& qkv, std::int64_t heads, std::int64_t kv_heads,
                   const RopeFreqs& f, bool inverse) {
  const Where w{name(), "rope"};
  check_stream(stream, w.op);
  check_operand(w, "qkv", qkv, device(), false);
  const AttentionDims d = flash_dims(w, qkv, heads, kv_heads);
  if (d.hs % 2 != 0 || f.half != d.hs / 2) {
    throw InvalidArgument(w + ": qkv is " + tensor_desc(qkv) + " (head size " + num(d.hs) +
                          ") with " + num(f.half) +
                          " frequencies; valid: an even head size and head size / 2 frequencies");
  }
  for (std::int64_t i = 0; i < f.half; ++i) {
    need_finite(w, "inv_freq", f.inv_freq[i], false);
  }
  if (d.b * d.t == 0) return;
  do_rope(stream, qkv, d, f, inverse);
}

void Backend::qk_norm_forward(StreamId stream, const Tensor& qkv, std::int64_t heads,
                              std::int64_t kv_heads, const Tensor& q_weight, const Tensor& k_weight,
                              float eps, const Tensor& qk_in, const Tensor& rstd) {
  const Where w{name(), "qk_norm_forward"};
  check_stream(stream, w.op);
  check_operands(w, device(),
                 {{"qkv", &qkv},
                  {"q_weight", &q_weight},
                  {"k_weight", &k_weight},
                  {"qk_in", &qk_in},
                  {"rstd", &rstd}});
  const AttentionDims d = flash_dims(w, qkv, heads, kv_heads);
  const std::int64_t rows = d.b * d.t, qk = d.heads + d.kv_heads;
  need_numel(w, "q_weight", q_weight, d.hs, "(hs)");
  need_numel(w, "k_weight", k_weight, d.hs, "(hs)");
  need_same_dtype(w, "q_weight", q_weight, "k_weight", k_weight);
  need_numel(w, "qk_in", qk_in, rows * qk * d.hs, "(B, T, (H + G) * hs)");
  need_f32(w, "rstd", rstd);
  need_numel(w, "rstd", rstd, rows * qk, "(B, T, H + G)");
  need_finite(w, "eps", eps, true);
  check_disjoint(w, {wr("qkv", qkv), rd("q_weight", q_weight), rd("k_weight", k_weight),
                     wr("qk_in", qk_in), wr("rstd", rstd)});
  if (rows == 0) return;
  do_qk_norm_forward(stream, qkv, d, q_weight, k_weight, eps, qk_in, rstd);
}

void Backend::qk_norm_backward(StreamId stream, const Tensor& dqkv, const Tensor& qk_in,
                               const Tensor& rstd, std::int64_t heads, std::int64_t kv_heads,
                               const Tensor& q_weight, const Tensor& k_weight,
                               const Tensor& dq_weight, const Tensor& dk_weight) {
  const Where w{name(), "qk_norm_backward"};
  check_stream(stream, w.op);
  check_operands(w, device(),
                 {{"dqkv", &dqkv},
                  {"qk_in", &qk_in},
                  {"rstd", &rstd},
                  {"q_weight", &q_weight},
                  {"k_weight", &k_weight},
                  {"dq_weight", &dq_weight},
                  {"dk_weight", &dk_weight}});
  const AttentionDims d = flash_dims(w, dqkv, heads, kv_heads);
  const std::int64_t rows = d.b * d.t, qk = d.heads + d.kv_heads;
  need_numel(w, "qk_in", qk_in, rows * qk * d.hs, "(B, T, (H + G) * hs)");
  need_f32(w, "rstd", rstd);
  need_numel(w, "rstd", rstd, rows * qk, "(B, T, H + G)");
  need_numel(w, "q_weight", q_weight, d.hs, "(hs)");
  need_numel(w, "k_weight", k_weight, d.hs, "(hs)");
  need_same_dtype(w, "q_weight", q_weight, "k_weight", k_weight);
  need_f32(w, "dq_weight", dq_weight);
  need_f32(w, "dk_weight", dk_weight);
  need_numel(w, "dq_weight", dq_weight, d.hs, "(hs)");
  need_numel(w, "dk_weight", dk_weight, d.hs, "(hs)");
  check_disjoint(
      w, {wr("dqkv", dqkv), rd("qk_in", qk_in), rd("rstd", rstd), rd("q_weight", q_weight),
          rd("k_weight", k_weight), wr("dq_weight", dq_weight), wr("dk_weight", dk_weight)});
  if (rows == 0) return;
  do_qk_norm_backward(stream, dqkv, qk_in, rstd, d, q_weight, k_weight, dq_weight, dk_weight);
}

void Backend::swiglu_forward(StreamId stream, const Tensor& gate_up, const Tensor& out) {
  const Where w{name(), "swiglu_forward"};
  check_stream(stream, w.op);
  check_operands(w, device(), {{"gate_up", &gate_up}, {"out", &out}});
  need_ndim(w, "gate_up", gate_up, 1, kMaxDims, "(N..., 2F)");
  const std::int64_t two_f = gate_up.size(gate_up.ndim() - 1);
  if (two_f % 2 != 0) {
    throw InvalidArgument(w + ": gate_up is " + tensor_desc(gate_up) +
                          "; valid: an even last dimension 2F (gate, then up)");
  }
  need_numel(w, "out", out, gate_up.numel() / 2, "(N, F), half of gate_up");
  check_disjoint(w, {rd("gate_up", gate_up), wr("out", out)});
  if (out.numel() == 0) return;
  do_swiglu_forward(stream, gate_up, out);
}

void Backend::swiglu_backward(StreamId stream, const Tensor& dout, const Tensor& gate_up,
                              const Tensor& dgate_up) {
  const Where w{name(), "swiglu_backward"};
  check_stream(stream, w.op);
  check_operands(w, device(), {{"dout", &dout}, {"gate_up", &gate_up}, {"dgate_up", &dgate_up}});
  need_ndim(w, "gate_up", gate_up, 1, kMaxDims, "(N..., 2F)");
  const std::int64_t two_f = gate_up.size(gate_up.ndim() - 1);
  if (two_f % 2 != 0) {
    throw InvalidArgument(w + ": gate_up is " + tensor_desc(gate_up) +
                          "; valid: an even last dimension 2F (gate, then up)");
  }
  need_numel(w, "dout", dout, gate_up.numel() / 2, "(N, F), half of gate_up");
  need_numel(w, "dgate_up", dgate_up, gate_up.numel(), "as many as gate_up");
  check_disjoint(w, {rd("dout", dout), rd("gate_up", gate_up), wr("dgate_up", dgate_up, 2u)});
  if (dout.numel() == 0) return;
  do_swiglu_backward(stream, dout, gate_up, dgate_up);
}

void Backend::embedding_forward(StreamId stream, const IndexTensor& tokens, const Tensor& wte,
                                const Tensor& wpe, const Tensor& out) {
  embedding_forward_checked(stream, tokens, wte, &wpe, out);
}

void Backend::embedding_forward(StreamId stream, const IndexTensor& tokens, const Tensor& wte,
                                const Tensor& out) {
  embedding_forward_checked(stream, tokens, wte, nullptr, out);
}

void Backend::embedding_forward_checked(StreamId stream, const IndexTensor& tokens,
                                        const Tensor& wte, const Tensor* wpe, const Tensor& out) {
  const Where w{name(), "embedding_forward"};
  check_stream(stream, w.op);
  check_index(w, "tokens", tokens, device());
  check_operand(w, "wte", wte, device(), false);
  if (wpe != nullptr) check_operand(w, "wpe", *wpe, device(), false);
  check_operand(w, "out", out, device(), false);
  if (tokens.shape.ndim() != 2) {
    throw InvalidArgument(w + ": tokens is int32 " + tokens.shape.str() + "; valid: shaped (B, T)");
  }
  need_ndim(w, "wte", wte, 2, 2, "(V, C)");
  const std::int64_t t = tokens.shape[1], c = wte.size(1);
  if (wpe != nullptr) {
    need_ndim(w, "wpe", *wpe, 2, 2, "(maxT, C)");
    if (wpe->size(1) != c || wpe->size(0) < t) {
      throw InvalidArgument(w + ": wpe is " + tensor_desc(*wpe) + " with wte " + tensor_desc(wte) +
                            " and T = " + num(t) + "; valid: (maxT, C) with C = " + num(c) +
                            " and maxT >= T");
    }
  }
  need_numel(w, "out", out, mul_or_neg(tokens.numel(), c), "(B, T, C)");
  if (wpe != nullptr) {
    check_disjoint(w, {rd("tokens", tokens), rd("wte", wte), rd("wpe", *wpe), wr("out", out)});
  } else {
    check_disjoint(w, {rd("tokens", tokens), rd("wte", wte), wr("out", out)});
  }
  do_embedding_forward(stream, tokens, wte, wpe, out);
}

void Backend::embedding_backward(StreamId stream, const Tensor& dout, const IndexTensor& tokens,
                                 const Tensor& dwte, const Tensor& dwpe) {
  embedding_backward_checked(stream, dout, tokens, dwte, &dwpe);
}

void Backend::embedding_backward(StreamId stream, const Tensor& dout, const IndexTensor& tokens,
                                 const Tensor& dwte) {
  embedding_backward_checked(stream, dout, tokens, dwte, nullptr);
}

void Backend::embedding_backward_checked(StreamId stream, const Tensor& dout,
                                         const IndexTensor& tokens, const Tensor& dwte,
                                         const Tensor* dwpe) {
  const Where w{name(), "embedding_backward"};
  check_stream(stream, w.op);
  check_operand(w, "dout", dout, device(), false);
  check_index(w, "tokens", tokens, device());
  check_operand(w, "dwte", dwte, device(), false);
  if (dwpe != nullptr) check_operand(w, "dwpe", *dwpe, device(), false);
  if (tokens.shape.ndim() != 2) {
    throw InvalidArgument(w + ": tokens is int32 " + tokens.shape.str() + "; valid: shaped (B, T)");
  }
  need_ndim(w, "dwte", dwte, 2, 2, "(V, C)");
  need_f32(w, "dwte", dwte);
  const std::int64_t t = tokens.shape[1], c = dwte.size(1);
  if (dwpe != nullptr) {
    need_ndim(w, "dwpe", *dwpe, 2, 2, "(maxT, C)");
    need_f32(w, "dwpe", *dwpe);
    if (dwpe->size(1) != c || dwpe->size(0) < t) {
      throw InvalidArgument(w + ": dwpe is " + tensor_desc(*dwpe) + " with dwte " +
                            tensor_desc(dwte) + " and T = " + num(t) +
                            "; valid: (maxT, C) with C = " + num(c) + " and maxT >= T");
    }
  }
  need_numel(w, "dout", dout, mul_or_neg(tokens.numel(), c), "(B, T, C)");
  if (dwpe != nullptr) {
    check_disjoint(w,
                   {rd("dout", dout), rd("tokens", tokens), wr("dwte", dwte), wr("dwpe", *dwpe)});
  } else {
    check_disjoint(w, {rd("dout", dout), rd("tokens", tokens), wr("dwte", dwte)});
  }
  do_embedding_backward(stream, dout, tokens, dwte, dwpe);
}

namespace {

// N rows of a (N..., Vp) logits tensor, checked against targets and the vocabulary.
std::int64_t logit_rows(const Where& w, const Tensor& logits, const IndexTensor& targets,
                        std::int64_t vocab) {
  need_ndim(w, "logits", logits, 1, kMaxDims, "(N..., Vp)");
  const std::int64_t vp = logits.size(logits.ndim() - 1);
  const std::int64_t n = leading(w, "logits", logits);
  if (vocab < 1 || vocab > vp) {
    throw InvalidArgument(w + ": vocab = " + num(vocab) + " with logits " + tensor_desc(logits) +
                          "; valid: 1 <= vocab <= Vp (logits' last dimension)");
  }
  if (targets.numel() != n) {
    throw InvalidArgument(w + ": targets is int32 " + targets.shape.str() + " with logits " +
                          tensor_desc(logits) + "; valid: " + num(n) + " targets, one per row");
  }
  return n;
}

}  // namespace

void Backend::crossentropy_forward(StreamId stream, const Tensor& logits,
                                   const IndexTensor& targets, std::int64_t vocab,
                                   const Tensor& losses, const Tensor& lse) {
  const Where w{name(), "crossentropy_forward"};
  check_stream(stream, w.op);
  check_operand(w, "logits", logits, device(), false);
  check_index(w, "targets", targets, device());
  check_operand(w, "losses", losses, device(), false);
  check_operand(w, "lse", lse, device(), false);
  const std::int64_t n = logit_rows(w, logits, targets, vocab);
  need_f32(w, "losses", losses);
  need_f32(w, "lse", lse);
  need_numel(w, "losses", losses, n, "(N), one per row of logits");
  need_numel(w, "lse", lse, n, "(N), one per row of logits");
  check_disjoint(
      w, {rd("logits", logits), rd("targets", targets), wr("losses", losses), wr("lse", lse)});
  do_crossentropy_forward(stream, logits, targets, vocab, losses, lse);
}

void Backend::crossentropy_backward(StreamId stream, const Tensor& logits, const Tensor& lse,
                                    const IndexTensor& targets, std::int64_t vocab, float dloss,
                                    const Tensor* dlosses, const Tensor& dlogits) {
  const Where w{name(), "crossentropy_backward"};
  check_stream(stream, w.op);
  check_operand(w, "logits", logits, device(), false);
  check_operand(w, "lse", lse, device(), false);
  check_index(w, "targets", targets, device());
  check_operand(w, "dlogits", dlogits, device(), false);
  const std::int64_t n = logit_rows(w, logits, targets, vocab);
  need_f32(w, "lse", lse);
  need_numel(w, "lse", lse, n, "(N), one per row of logits");
  need_numel(w, "dlogits", dlogits, logits.numel(), "as many as logits");
  need_finite(w, "dloss", dloss, false);
  Tensor dl(nullptr, Shape{0}, DType::kF32, device());  // no memory: overlaps nothing
  if (dlosses != nullptr) {
    check_operand(w, "dlosses", *dlosses, device(), false);
    need_f32(w, "dlosses", *dlosses);
    need_numel(w, "dlosses", *dlosses, n, "(N), one per row of logits");
    dl = *dlosses;
  }
  check_disjoint(w, {rd("logits", logits), rd("lse", lse), rd("targets", targets),
                     rd("dlosses", dl), wr("dlogits", dlogits, 1u)});
  do_crossentropy_backward(stream, logits, lse, targets, vocab, dloss, dlosses, dlogits);
}

void Backend::adamw(StreamId stream, const AdamWConstants& k, const Tensor& param,
                    const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                    const Tensor* param_out) {
  const Where w{name(), "adamw"};
  check_stream(stream, w.op);
  check_operands(
      w, device(),
      {{"param", &param}, {"grad", &grad}, {"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}});
  need_f32(w, "param", param);
  need_f32(w, "exp_avg", exp_avg);
  need_f32(w, "exp_avg_sq", exp_avg_sq);
  check_same_numel(w, "param", param, "grad", grad);
  check_same_numel(w, "param", param, "exp_avg", exp_avg);
  check_same_numel(w, "param", param, "exp_avg_sq", exp_avg_sq);
  Tensor po(nullptr, Shape{0}, DType::kF32, device());
  if (param_out != nullptr) {
    check_operand(w, "param_out", *param_out, device(), false);
    check_same_numel(w, "param", param, "param_out", *param_out);
    po = *param_out;
  }
  try {
    validate_adamw_constants(k);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(w + ": " + e.what());
  }
  check_disjoint(w, {wr("param", param), rd("grad", grad), wr("exp_avg", exp_avg),
                     wr("exp_avg_sq", exp_avg_sq), wr("param_out", po)});
  do_adamw(stream, k, param, grad, exp_avg, exp_avg_sq, param_out);
}

}  // namespace memfit
