#include <gtest/gtest.h>
#include <torch/torch.h>  // torch::optim, the reference

#include "loco/core/error.h"
#include "loco/optim/outer.h"

namespace loco::optim {
namespace {

OuterOptions options_of(OuterKind kind, double lr, double momentum) {
  OuterOptions o = default_outer_options(kind);
  o.lr = lr;
  o.momentum = momentum;
  return o;
}

// Nesterov on known tensors against its closed form, two steps by hand:
//   v1 = Δ1;            θ1 = θ0 − η (Δ1 + μ v1)
//   v2 = μ v1 + Δ2;     θ2 = θ1 − η (Δ2 + μ v2)
TEST(OuterOptimizer, NesterovMatchesItsClosedForm) {
  const double eta = 0.7, mu = 0.9;
  auto theta = torch::tensor({1.0f, 2.0f});
  OuterOptimizer outer({"w"}, {theta}, options_of(OuterKind::kNesterov, eta, mu));
  const double d1[] = {0.5, -1.0}, d2[] = {0.1, 0.2};
  outer.step({torch::tensor({0.5f, -1.0f})});
  outer.step({torch::tensor({0.1f, 0.2f})});
  for (int i = 0; i < 2; ++i) {
    const double theta0 = i == 0 ? 1.0 : 2.0;
    const double v1 = d1[i];
    const double theta1 = theta0 - eta * (d1[i] + mu * v1);
    const double v2 = mu * v1 + d2[i];
    const double theta2 = theta1 - eta * (d2[i] + mu * v2);
    EXPECT_NEAR(theta[i].item<double>(), theta2, 1e-6) << "element " << i;
  }
  EXPECT_NEAR(theta[0].item<double>(), -0.0815, 1e-6);  // the same, worked out by hand
  EXPECT_NEAR(theta[1].item<double>(), 3.631, 1e-6);
  EXPECT_EQ(outer.steps(), 2);
}

// SGD with lr 1 and no momentum is FedAvg: θ becomes the mean of the workers' parameters.
// With a momentum warm-up of 2 steps, Nesterov's μ is 0.45 at the first outer step and 0.9 from
// the second on; the closed form with those μ, and a restored state continuing the ramp.
TEST(OuterOptimizer, MomentumWarmupRampsMuLinearly) {
  const double eta = 0.7, mu = 0.9;
  auto options = options_of(OuterKind::kNesterov, eta, mu);
  options.momentum_warmup = 2;
  auto theta = torch::tensor({1.0f});
  OuterOptimizer outer({"w"}, {theta}, options);
  const double d[] = {0.5, 0.1, -0.3};
  double expected = 1.0, v = 0;
  auto closed_form = [&](int t) {  // outer step t + 1
    const double mu_t = mu * std::min(1.0, (t + 1) / 2.0);
    v = mu_t * v + d[t];
    expected -= eta * (d[t] + mu_t * v);
  };
  for (int t = 0; t < 2; ++t) {
    outer.step({torch::tensor({static_cast<float>(d[t])})});
    closed_form(t);
    EXPECT_NEAR(theta[0].item<double>(), expected, 1e-6) << "step " << t + 1;
  }
  // Resumed from the state after two steps, the ramp goes on where it was.
  auto copy = theta.clone();
  OuterOptimizer resumed({"w"}, {copy}, options);
  resumed.load_state(outer.state());
  outer.step({torch::tensor({static_cast<float>(d[2])})});
  resumed.step({torch::tensor({static_cast<float>(d[2])})});
  closed_form(2);
  EXPECT_NEAR(theta[0].item<double>(), expected, 1e-6) << "step 3";
  EXPECT_TRUE(torch::equal(theta, copy));
  options.momentum_warmup = -1;
  EXPECT_THROW(options.validate(), ConfigError);
}

TEST(OuterOptimizer, SgdWithLrOneIsFederatedAveraging) {
  auto theta = torch::tensor({0.5f, -1.0f, 3.0f});
  auto worker_a = torch::tensor({0.75f, -0.5f, 2.0f}), worker_b = torch::tensor({0.25f, -1.0f, 5.0f});
  auto delta = ((theta - worker_a) + (theta - worker_b)) / 2;
  OuterOptimizer outer({"w"}, {theta}, default_outer_options(OuterKind::kSgd));
  EXPECT_EQ(outer.options().lr, 1.0);
  EXPECT_EQ(outer.options().momentum, 0.0);
  outer.step({delta});
  EXPECT_TRUE(torch::allclose(theta, (worker_a + worker_b) / 2));
  // No momentum, no state but the step count.
  EXPECT_EQ(outer.state().size(), 1u);
}

// Given the average θ̄ itself, FedAvg lands on it exactly, where θ − fl(θ − θ̄) need not.
TEST(OuterOptimizer, FedAvgToTheAverageIsExact) {
  auto theta = torch::tensor({1.0f, 3.0f, -0.5f});
  auto average = torch::tensor({-std::ldexp(1.0f, -30), 1e-9f, 0.25f});
  auto via_delta = theta - (theta - average);
  EXPECT_FALSE(torch::equal(via_delta, average)) << "the subtraction route rounds (that is the point of this test)";
  OuterOptimizer outer({"w"}, {theta}, default_outer_options(OuterKind::kSgd));
  outer.step_to_average({average});
  EXPECT_TRUE(torch::equal(theta, average));
  // With another lr, or momentum, it is the ordinary step on Δ = θ − θ̄.
  auto a = torch::tensor({1.0f, 2.0f}), b = a.clone(), avg = torch::tensor({0.5f, 2.5f});
  OuterOptimizer by_average({"w"}, {a}, default_outer_options(OuterKind::kNesterov));
  OuterOptimizer by_delta({"w"}, {b}, default_outer_options(OuterKind::kNesterov));
  by_average.step_to_average({avg});
  by_delta.step({b - avg});
  EXPECT_TRUE(torch::equal(a, b));
}

TEST(OuterOptimizer, HeavyBallSgd) {
  auto theta = torch::tensor({1.0f});
  OuterOptimizer outer({"w"}, {theta}, options_of(OuterKind::kSgd, 0.5, 0.5));
  outer.step({torch::tensor({1.0f})});  // v = 1, θ = 1 − 0.5
  outer.step({torch::tensor({1.0f})});  // v = 1.5, θ = 0.5 − 0.75
  EXPECT_NEAR(theta.item<double>(), -0.25, 1e-7);
}

TEST(OuterOptimizer, AdamMatchesLibtorchAdamOnTheOuterGradient) {
  torch::manual_seed(3);
  auto theta = torch::randn({4, 3});
  auto reference = theta.clone().requires_grad_(true);
  OuterOptions o = default_outer_options(OuterKind::kAdam);
  EXPECT_DOUBLE_EQ(o.eps, 0.1) << "the DiLoCo paper's stable outer Adam";
  o.lr = 0.01;
  o.beta2 = 0.99;
  OuterOptimizer outer({"w"}, {theta}, o);
  torch::optim::Adam adam({reference}, torch::optim::AdamOptions(0.01).betas({0.9, 0.99}).eps(0.1));
  for (int step = 0; step < 5; ++step) {
    auto delta = torch::randn({4, 3});
    outer.step({delta});
    reference.mutable_grad() = delta.clone();
    adam.step();
  }
  EXPECT_TRUE(torch::allclose(theta, reference.detach(), 1e-6, 1e-7));
}

TEST(OuterOptimizer, StateRoundTripContinuesExactly) {
  for (auto kind : {OuterKind::kNesterov, OuterKind::kAdam}) {
    auto a = torch::tensor({1.0f, -2.0f}), b = a.clone();
    OuterOptimizer first({"w"}, {a}, default_outer_options(kind));
    first.step({torch::tensor({0.3f, 0.1f})});
    OuterOptimizer second({"w"}, {b}, default_outer_options(kind));
    b.copy_(a);
    second.load_state(first.state());
    EXPECT_EQ(second.steps(), 1);
    first.step({torch::tensor({-0.2f, 0.4f})});
    second.step({torch::tensor({-0.2f, 0.4f})});
    EXPECT_TRUE(torch::equal(a, b)) << to_string(kind);
  }
}

TEST(OuterOptimizer, BadStateAndOptionsAreRefused) {
  auto theta = torch::zeros({2});
  OuterOptimizer nesterov({"w"}, {theta}, default_outer_options(OuterKind::kNesterov));
  EXPECT_THROW(nesterov.load_state({{"steps", torch::tensor(int64_t{1})}}), DataError);
  EXPECT_THROW(nesterov.load_state({{"w.momentum", torch::zeros({3})}, {"steps", torch::tensor(int64_t{1})}}), DataError);
  OuterOptions bad;
  bad.lr = 0;
  EXPECT_THROW(bad.validate(), ConfigError);
  bad = OuterOptions{};
  bad.momentum = 1.0;
  EXPECT_THROW(bad.validate(), ConfigError);
}

}  // namespace
}  // namespace loco::optim
