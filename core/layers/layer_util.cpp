#include "core/layers/layer_util.h"

#include <cmath>
#include <string>

#include "memory/error.h"
#include "memory/size.h"

namespace memfit::layers {

namespace {

std::string where(const char* kind, const std::string& name) {
  return std::string(kind) + " '" + name + "'";
}

}  // namespace

void check_input(const char* kind, const std::string& name, const Act& x, std::int64_t last,
                 const LayerContext& ctx) {
  if (!x || !x->view().defined()) {
    throw InvalidArgument(where(kind, name) + ": forward input is empty; pass a (B,T," +
                          std::to_string(last) + ") activation");
  }
  const Tensor& t = x->view();
  if (t.ndim() < 2 || t.size(t.ndim() - 1) != last) {
    throw InvalidArgument(where(kind, name) + ": input shape " + t.shape().str() +
                          "; valid: (..., " + std::to_string(last) + ") with >= 2 dimensions");
  }
  if (t.device() != ctx.device()) {
    throw InvalidArgument(where(kind, name) + ": input on " + device_name(t.device()) +
                          ", the backend runs on " + device_name(ctx.device()));
  }
  if (t.dtype() != ctx.dtype) {
    throw InvalidArgument(where(kind, name) + ": input is " + dtype_name(t.dtype()) +
                          ", the context's activation dtype is " + dtype_name(ctx.dtype));
  }
}

void check_grad(const char* kind, const std::string& name, const Act& dy, const Shape& shape,
                const LayerContext& ctx) {
  if (!dy || !dy->view().defined() || dy->view().shape() != shape) {
    throw InvalidArgument(where(kind, name) + ": backward gradient has shape " +
                          (dy ? dy->view().shape().str() : std::string("(none)")) +
                          "; valid: the forward output's shape " + shape.str());
  }
  if (dy->view().device() != ctx.device()) {
    throw InvalidArgument(where(kind, name) + ": backward gradient on " +
                          device_name(dy->view().device()) + ", the backend runs on " +
                          device_name(ctx.device()));
  }
}

void check_dim(const char* kind, const std::string& name, const char* what, std::int64_t v) {
  if (v < 1) {
    throw InvalidArgument(where(kind, name) + ": " + what + " = " + std::to_string(v) +
                          "; valid: >= 1");
  }
}

Shape with_last(const Shape& s, std::int64_t last) {
  std::int64_t dims[kMaxDims];
  for (int i = 0; i < s.ndim(); ++i) dims[i] = s[i];
  dims[s.ndim() - 1] = last;
  return Shape::of(dims, s.ndim());
}

std::int64_t mul(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(
      checked_mul(static_cast<std::size_t>(a), static_cast<std::size_t>(b), "layer cost"));
}

std::int64_t nbytes(std::int64_t n, DType dt) {
  return mul(n, static_cast<std::int64_t>(dtype_size(dt)));
}

void init_param(Parameter& p, std::string name, Shape shape, ParamInit::Kind kind, float std) {
  p.name = std::move(name);
  p.shape = shape;
  p.init.kind = kind;
  p.init.std = std;
}

float residual_init_std(std::int64_t n_layers) {
  if (n_layers < 1) {
    throw InvalidArgument("residual_init_std: layers = " + std::to_string(n_layers) +
                          "; valid: >= 1");
  }
  return static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(n_layers)));
}

}  // namespace memfit::layers
