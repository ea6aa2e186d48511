#include <gtest/gtest.h>
#include <torch/torch.h>

#include "loco/core/error.h"
#include "loco/optim/delayed_nesterov.h"
#include "loco/optim/outer.h"

namespace loco::optim {
namespace {

// The paper's update (Liu et al. 2024, Algorithm 3) written out in doubles, one value at a time:
// the reference the tensor version must follow.
struct ScalarDelayedNesterov {
  double theta, m = 0, pending = 0, lr, beta;
  int64_t n, t = 0;
  void step(double g) {
    ++t;
    pending += g;
    if (t % n == 0) {
      m = beta * m + pending / static_cast<double>(n);
      theta -= lr * (g / static_cast<double>(n) + beta * m);
      pending = 0;
    } else {
      theta -= lr * g / static_cast<double>(n);
    }
  }
};

TEST(DelayedNesterov, FollowsThePapersUpdateArrivalByArrival) {
  const double lr = 0.7, beta = 0.9;
  for (const int64_t n : {1, 3, 4}) {
    auto theta = torch::tensor({1.0f, -2.0f, 0.5f});
    DelayedNesterov outer(theta, lr, beta, n);
    std::vector<ScalarDelayedNesterov> reference;
    for (int i = 0; i < 3; ++i) reference.push_back({theta[i].item<double>(), 0, 0, lr, beta, n});
    auto gen = torch::make_generator<at::CPUGeneratorImpl>(7);
    for (int arrival = 0; arrival < 11; ++arrival) {
      const auto g = torch::randn({3}, gen);
      outer.step(g);
      for (int i = 0; i < 3; ++i) reference[i].step(g[i].item<double>());
      for (int i = 0; i < 3; ++i) EXPECT_NEAR(theta[i].item<double>(), reference[i].theta, 1e-5) << "N " << n << " arrival " << arrival;
    }
    EXPECT_EQ(outer.arrivals(), 11);
  }
}

// With N = 1 every arrival moves the momentum: synchronous DiLoCo's Nesterov (outer.h) step by step.
TEST(DelayedNesterov, WithADelayOfOneItIsNesterov) {
  auto a = torch::tensor({1.0f, 2.0f});
  auto b = a.clone();
  DelayedNesterov delayed(a, 0.7, 0.9, 1);
  OuterOptimizer nesterov({"w"}, {b}, default_outer_options(OuterKind::kNesterov));
  for (const auto& g : {torch::tensor({0.5f, -1.0f}), torch::tensor({0.1f, 0.2f}), torch::tensor({-0.3f, 0.0f})}) {
    delayed.step(g);
    nesterov.step({g});
    EXPECT_TRUE(torch::allclose(a, b, 1e-6, 1e-6));
  }
}

// Over N arrivals θ moves as one Nesterov step on their mean (from zero momentum: the first N).
TEST(DelayedNesterov, NArrivalsMoveThetaAsOneStepOnTheirMean) {
  auto a = torch::tensor({1.0f, 2.0f});
  auto b = a.clone();
  DelayedNesterov delayed(a, 0.7, 0.9, 2);
  OuterOptimizer nesterov({"w"}, {b}, default_outer_options(OuterKind::kNesterov));
  const auto g1 = torch::tensor({0.4f, -1.0f}), g2 = torch::tensor({0.2f, 0.6f});
  delayed.step(g1);
  delayed.step(g2);
  nesterov.step({(g1 + g2) / 2});
  EXPECT_TRUE(torch::allclose(a, b, 1e-6, 1e-6));
}

TEST(DelayedNesterov, StateRoundTripsAndIsChecked) {
  auto a = torch::tensor({1.0f, 2.0f});
  DelayedNesterov first(a, 0.7, 0.9, 3);
  first.step(torch::tensor({0.5f, 0.5f}));
  auto b = a.clone();
  DelayedNesterov second(b, 0.7, 0.9, 3);
  second.load_state(first.state());
  for (int i = 0; i < 4; ++i) {
    first.step(torch::tensor({0.1f, -0.2f}));
    second.step(torch::tensor({0.1f, -0.2f}));
  }
  EXPECT_TRUE(torch::equal(a, b));
  auto state = first.state();
  state.pop_back();
  EXPECT_THROW(second.load_state(state), DataError);
  state = first.state();
  state[0].second = torch::zeros({3});
  EXPECT_THROW(second.load_state(state), DataError);
}

}  // namespace
}  // namespace loco::optim
