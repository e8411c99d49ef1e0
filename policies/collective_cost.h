// The time a data-parallel rank spends in its collectives per step, for the planner's
// predicted step time (policies/planner.h) under RunSpec::ranks > 1.
//
//   const Collectives c = collective_cost(run, DeviceSpec::preset("h100-80g"));
//   c.bytes, c.seconds     // what one rank sends per step, and at the device's rank_link
//
// Bytes one rank sends per step, P parameters, N ranks, w the working weights' dtype size,
// K micro-batches (memfit's collectives, core/comm: a reduce-scatter sends N-1 of N chunks, an
// all-gather the same, an all-reduce is the two; NCCL's ring moves the same bytes):
//   ZeRO-0: the gradients' all-reduce, 2 (N-1)/N x 4P
//   ZeRO-1: the last micro-batch's reduce-scatter, (N-1)/N x 4P, and the updated weights'
//           all-gather, (N-1)/N x wP
//   ZeRO-2: a reduce-scatter in every micro-batch, K (N-1)/N x 4P, and the all-gather
// Seconds: bytes / device.rank_link (one direction; every rank sends and receives at once),
// taken as not hidden behind compute (collectives run on the computing thread today). None for
// one rank or an unknown rank_link (0).
#pragma once

#include "policies/device_spec.h"
#include "policies/run_spec.h"

namespace memfit {

struct Collectives {
  double bytes = 0;    // sent by one rank per step
  double seconds = 0;  // at device.rank_link; 0 when unknown
};
Collectives collective_cost(const RunSpec& run, const DeviceSpec& device);

}  // namespace memfit
