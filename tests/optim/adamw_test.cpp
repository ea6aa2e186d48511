#include <gtest/gtest.h>
#include <torch/torch.h>  // torch::optim, the reference

#include "loco/core/error.h"
#include "loco/optim/adamw.h"

namespace loco::optim {
namespace {

// Same quadratic-ish problem for both optimizers: minimize sum((W x - y)^2) + |b|^2.
torch::Tensor loss_of(const torch::Tensor& w, const torch::Tensor& b, int step) {
  auto gen_x = torch::arange(12, torch::kFloat32).view({4, 3}) * 0.1 * (step % 3 + 1);
  return (torch::matmul(gen_x, w) - 1.0).pow(2).sum() + b.pow(2).sum();
}

TEST(AdamW, MatchesLibtorchAdamW) {
  torch::manual_seed(0);
  auto w0 = torch::randn({3, 5}), b0 = torch::randn({5});
  auto w1 = w0.clone().requires_grad_(true), b1 = b0.clone().requires_grad_(true);
  auto w2 = w0.clone().requires_grad_(true), b2 = b0.clone().requires_grad_(true);

  AdamWOptions options;
  options.beta1 = 0.9;
  options.beta2 = 0.95;
  options.eps = 1e-8;
  options.weight_decay = 0.1;
  AdamW ours({{"w", w1, true}, {"b", b1, true}}, options);
  torch::optim::AdamW reference({w2, b2}, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));

  for (int step = 0; step < 20; ++step) {
    const double lr = 1e-2;  // the reference keeps its own lr
    ours.zero_grad();
    loss_of(w1, b1, step).backward();
    ours.step(lr);
    reference.zero_grad();
    loss_of(w2, b2, step).backward();
    reference.step();
  }
  EXPECT_TRUE(torch::allclose(w1, w2, 1e-6, 1e-7)) << (w1 - w2).abs().max().item<float>();
  EXPECT_TRUE(torch::allclose(b1, b2, 1e-6, 1e-7));
  EXPECT_FALSE(torch::allclose(w1, w0)) << "the parameters must have moved";
  EXPECT_EQ(ours.steps(), 20);
}

TEST(AdamW, DecayOnlyWhereFlagged) {
  auto a = torch::ones({2}).requires_grad_(true), b = torch::ones({2}).requires_grad_(true);
  AdamWOptions options;
  options.weight_decay = 0.5;
  AdamW opt({{"a", a, true}, {"b", b, false}}, options);
  a.mutable_grad() = torch::zeros({2});
  b.mutable_grad() = torch::zeros({2});
  opt.step(0.1);
  // Zero gradient: only decoupled decay moves a parameter: a *= 1 - lr * wd = 0.95.
  EXPECT_TRUE(torch::allclose(a, torch::full({2}, 0.95f)));
  EXPECT_TRUE(torch::equal(b, torch::ones({2})));
}

TEST(AdamW, StateRoundTripContinuesIdentically) {
  auto make = [] { return torch::arange(6, torch::kFloat32).view({2, 3}).requires_grad_(true); };
  auto p1 = make(), p2 = make();
  AdamW a({{"p", p1, true}}, {}), b({{"p", p2, true}}, {});
  for (int s = 0; s < 5; ++s) {
    a.zero_grad();
    p1.pow(3).sum().backward();
    a.step(1e-2);
  }
  {
    torch::NoGradGuard ng;
    p2.copy_(p1);
  }
  b.load_state(a.state(), a.steps());
  for (int s = 0; s < 5; ++s) {
    a.zero_grad();
    p1.pow(3).sum().backward();
    a.step(1e-2);
    b.zero_grad();
    p2.pow(3).sum().backward();
    b.step(1e-2);
  }
  EXPECT_TRUE(torch::equal(p1, p2));
}

TEST(AdamW, LoadStateRejectsMissingOrMisshapenEntries) {
  auto p = torch::zeros({2, 2}).requires_grad_(true);
  AdamW opt({{"p", p, true}}, {});
  EXPECT_THROW(opt.load_state({{"p.exp_avg", torch::zeros({2, 2})}}, 1), DataError);
  EXPECT_THROW(opt.load_state({{"p.exp_avg", torch::zeros({3})}, {"p.exp_avg_sq", torch::zeros({2, 2})}}, 1), DataError);
}

TEST(AdamW, OptionsValidated) {
  AdamWOptions o;
  o.beta2 = 1.0;
  EXPECT_THROW(o.validate(), ConfigError);
}

TEST(ClipGradNorm, ScalesToMaxNormAndReportsTheNormBefore) {
  auto a = torch::zeros({2}).requires_grad_(true), b = torch::zeros({1}).requires_grad_(true);
  a.mutable_grad() = torch::tensor({3.0f, 0.0f});
  b.mutable_grad() = torch::tensor({4.0f});
  EXPECT_NEAR(clip_grad_norm({a, b}, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(torch::cat({a.grad(), b.grad()}).norm().item<double>(), 1.0, 1e-5);
  EXPECT_NEAR(clip_grad_norm({a, b}, 0.0), 1.0, 1e-5);  // 0: report only
}

}  // namespace
// The clipping that training uses reads nothing back: the norm stays a tensor, and gradients
// under the limit are left exactly as they were.
TEST(ClipGradients, ReturnsTheNormOnTheDeviceAndScalesOnlyPastTheLimit) {
  auto a = torch::zeros({2}, torch::requires_grad()), b = torch::zeros({1}, torch::requires_grad());
  EXPECT_FALSE(clip_gradients({a, b}, 1.0).defined()) << "no gradient, no norm";
  a.mutable_grad() = torch::tensor({0.3f, 0.4f});
  b.mutable_grad() = torch::tensor({0.0f});
  const auto under = clip_gradients({a, b}, 1.0);
  EXPECT_EQ(under.dim(), 0);
  EXPECT_NEAR(under.item<double>(), 0.5, 1e-6);
  EXPECT_TRUE(torch::equal(a.grad(), torch::tensor({0.3f, 0.4f})));
  a.mutable_grad() = torch::tensor({3.0f, 4.0f});
  EXPECT_NEAR(clip_gradients({a, b}, 1.0).item<double>(), 5.0, 1e-6);
  EXPECT_NEAR(a.grad().norm().item<double>(), 1.0, 1e-5);
}

TEST(AdamW, OnTheCpuItNeitherSkipsNorNeedsTo) {
  auto p = torch::ones({3}, torch::requires_grad());
  AdamW adamw({{"p", p, true}}, {});
  EXPECT_FALSE(adamw.skips_on_device()) << "the caller reads the loss first on a CPU";
  p.mutable_grad() = torch::ones({3});
  adamw.step(0.1, torch::ones({}));  // the skip flag is for the device path only
  EXPECT_FALSE(torch::equal(p, torch::ones({3})));
}

}  // namespace loco::optim
