// Reading the MFGOLDEN files that scripts/make_gpt_golden.py and scripts/make_conv_golden.py
// write (PyTorch reference data; the layout is in those scripts' docstrings):
//   "MFGOLDEN", u32 version (1), u32 count, then per entry: u32 name length, name,
//   u32 dtype (0 f32, 1 i32), u32 ndim, i64 dims[ndim], the elements.
//
//   auto g = testing::read_golden(testing::golden_data_path("conv_golden.bin"));
//   ASSERT_FALSE(g.empty());            // a missing or malformed file already ADD_FAILUREd
//   const std::vector<float>& x = g.at("case0/inp").f;
//   testing::load_golden_params(g, model, ctx);    // every param/<name> into the model
//   GoldenErrors e = testing::golden_compare(mine, g.at("logits").f, 1e-6, 1e-5, "logits");
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace memfit {
class Model;
struct LayerContext;
}  // namespace memfit

namespace memfit::testing {

struct GoldenEntry {
  std::uint32_t dtype = 0;  // 0 f32, 1 i32
  std::vector<std::int64_t> dims;
  std::vector<float> f;         // dtype 0
  std::vector<std::int32_t> i;  // dtype 1
};

// tests/core/data/<file> in the source tree ($MEMFIT_SOURCE_DIR when set).
std::string golden_data_path(const std::string& file);

// The whole file by entry name; ADD_FAILURE and an empty map when the file is missing or any
// byte is malformed (names over 4096 bytes, more than 8 dims or 2^24 elements count as such).
std::map<std::string, GoldenEntry> read_golden(const std::string& path);

struct GoldenErrors {
  double worst_ratio = 0;  // max over elements of |a-b| / tolerance
  double max_abs = 0;
};
// Compares a to b (the reference) with |a-b| <= atol + rtol |b|, ADD_FAILURE for the first
// three elements over it; returns the worst ratio to the tolerance.
GoldenErrors golden_compare(const std::vector<float>& a, const std::vector<float>& b, double atol,
                            double rtol, const std::string& what);

// The files hold options as f32; torch ran with the Python doubles they came from (1e-3, 0.9,
// ...), which are the shortest decimals of those floats: that double.
double golden_double(float v);

// Loads every param/<name> of `g` into the model's FP32 masters; the file must hold exactly the
// model's parameters with the model's shapes (ADD_FAILURE otherwise).
void load_golden_params(const std::map<std::string, GoldenEntry>& g, Model& m, LayerContext& ctx);

}  // namespace memfit::testing
