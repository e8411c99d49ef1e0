// Conv2dDesc and the argument checks of conv2d_forward/backward (core/backend.h). As in
// backend.cpp and backend_nn.cpp, every backend accepts and rejects exactly the same calls, and
// nothing is queued until all of a call's checks have passed.
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

#include "core/backend.h"
#include "core/backend_check.h"
#include "memory/error.h"

namespace memfit {

using namespace backend_check;  // NOLINT: the checks' home, as backend.cpp

namespace {

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();

std::string num(std::int64_t v) { return std::to_string(v); }

// (extent + 2*pad - kernel) / stride + 1, or 0 when that is not a valid output size.
std::int64_t out_size(std::int64_t extent, std::int64_t pad, std::int64_t kernel,
                      std::int64_t stride) {
  if (extent < 1 || kernel < 1 || stride < 1 || pad < 0) return 0;
  if (pad > (kInt64Max - extent) / 2) return 0;
  const std::int64_t padded = extent + 2 * pad;
  if (padded < kernel) return 0;
  return (padded - kernel) / stride + 1;
}

// Product of non-negative factors, -1 past int64.
std::int64_t product(std::initializer_list<std::int64_t> xs) {
  std::int64_t v = 1;
  for (std::int64_t x : xs) {
    v = mul_or_neg(v, x);
    if (v < 0) return -1;
  }
  return v;
}

}  // namespace

std::int64_t Conv2dDesc::p() const { return out_size(h, pad_h, r, stride_h); }

std::int64_t Conv2dDesc::q() const { return out_size(w, pad_w, s, stride_w); }

std::int64_t Conv2dDesc::flops() const {
  if (n < 0 || k < 0 || c < 0) return 0;
  const std::int64_t v = product({2, n, p(), q(), k, r, s, c});
  return v < 0 ? kInt64Max : v;
}

std::string Conv2dDesc::str() const {
  return "n=" + num(n) + " h=" + num(h) + " w=" + num(w) + " c=" + num(c) + " k=" + num(k) +
         " r=" + num(r) + " s=" + num(s) + " stride=(" + num(stride_h) + "," + num(stride_w) +
         ") pad=(" + num(pad_h) + "," + num(pad_w) + ")";
}

std::string Conv2dDesc::invalid_reason() const {
  struct Named {
    const char* name;
    std::int64_t v;
    std::int64_t lo;
  };
  for (const Named& f :
       {Named{"n", n, 0}, Named{"h", h, 1}, Named{"w", w, 1}, Named{"c", c, 1}, Named{"k", k, 1},
        Named{"r", r, 1}, Named{"s", s, 1}, Named{"stride_h", stride_h, 1},
        Named{"stride_w", stride_w, 1}, Named{"pad_h", pad_h, 0}, Named{"pad_w", pad_w, 0}}) {
    if (f.v < f.lo || f.v > kInt32Max) {
      return std::string(f.name) + " = " + num(f.v) + "; valid: " + num(f.lo) + " <= " + f.name +
             " <= 2^31 - 1";
    }
  }
  // Both fit int32, so these sums cannot overflow int64.
  if (h + 2 * pad_h < r) {
    return "the padded height h + 2*pad_h = " + num(h + 2 * pad_h) + " is below r = " + num(r) +
           "; valid: h + 2*pad_h >= r";
  }
  if (w + 2 * pad_w < s) {
    return "the padded width w + 2*pad_w = " + num(w + 2 * pad_w) + " is below s = " + num(s) +
           "; valid: w + 2*pad_w >= s";
  }
  const std::int64_t pp = out_size(h, pad_h, r, stride_h);
  const std::int64_t qq = out_size(w, pad_w, s, stride_w);
  struct Count {
    const char* what;
    std::int64_t v;
  };
  for (const Count& e : {Count{"inp (n*h*w*c)", product({n, h, w, c})},
                         Count{"weight (k*r*s*c)", product({k, r, s, c})},
                         Count{"out (n*p*q*k)", product({n, pp, qq, k})}}) {
    if (e.v < 0 || e.v > kInt32Max) {
      return std::string(e.what) + " has " + (e.v < 0 ? std::string("more than 2^63") : num(e.v)) +
             " elements; valid: at most 2^31 - 1 (cuDNN's descriptors take int)";
    }
  }
  return {};
}

namespace {

void check_desc(const Where& w, const Conv2dDesc& d) {
  const std::string why = d.invalid_reason();
  if (!why.empty()) throw InvalidArgument(w + ": descriptor " + d.str() + ": " + why);
}

void need_numel(const Where& w, const char* role, const Tensor& t, std::int64_t n,
                const char* layout) {
  if (t.numel() != n) {
    throw InvalidArgument(w + ": " + role + " is " + tensor_desc(t) + " (" + num(t.numel()) +
                          " elements); valid: " + num(n) + " elements, " + layout);
  }
}

// The data operands share one dtype (cuDNN's convolution configurations take one).
void need_dtype(const Where& w, const char* role, const Tensor& t, const char* ref_role, DType dt) {
  if (t.dtype() != dt) {
    throw InvalidArgument(w + ": " + role + " is " + tensor_desc(t) + " but " + ref_role + " is " +
                          dtype_name(dt) + "; valid: the same dtype as " + ref_role +
                          " (f32, f16 or bf16; convolutions take one data type)");
  }
}

void need_disjoint(const Where& w, const char* out_role, const Tensor& out, const char* role,
                   const Tensor& t) {
  check_no_overlap(w, out_role, span_of(out), role, span_of(t));
}

}  // namespace

void Backend::conv2d_forward(StreamId stream, const Conv2dDesc& d, const Tensor& inp,
                             const Tensor& weight, const Tensor& out) {
  const Where w{name(), "conv2d_forward"};
  check_stream(stream, w.op);
  check_operand(w, "inp", inp, device(), false);
  check_operand(w, "weight", weight, device(), false);
  check_operand(w, "out", out, device(), false);
  check_desc(w, d);
  need_numel(w, "inp", inp, d.n * d.h * d.w * d.c, "(N,H,W,C) channels-last");
  need_numel(w, "weight", weight, d.k * d.r * d.s * d.c, "(K,R,S,C)");
  need_numel(w, "out", out, d.n * d.p() * d.q() * d.k, "(N,P,Q,K) channels-last");
  need_dtype(w, "weight", weight, "inp", inp.dtype());
  need_dtype(w, "out", out, "inp", inp.dtype());
  need_disjoint(w, "out", out, "inp", inp);
  need_disjoint(w, "out", out, "weight", weight);
  do_conv2d_forward(stream, d, inp, weight, out);
}

void Backend::conv2d_backward(StreamId stream, const Conv2dDesc& d, const Tensor& dout,
                              const Tensor& inp, const Tensor& weight, const Tensor* dinp,
                              const Tensor& dweight) {
  const Where w{name(), "conv2d_backward"};
  check_stream(stream, w.op);
  check_operand(w, "dout", dout, device(), false);
  check_operand(w, "inp", inp, device(), false);
  check_operand(w, "weight", weight, device(), false);
  if (dinp != nullptr) check_operand(w, "dinp", *dinp, device(), false);
  check_operand(w, "dweight", dweight, device(), false);
  check_desc(w, d);
  need_numel(w, "dout", dout, d.n * d.p() * d.q() * d.k, "(N,P,Q,K) channels-last");
  need_numel(w, "inp", inp, d.n * d.h * d.w * d.c, "(N,H,W,C) channels-last");
  need_numel(w, "weight", weight, d.k * d.r * d.s * d.c, "(K,R,S,C)");
  need_numel(w, "dweight", dweight, d.k * d.r * d.s * d.c, "(K,R,S,C) as weight");
  if (dinp != nullptr) need_numel(w, "dinp", *dinp, inp.numel(), "(N,H,W,C) as inp");
  need_dtype(w, "dout", dout, "inp", inp.dtype());
  need_dtype(w, "weight", weight, "inp", inp.dtype());
  if (dinp != nullptr) need_dtype(w, "dinp", *dinp, "inp", inp.dtype());
  if (dweight.dtype() != DType::kF32) {
    throw InvalidArgument(w + ": dweight is " + tensor_desc(dweight) +
                          "; valid: f32 (parameter gradients accumulate in FP32)");
  }
  for (const auto& [role, t] :
       {std::pair<const char*, const Tensor*>{"dout", &dout}, {"inp", &inp}, {"weight", &weight}}) {
    need_disjoint(w, "dweight", dweight, role, *t);
    if (dinp != nullptr) need_disjoint(w, "dinp", *dinp, role, *t);
  }
  if (dinp != nullptr) need_disjoint(w, "dinp", *dinp, "dweight", dweight);
  do_conv2d_backward(stream, d, dout, inp, weight, dinp, dweight);
}

}  // namespace memfit
