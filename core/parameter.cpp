#include "core/parameter.h"

#include "memory/caching_allocator.h"
#include "memory/check.h"
#include "memory/error.h"

namespace memfit {

Tensor Parameter::master_view() const {
  if (master_on_device()) {
    MEMFIT_CHECK(master.view().dtype() == DType::kF32)
        << "parameter " << name << ": master is " << dtype_name(master.view().dtype());
    return master.view();
  }
  // With f32 compute the weight is its own master; a low-precision weight whose master was
  // offloaded has no device master to give.
  MEMFIT_CHECK(weight.view().dtype() == DType::kF32 && weight.view().defined())
      << "parameter " << name << ": no f32 master on the device (weight is "
      << dtype_name(weight.view().dtype()) << ", master " << (master_on_device() ? "" : "not ")
      << "present)";
  return weight.view();
}

void allocate_parameter(Parameter& p, const ParamAlloc& a) {
  if (p.name.empty()) {
    throw InvalidArgument("allocate_parameter: the parameter of shape " + p.shape.str() +
                          " has an empty name; every parameter needs a unique name");
  }
  p.placed = true;
  if (a.placement.weight) {
    p.weight = OwnedTensor::empty(a.alloc, p.shape, a.compute, a.device, Category::kParameter,
                                  a.stream, p.name);
  } else {
    p.weight.reset();
  }
  if (a.compute != DType::kF32 && a.placement.master) {
    p.master = OwnedTensor::empty(a.alloc, p.shape, DType::kF32, a.device,
                                  Category::kOptimizerState, a.stream, p.name);
  } else {
    p.master.reset();
  }
  if (a.placement.grad) {
    p.grad = OwnedTensor::empty(a.alloc, p.shape, DType::kF32, a.device, Category::kGradient,
                                a.stream, p.name);
  } else {
    p.grad.reset();
  }
}

}  // namespace memfit
