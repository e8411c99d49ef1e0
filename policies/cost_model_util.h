// Internal to CostModel (cost_model.cpp, cost_model_calibrate.cpp): helpers both halves use.
// Not part of the public API.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/layer.h"
#include "core/model.h"
#include "core/model_spec.h"

namespace memfit::costmodel {

// a * b, InvalidArgument naming `what` on int64 overflow.
std::int64_t mul(std::int64_t a, std::int64_t b, const char* what);

// spec.validate(), then InvalidArgument unless 1 <= seq_len <= spec.seq_len.
void check_seq_len(const ModelSpec& spec, std::int64_t seq_len);

// Parameter counts of a built model: per block, the embedding's, those the head reads (a tied
// wte included) and the total (each parameter once).
void read_structure(Model& m, std::vector<std::int64_t>& block_params,
                    std::int64_t& embedding_params, std::int64_t& head_read_params,
                    std::int64_t& params);

// {forward, backward} transient peaks beyond what stays, per sample (PeakExcess for the
// built-in blocks; a user's block's workspace_bytes for both).
std::array<std::int64_t, 2> excess_of(Layer& block, std::int64_t seq_len, DType dt);

}  // namespace memfit::costmodel
