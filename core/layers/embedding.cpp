#include "core/layers/embedding.h"

#include <string>

#include "core/layers/layer_util.h"
#include "memory/error.h"

namespace memfit {

TokenEmbedding::TokenEmbedding(std::string name, std::int64_t vocab, std::int64_t max_seq_len,
                               std::int64_t hidden, bool positions)
    : name_(std::move(name)),
      vocab_(vocab),
      max_seq_len_(max_seq_len),
      hidden_(hidden),
      positions_(positions) {
  layers::check_dim("TokenEmbedding", name_, "vocab", vocab);
  layers::check_dim("TokenEmbedding", name_, "max_seq_len", max_seq_len);
  layers::check_dim("TokenEmbedding", name_, "hidden", hidden);
  layers::init_param(wte_, "wte", Shape{vocab, hidden}, ParamInit::Kind::kNormal, layers::kInitStd);
  if (positions_) {
    layers::init_param(wpe_, "wpe", Shape{max_seq_len, hidden}, ParamInit::Kind::kNormal,
                       layers::kInitStd);
  }
}

Parameter& TokenEmbedding::wpe() {
  if (!positions_) {
    throw InvalidArgument("TokenEmbedding '" + name_ +
                          "': no position table (positions = false: rotary positions)");
  }
  return wpe_;
}

std::vector<Parameter*> TokenEmbedding::parameters() {
  if (!positions_) return {&wte_};
  return {&wte_, &wpe_};
}

namespace {

void check_tokens(const std::string& name, const IndexTensor& tokens, std::int64_t max_t,
                  const LayerContext& ctx) {
  if (tokens.shape.ndim() != 2 || tokens.shape[1] > max_t || tokens.shape[1] < 1 ||
      tokens.shape[0] < 1) {
    throw InvalidArgument(
        "TokenEmbedding '" + name + "': tokens of shape " + tokens.shape.str() +
        "; valid: (B, T) with B >= 1 and 1 <= T <= max_seq_len = " + std::to_string(max_t));
  }
  if (tokens.device != ctx.device()) {
    throw InvalidArgument("TokenEmbedding '" + name + "': tokens on " + device_name(tokens.device) +
                          ", the backend runs on " + device_name(ctx.device()));
  }
}

}  // namespace

Act TokenEmbedding::forward(LayerContext& ctx, const IndexTensor& tokens) {
  check_tokens(name_, tokens, max_seq_len_, ctx);
  Act out = ctx.make(Shape{tokens.shape[0], tokens.shape[1], hidden_}, ctx.dtype,
                     Category::kActivation, name_);
  if (positions_) {
    ctx.backend.embedding_forward(ctx.stream, tokens, wte_.weight.view(), wpe_.weight.view(),
                                  out->view());
  } else {
    ctx.backend.embedding_forward(ctx.stream, tokens, wte_.weight.view(), out->view());
  }
  return out;
}

void TokenEmbedding::backward(LayerContext& ctx, const IndexTensor& tokens, const Act& dx) {
  check_tokens(name_, tokens, max_seq_len_, ctx);
  layers::check_grad("TokenEmbedding", name_, dx, Shape{tokens.shape[0], tokens.shape[1], hidden_},
                     ctx);
  if (positions_) {
    ctx.backend.embedding_backward(ctx.stream, dx->view(), tokens, wte_.grad.view(),
                                   wpe_.grad.view());
  } else {
    ctx.backend.embedding_backward(ctx.stream, dx->view(), tokens, wte_.grad.view());
  }
}

void TokenEmbedding::allocate(const ParamAlloc& a) {
  for (Parameter* p : parameters()) {
    if (!p->placed) allocate_parameter(*p, a);
  }
}

LayerCost TokenEmbedding::cost(std::int64_t seq_len, DType dtype) const {
  LayerCost c;  // a gather and an add per element: no GEMM flops, nothing saved
  c.output_bytes = layers::nbytes(layers::mul(seq_len, hidden_), dtype);
  return c;
}

}  // namespace memfit
