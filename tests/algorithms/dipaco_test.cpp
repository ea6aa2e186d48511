// DiPaCo's outer step per module: a module shared by paths receives exactly the weighted average of
// their outer gradients rescaled by sqrt(paths), a path-specific module its own, and the module's
// outer optimizer applies it (closed forms on known tensors); bad reports are refused by name.
#include <gtest/gtest.h>

#include <cmath>

#include "loco/algorithms/dipaco.h"
#include "loco/core/error.h"
#include "loco/model/paths.h"
#include "test_util.h"

namespace loco::algorithms {
namespace {

using testing_util::expect_error;

torch::Tensor t(std::vector<float> values, std::vector<int64_t> shape) {
  return torch::tensor(values).reshape(shape);
}

TEST(DipacoTest, ASharedModuleGetsTheWeightedRescaledAverage) {
  // Paths 0 and 2 through one module (weights 1 and 3: their shard sizes), two tensors each.
  const std::vector<PathReport> reports{
      {0, 1.0, {t({1, 2, 3, 4}, {2, 2}), t({8}, {1})}},
      {2, 3.0, {t({5, 6, 7, 8}, {2, 2}), t({-4}, {1})}},
  };
  const auto delta = module_outer_gradient(reports);
  ASSERT_EQ(delta.size(), 2u);
  const double r = std::sqrt(2.0);
  // (1 * x + 3 * y) / 4 * sqrt(2)
  EXPECT_TRUE(torch::allclose(delta[0], t({4, 5, 6, 7}, {2, 2}) * r, 1e-6, 0)) << delta[0];
  EXPECT_TRUE(torch::allclose(delta[1], t({-1}, {1}) * r, 1e-6, 0)) << delta[1];
  EXPECT_EQ(delta[0].scalar_type(), torch::kFloat32);
}

// dipaco.outer_rescale = false: the plain weighted average, and the module's step takes it.
TEST(DipacoTest, WithoutTheRescaleAModuleGetsThePlainWeightedAverage) {
  const std::vector<PathReport> reports{{0, 1.0, {t({1, 2}, {2})}}, {1, 3.0, {t({5, 6}, {2})}}};
  EXPECT_TRUE(torch::allclose(module_outer_gradient(reports, false)[0], t({4, 5}, {2}), 1e-6, 0)) << "(1 x + 3 y) / 4";
  EXPECT_TRUE(torch::allclose(module_outer_gradient(reports, true)[0], t({4, 5}, {2}) * std::sqrt(2.0), 1e-6, 0));
  ModuleState plain("L1.M0", {"w"}, {torch::zeros({2})}, optim::default_outer_options(optim::OuterKind::kSgd));
  plain.step(reports, false);
  EXPECT_TRUE(torch::allclose(plain.parameters()[0], -t({4, 5}, {2}), 1e-6, 0)) << "SGD with lr 1: θ − Δ";
}

TEST(DipacoTest, APathSpecificModuleGetsItsOwnOuterGradient) {
  const auto delta = module_outer_gradient({{5, 123.0, {t({0.5, -0.25}, {2})}}});
  EXPECT_TRUE(torch::equal(delta[0], t({0.5, -0.25}, {2})));
}

// Over a 2x2 plan: each module's step takes the reports of exactly the paths through it, and the
// modules step independently (their versions count their own phases).
TEST(DipacoTest, ModulesStepFromThePathsThroughThem) {
  model::ModelOptions options;
  options.layers = 2;
  model::PathOptions levels;
  levels.levels = model::PathOptions::parse_levels("1:2,1:2");
  const model::PathPlan plan(options, levels);
  // Path p's outer gradient is p + 1 everywhere; weights all 1 (equal shards).
  optim::OuterOptions sgd = optim::default_outer_options(optim::OuterKind::kSgd);  // θ ← θ − Δ
  for (const auto& module : plan.modules()) {
    ModuleState state(module.name, {"w"}, {torch::zeros({3})}, sgd);
    std::vector<PathReport> reports;
    for (int64_t p : module.paths) reports.push_back({p, 1.0, {torch::full({3}, static_cast<float>(p + 1))}});
    state.step(reports);
    double mean = 0;
    for (int64_t p : module.paths) mean += static_cast<double>(p + 1) / static_cast<double>(module.paths.size());
    const double expected = -mean * std::sqrt(static_cast<double>(module.paths.size()));
    EXPECT_NEAR(state.parameters()[0][0].item<double>(), expected, 1e-5) << module.name;
    EXPECT_EQ(state.version(), 1) << module.name;
  }
  // L1.M1 is on paths 2 and 3: Δ = sqrt(2) * 3.5.
  EXPECT_EQ(plan.module(plan.find("L1.M1")).paths, (std::vector<int64_t>{2, 3}));
}

TEST(DipacoTest, NesterovAppliesTheModuleOuterGradient) {
  const optim::OuterOptions nesterov = optim::default_outer_options(optim::OuterKind::kNesterov);  // η 0.7, μ 0.9
  ModuleState state("L1.M0", {"w"}, {torch::ones({2})}, nesterov);
  state.step({{0, 2.0, {torch::full({2}, 0.1f)}}, {1, 2.0, {torch::full({2}, 0.3f)}}});
  // Δ = sqrt(2) * 0.2; v = Δ; θ = 1 − 0.7 (Δ + 0.9 v) = 1 − 0.7 * 1.9 * Δ
  const double delta = std::sqrt(2.0) * 0.2;
  EXPECT_NEAR(state.parameters()[0][1].item<double>(), 1 - 0.7 * 1.9 * delta, 1e-6);
}

TEST(DipacoTest, BadReportsAreRefused) {
  expect_error<DataError>([] { module_outer_gradient({}); }, "needs at least one path");
  expect_error<DataError>([] { module_outer_gradient({{1, 1.0, {torch::ones({2})}}, {1, 1.0, {torch::ones({2})}}}); },
                          "path 1 reported twice");
  expect_error<DataError>([] { module_outer_gradient({{0, 0.0, {torch::ones({2})}}}); }, "path 0 reported weight 0");
  expect_error<DataError>([] { module_outer_gradient({{0, NAN, {torch::ones({2})}}}); }, "positive and finite");
  expect_error<DataError>([] { module_outer_gradient({{0, 1.0, {torch::ones({2})}}, {1, 1.0, {torch::ones({3})}}}); },
                          "path 1 reported tensor 0 of shape [3]");
  ModuleState state("L2.M1", {"w"}, {torch::ones({2})}, optim::default_outer_options(optim::OuterKind::kSgd));
  expect_error<DataError>([&] { state.step({{0, 1.0, {torch::ones({4})}}}); }, "module L2.M1: tensor 0 reported with shape [4]");
  EXPECT_EQ(state.version(), 0);
}

// Screening over the paths through a module (docs/failure-model.md): a path's outer gradient with a
// value that is not finite is left out by default, one 100x the others' norm with sync.reject_ratio,
// and each is clipped with sync.clip_norm; the kept ones' weights renormalize and the rescale counts
// only them. What screening did comes back, naming the path.
TEST(DipacoTest, ScreeningLeavesOutAPathsHarmfulOuterGradient) {
  const std::vector<PathReport> clean{{0, 1.0, {t({1, 1}, {2})}}, {1, 1.0, {t({2, 2}, {2})}}, {2, 2.0, {t({3, 3}, {2})}}};
  auto with_nan = clean;
  with_nan.push_back({3, 1.0, {t({NAN, 1}, {2})}});
  ScreenedSync screened;
  const auto kept = module_outer_gradient(with_nan, true, Screening{}, &screened);
  EXPECT_TRUE(torch::allclose(kept[0], module_outer_gradient(clean)[0], 1e-6, 0)) << kept[0];
  EXPECT_EQ(screened.rejected, 1);
  EXPECT_EQ(screened.kept, 3);
  EXPECT_NE(screened.why.find("path 3: not finite"), std::string::npos) << screened.why;

  auto far = clean;
  far.push_back({7, 1.0, {t({200, 200}, {2})}});
  const auto harmed = module_outer_gradient(far, true, Screening{});
  EXPECT_GT(harmed[0][0].item<float>(), 50) << "unscreened, path 7 moves the module by a fifth of its 200, times sqrt(4)";
  const auto screened_far = module_outer_gradient(far, true, Screening{10, 0}, &screened);
  EXPECT_TRUE(torch::allclose(screened_far[0], module_outer_gradient(clean)[0], 1e-6, 0)) << screened_far[0];
  EXPECT_NE(screened.why.find("path 7: norm"), std::string::npos) << screened.why;

  // Clipped to norm 1: path 2's (3, 3) enters as (3, 3) / sqrt(18).
  const auto clipped = module_outer_gradient(clean, false, Screening{0, 1}, &screened);
  const double a = 1 / std::sqrt(2.0), b = 2 / std::sqrt(8.0), c = 3 / std::sqrt(18.0);
  EXPECT_NEAR(clipped[0][0].item<float>(), (a + b + 2 * c) / 4, 1e-6);
  EXPECT_EQ(screened.rejected, 0);

  expect_error<DataError>([] { module_outer_gradient({{0, 1.0, {t({NAN}, {1})}}}); }, "every outer gradient of the module's step was left out");
  ModuleState state("L2.M1", {"w"}, {torch::ones({2})}, optim::default_outer_options(optim::OuterKind::kSgd));
  state.step(with_nan);
  EXPECT_TRUE(torch::isfinite(state.parameters()[0]).all().item<bool>()) << "the module's copy stays finite";
}

}  // namespace
}  // namespace loco::algorithms
