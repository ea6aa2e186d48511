// The CUDA path: what runs on a GPU (bf16 autocast, fused attention, the multi-tensor AdamW, the
// parameter hash) against the CPU's fp32 results. Without a usable GPU every test here is skipped,
// and CTest lists it as skipped (tests/CMakeLists.txt), not passed: bench/gpu.sh runs them on a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <torch/version.h>

#include <vector>

#include "loco/algorithms/flat_buffer.h"
#include "loco/model/precision.h"
#include "loco/model/transformer.h"
#include "loco/optim/adamw.h"

namespace loco {
namespace {

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU usable with this LibTorch";
  }
};

model::ModelOptions small(model::NormKind norm, model::PositionKind position, model::MlpKind mlp, bool qk_norm) {
  model::ModelOptions o;
  o.vocab_size = 256;
  o.context = 64;
  o.layers = 2;
  o.width = 128;
  o.heads = 4;  // head size 32: the fused (flash) attention kernels take it
  o.mlp_ratio = 4.0;
  o.norm = norm;
  o.position = position;
  o.mlp = mlp;
  o.qk_norm = qk_norm;
  return o;
}

double cosine(const torch::Tensor& a, const torch::Tensor& b) {
  auto x = a.to(torch::kCPU, torch::kFloat64).flatten(), y = b.to(torch::kCPU, torch::kFloat64).flatten();
  return (x.dot(y) / (x.norm() * y.norm() + 1e-30)).item<double>();
}

TEST_F(Cuda, ABf16ForwardAndBackwardOnTheGpuMatchFp32OnTheCpu) {
  const torch::Device gpu(torch::kCUDA);
  for (const auto& o : {small(model::NormKind::kRMSNorm, model::PositionKind::kRope, model::MlpKind::kGelu, false),
                        small(model::NormKind::kLayerNorm, model::PositionKind::kLearned, model::MlpKind::kSwiGlu, true)}) {
    SCOPED_TRACE(fmt::format("{}/{}/{}", to_string(o.norm), to_string(o.position), to_string(o.mlp)));
    model::Transformer on_cpu(o, 21), on_gpu(o, 21);
    on_gpu->to(gpu);
    auto tokens = torch::randint(0, o.vocab_size, {4, o.context + 1}, torch::TensorOptions().dtype(torch::kInt64));
    auto inputs = tokens.narrow(1, 0, o.context), targets = tokens.narrow(1, 1, o.context);

    auto cpu_loss = model::language_model_loss(on_cpu->forward(inputs), targets, 0.0).cross_entropy;
    torch::Tensor gpu_loss;
    {
      model::AutocastGuard autocast(gpu, true);
      ASSERT_TRUE(autocast.active());
      auto logits = on_gpu->forward(inputs.to(gpu));
      EXPECT_EQ(logits.scalar_type(), torch::kBFloat16) << "the head's matmul runs in bf16 under autocast";
      gpu_loss = model::language_model_loss(logits, targets.to(gpu), 0.0).cross_entropy;
    }
    EXPECT_EQ(gpu_loss.scalar_type(), torch::kFloat32);
    EXPECT_NEAR(gpu_loss.item<double>(), cpu_loss.item<double>(), 0.02);

    {
      model::AutocastGuard autocast(gpu, true);
      torch::NoGradGuard no_grad;
      EXPECT_NEAR(on_gpu->loss(inputs.to(gpu), targets.to(gpu), 0.0).cross_entropy.item<double>(), cpu_loss.item<double>(), 0.02)
          << "the fused head and loss that training uses";
    }
    cpu_loss.backward();
    gpu_loss.backward();
    auto cpu_params = on_cpu->named_parameters(), gpu_params = on_gpu->named_parameters();
    ASSERT_EQ(cpu_params.size(), gpu_params.size());
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      const auto& g = gpu_params[i].value();
      EXPECT_TRUE(g.is_cuda());
      EXPECT_EQ(g.grad().scalar_type(), torch::kFloat32) << "fp32 master weights get fp32 gradients";
      EXPECT_GT(cosine(cpu_params[i].value().grad(), g.grad()), 0.99) << cpu_params[i].key();
    }
  }
}

TEST_F(Cuda, TheAdamWOnTheGpuTakesTheCpusSteps) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> shapes{torch::randn({64, 32}), torch::randn({32}), torch::randn({7, 5, 3})};
  std::vector<optim::NamedParameter> cpu, gpu;
  for (size_t i = 0; i < shapes.size(); ++i) {
    cpu.push_back({"p" + std::to_string(i), shapes[i].clone().requires_grad_(), i != 1});
    gpu.push_back({"p" + std::to_string(i), shapes[i].to(torch::kCUDA).requires_grad_(), i != 1});
  }
  optim::AdamW on_cpu(cpu, {}), on_gpu(gpu, {});
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  EXPECT_TRUE(on_gpu.skips_on_device()) << "LibTorch " << TORCH_VERSION << " has the fused AdamW";
#endif
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto grad = torch::randn_like(shapes[i]);
      if (step == 2 && i == 2) continue;  // a parameter without a gradient this step is left alone
      cpu[i].tensor.mutable_grad() = grad;
      gpu[i].tensor.mutable_grad() = grad.to(torch::kCUDA);
    }
    on_cpu.step(1e-2);
    on_gpu.step(1e-2);
    on_cpu.zero_grad();
    on_gpu.zero_grad();
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_TRUE(torch::allclose(gpu[i].tensor.cpu(), cpu[i].tensor, 1e-5, 1e-6)) << "parameter " << i;
    EXPECT_FALSE(torch::equal(cpu[i].tensor, shapes[i])) << "parameter " << i << " moved";
  }
  const auto cpu_state = on_cpu.state(), gpu_state = on_gpu.state();
  for (size_t i = 0; i < cpu_state.size(); ++i) {
    EXPECT_TRUE(torch::allclose(gpu_state[i].second.cpu(), cpu_state[i].second, 1e-5, 1e-7)) << cpu_state[i].first;
  }
}

