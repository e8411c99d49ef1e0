#include "core/layers/residual.h"

#include "memory/check.h"
#include "memory/error.h"

namespace memfit {

Residual::Residual(std::string name, std::unique_ptr<Layer> inner)
    : Layer(std::move(name)), inner_(std::move(inner)) {
  if (!inner_) {
    throw InvalidArgument("Residual '" + this->name() + "': inner layer is null");
  }
}

namespace {

// a + b into whichever operand we hold alone (use_count 1: no layer saved it), else a new one.
Act add_into_owned(LayerContext& ctx, const Act& owned_candidate, const Act& other,
                   Category category, const std::string& tag) {
  if (owned_candidate.use_count() == 1 && owned_candidate->view().dtype() == ctx.dtype) {
    ctx.backend.add(ctx.stream, owned_candidate->view(), other->view(), owned_candidate->view());
    return owned_candidate;
  }
  Act out = ctx.make(other->view().shape(), ctx.dtype, category, tag);
  ctx.backend.add(ctx.stream, owned_candidate->view(), other->view(), out->view());
  return out;
}

}  // namespace

Act Residual::forward(LayerContext& ctx, const Act& x, bool save) {
  MEMFIT_CHECK(!has_saved()) << "Residual '" << name() << "': forward while holding saved state";
  Act h = inner_->forward(ctx, x, save);
  if (!h || h->view().shape() != x->view().shape()) {
    if (save) inner_->release_saved();
    throw InvalidArgument("Residual '" + name() + "': inner layer '" + inner_->name() +
                          "' maps " + x->view().shape().str() + " to " +
                          (h ? h->view().shape().str() : std::string("nothing")) +
                          "; a residual needs the input's shape");
  }
  return add_into_owned(ctx, h, x, Category::kActivation, name());
}

Act Residual::backward(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "Residual '" << name() << "': backward without a saved forward";
  Act d = inner_->backward(ctx, dy);
  return add_into_owned(ctx, d, dy, Category::kTemporary, name());
}

}  // namespace memfit
