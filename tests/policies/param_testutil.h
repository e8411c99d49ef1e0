// Parameters built by hand for the policy tests (weight in the compute dtype, FP32 master when
// that is not f32, FP32 gradient), on a CPU backend, with deterministic contents.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/dtype.h"
#include "core/layer.h"
#include "core/parameter.h"
#include "memory/caching_allocator.h"
#include "memory/host_provider.h"

namespace memfit::testing {

struct ParamSpec {
  std::string name;
  Shape shape;
};

class ParamSet {
 public:
  ParamSet(Backend& be, DType compute, const std::vector<ParamSpec>& specs, unsigned seed = 1)
      : be_(be), compute_(compute), alloc_(host_, {}, &be.stream_sync()) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.02f);
    for (const ParamSpec& s : specs) {
      auto p = std::make_unique<Parameter>();
      p->name = s.name;
      p->shape = s.shape;
      p->weight = OwnedTensor::empty(alloc_, s.shape, compute, Device::kCpu, Category::kParameter,
                                     kDefaultStream, s.name);
      p->grad = OwnedTensor::empty(alloc_, s.shape, DType::kF32, Device::kCpu, Category::kGradient,
                                   kDefaultStream, s.name);
      const std::size_t n = static_cast<std::size_t>(s.shape.numel());
      std::vector<float> init(n);
      for (float& v : init) v = nd(rng);
      if (compute != DType::kF32) {
        p->master = OwnedTensor::empty(alloc_, s.shape, DType::kF32, Device::kCpu,
                                       Category::kOptimizerState, kDefaultStream, s.name);
        if (n) std::memcpy(p->master.view().raw(), init.data(), 4 * n);
      }
      if (n) convert(init.data(), DType::kF32, p->weight.view().raw(), compute, n);
      if (n) std::memset(p->grad.view().raw(), 0, 4 * n);
      params_.push_back(std::move(p));
    }
  }

  LayerContext ctx() { return LayerContext{be_, alloc_, kDefaultStream, compute_}; }
  std::vector<Parameter*> list() const {
    std::vector<Parameter*> out;
    for (const auto& p : params_) out.push_back(p.get());
    return out;
  }
  Parameter& operator[](std::size_t i) { return *params_[i]; }
  std::size_t size() const { return params_.size(); }
  float* grad_ptr(std::size_t i) { return static_cast<float*>(params_[i]->grad.view().raw()); }
  void fill_grads(float v) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      float* g = grad_ptr(i);
      for (std::int64_t j = 0; j < params_[i]->numel(); ++j) g[j] = v;
    }
  }
  // Gradients for step `step`: the same values for any ParamSet with the same shapes.
  void set_step_grads(int step, float scale = 1.0f) {
    std::mt19937 rng(1000u + static_cast<unsigned>(step));
    std::normal_distribution<float> nd(0.0f, scale);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      float* g = grad_ptr(i);
      for (std::int64_t j = 0; j < params_[i]->numel(); ++j) g[j] = nd(rng);
    }
  }
  // The working weights' bytes, for bit comparisons.
  std::vector<unsigned char> weight_bytes(std::size_t i) const {
    const Tensor& w = params_[i]->weight.view();
    const auto* b = static_cast<const unsigned char*>(w.raw());
    return std::vector<unsigned char>(b, b + w.nbytes());
  }
  CachingAllocator& alloc() { return alloc_; }

 private:
  Backend& be_;
  DType compute_;
  HostProvider host_;
  CachingAllocator alloc_;
  std::vector<std::unique_ptr<Parameter>> params_;
};

}  // namespace memfit::testing