// A step whose loss or gradient norm is not finite is skipped by the GPU itself (the skip flag),
// so that training need not read each step's loss before the next.
TEST_F(Cuda, AFlaggedStepIsSkippedOnTheGpu) {
  auto p = torch::randn({40, 3}, torch::kCUDA).requires_grad_();
  optim::AdamW adamw({{"p", p, true}}, {});
  if (!adamw.skips_on_device()) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fused AdamW: steps are read first";
  const auto before = p.detach().clone();
  p.mutable_grad() = torch::full_like(p, NAN);
  adamw.step(1e-2, torch::ones({}, torch::TensorOptions().device(torch::kCUDA)));
  EXPECT_TRUE(torch::equal(p.detach(), before)) << "a flagged step leaves the parameters";
  for (const auto& [name, moment] : adamw.state()) EXPECT_EQ(moment.abs().sum().item<double>(), 0.0) << name;
  p.mutable_grad() = torch::randn_like(p);
  adamw.step(1e-2, torch::zeros({}, torch::TensorOptions().device(torch::kCUDA)));
  EXPECT_FALSE(torch::equal(p.detach(), before)) << "an unflagged step moves them";
  EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
}

// The fused head and loss (linear_cross_entropy) in bf16 autocast on the GPU against float32 on
// the CPU, in one chunk and in several.
TEST_F(Cuda, TheFusedHeadAndLossInBf16MatchFp32OnTheCpu) {
  const torch::Device gpu(torch::kCUDA);
  torch::manual_seed(4);
  const auto hidden0 = torch::randn({4, 64, 128}), weight0 = torch::randn({1000, 128}) * 0.05;
  auto targets = torch::randint(0, 1000, {4, 64}, torch::kInt64);
  targets[1][3] = -100;
  auto h_cpu = hidden0.clone().requires_grad_(), w_cpu = weight0.clone().requires_grad_();
  auto ref = model::linear_cross_entropy(h_cpu, w_cpu, targets, 1e-3);
  ref.loss.backward();
  for (int64_t chunk : {0, 100}) {
    SCOPED_TRACE(fmt::format("chunk {}", chunk));
    auto h = hidden0.to(gpu).requires_grad_(), w = weight0.to(gpu).requires_grad_();
    model::LossParts parts;
    {
      model::AutocastGuard autocast(gpu, true);
      parts = model::linear_cross_entropy(h, w, targets.to(gpu), 1e-3, chunk);
    }
    EXPECT_EQ(parts.loss.scalar_type(), torch::kFloat32);
    EXPECT_NEAR(parts.loss.item<double>(), ref.loss.item<double>(), 0.02);
    parts.loss.backward();
    EXPECT_EQ(h.grad().scalar_type(), torch::kFloat32);
    EXPECT_GT(cosine(h.grad(), h_cpu.grad()), 0.99);
    EXPECT_GT(cosine(w.grad(), w_cpu.grad()), 0.99);
  }
}

TEST_F(Cuda, TheHashOfATensorOnTheGpuIsTheHashOfItsValues) {
  auto t = torch::randn({1000});
  EXPECT_EQ(algorithms::hash_tensors({t.to(torch::kCUDA)}), algorithms::hash_tensors({t}));
  EXPECT_NE(algorithms::hash_tensors({(t + 1).to(torch::kCUDA)}), algorithms::hash_tensors({t}));
}

TEST_F(Cuda, TrainingInBf16OnTheGpuLearnsABatch) {
  const torch::Device gpu(torch::kCUDA);
  const auto o = small(model::NormKind::kRMSNorm, model::PositionKind::kRope, model::MlpKind::kGelu, false);
  model::Transformer net(o, 5);
  net->to(gpu);
  std::vector<optim::NamedParameter> named;
  for (const auto& p : net->named_parameters()) named.push_back({p.key(), p.value(), p.value().dim() >= 2});
  optim::AdamW adamw(named, {});
  auto tokens = torch::randint(0, o.vocab_size, {8, o.context + 1}, torch::TensorOptions().dtype(torch::kInt64)).to(gpu);
  auto inputs = tokens.narrow(1, 0, o.context), targets = tokens.narrow(1, 1, o.context);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    adamw.zero_grad();
    torch::Tensor loss;
    {
      model::AutocastGuard autocast(gpu, true);
      loss = net->loss(inputs, targets, 0.0).loss;  // the fused head and loss, as training runs
    }
    loss.backward();
    optim::clip_grad_norm([&] {
      std::vector<torch::Tensor> v;
      for (const auto& p : named) v.push_back(p.tensor);
      return v;
    }(), 1.0);
    adamw.step(3e-3);
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, first / 2) << "from " << first << " to " << last;
}

}  // namespace
}  // namespace loco
