// LossScaler: GradScaler's defaults and rules, option checks, saturation, state round trip;
// grads_nonfinite on real gradients.
#include "policies/loss_scaler.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <string>

#include "core/cpu/cpu_backend.h"
#include "memory/error.h"
#include "tests/policies/param_testutil.h"

namespace memfit {
namespace {

using testing::ParamSet;

template <typename F>
void expect_invalid(F&& f, const char* field) {
  try {
    f();
    ADD_FAILURE() << "no InvalidArgument for " << field;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(LossScaler, GradScalerDefaults) {
  LossScaler s;
  EXPECT_TRUE(s.enabled());
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.options().growth_interval, 2000);
  for (int i = 0; i < 1999; ++i) ASSERT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 65536.0);  // 1999 clean steps: not yet
  EXPECT_EQ(s.state().growth_tracker, 1999);
  EXPECT_FALSE(s.update(false));  // the 2000th
  EXPECT_EQ(s.scale_used(), 65536.0);
  EXPECT_EQ(s.scale(), 131072.0);
  EXPECT_EQ(s.state().growth_tracker, 0);
  // inf: skip, halve, count restarts.
  for (int i = 0; i < 10; ++i) s.update(false);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale_used(), 131072.0);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.state().growth_tracker, 0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 32768.0);
}

TEST(LossScaler, ConfigurableRules) {
  LossScalerOptions o;
  o.init_scale = 8;
  o.growth_factor = 3;
  o.backoff_factor = 0.25;
  o.growth_interval = 2;
  LossScaler s(o);
  s.update(false);
  EXPECT_EQ(s.scale(), 8.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 24.0);
  s.update(false);
  EXPECT_TRUE(s.update(true));  // resets the count half-way
  EXPECT_EQ(s.scale(), 6.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 6.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 18.0);
}

TEST(LossScaler, DisabledScalesByOneButStillSkips) {
  LossScalerOptions o;
  o.enabled = false;
  LossScaler s(o);
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));
  for (int i = 0; i < 3000; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_EQ(s.scale_used(), 1.0);
}

TEST(LossScaler, OptionsValidated) {
  auto make = [](auto edit) {
    LossScalerOptions o;
    edit(o);
    LossScaler s(o);
  };
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_invalid([&] { make([](auto& o) { o.init_scale = 0; }); }, "init_scale");
  expect_invalid([&] { make([](auto& o) { o.init_scale = -1; }); }, "init_scale");
  expect_invalid([&] { make([&](auto& o) { o.init_scale = inf; }); }, "init_scale");
  expect_invalid([&] { make([&](auto& o) { o.init_scale = nan; }); }, "init_scale");
  expect_invalid([&] { make([](auto& o) { o.init_scale = 1e39; }); }, "init_scale");
  expect_invalid([&] { make([](auto& o) { o.growth_factor = 1; }); }, "growth_factor");
  expect_invalid([&] { make([&](auto& o) { o.growth_factor = nan; }); }, "growth_factor");
  expect_invalid([&] { make([](auto& o) { o.backoff_factor = 1; }); }, "backoff_factor");
  expect_invalid([&] { make([](auto& o) { o.backoff_factor = 0; }); }, "backoff_factor");
  expect_invalid([&] { make([&](auto& o) { o.backoff_factor = nan; }); }, "backoff_factor");
  expect_invalid([&] { make([](auto& o) { o.growth_interval = 0; }); }, "growth_interval");
}

TEST(LossScaler, ScaleSaturatesAtFloatRange) {
  LossScalerOptions o;
  o.init_scale = FLT_MAX / 1.5;
  o.growth_interval = 1;
  LossScaler up(o);
  up.update(false);
  EXPECT_EQ(up.scale(), static_cast<double>(FLT_MAX));
  up.update(false);
  EXPECT_EQ(up.scale(), static_cast<double>(FLT_MAX));
  o.init_scale = FLT_MIN * 1.5;
  LossScaler down(o);
  down.update(true);
  EXPECT_EQ(down.scale(), static_cast<double>(FLT_MIN));
  down.update(true);
  EXPECT_EQ(down.scale(), static_cast<double>(FLT_MIN));
  EXPECT_TRUE(std::isfinite(static_cast<float>(up.scale())));
}

TEST(LossScaler, StateRoundTrip) {
  LossScaler a;
  for (int i = 0; i < 2500; ++i) a.update(i == 100);
  const LossScalerState st = a.state();
  EXPECT_EQ(st.scale, 65536.0);  // halved at step 100, doubled 2000 clean steps later
  EXPECT_EQ(st.growth_tracker, 2500 - 101 - 2000);
  LossScaler b;
  b.set_state(st);
  EXPECT_EQ(b.state(), st);
  EXPECT_EQ(b.scale(), a.scale());
  for (int i = 0; i < 3000; ++i) ASSERT_EQ(a.update(i % 777 == 5), b.update(i % 777 == 5));
  EXPECT_EQ(a.state(), b.state());
  expect_invalid([&] { b.set_state({0.0, 0}); }, "scale");
  expect_invalid([&] { b.set_state({std::numeric_limits<double>::infinity(), 0}); }, "scale");
  expect_invalid([&] { b.set_state({2.0, -1}); }, "growth_tracker");
  EXPECT_EQ(b.state(), a.state());  // a refused state changes nothing
}

TEST(GradsNonfinite, FindsInfAndNaNOnly) {
  CpuBackend be;
  ParamSet ps(be, DType::kBF16, {{"w", {300, 7}}, {"b", {7}}, {"big", {70000}}});
  LayerContext ctx = ps.ctx();
  ps.fill_grads(1.0f);
  EXPECT_FALSE(grads_nonfinite(ctx, ps.list()));
  ps.grad_ptr(2)[69999] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(grads_nonfinite(ctx, ps.list()));
  ps.grad_ptr(2)[69999] = 0.0f;
  ps.grad_ptr(1)[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(grads_nonfinite(ctx, ps.list()));
  ps.grad_ptr(1)[3] = 0.0f;
  ps.grad_ptr(0)[0] = 3e38f;  // finite, though its square overflows the f32 sum
  EXPECT_FALSE(grads_nonfinite(ctx, ps.list()));
  EXPECT_FALSE(grads_nonfinite(ctx, {}));
}

}  // namespace
}  // namespace memfit
