// Golden parity with PyTorch: loco's model (loss and gradients), AdamW step, outer Nesterov step and
// Streaming DiLoCo merge against what PyTorch computed for the same inputs
// (tests/golden/fixtures, written by scripts/golden.py: the model from its equations in float64,
// the optimizers by torch.optim.AdamW and torch.optim.SGD(nesterov=True)). Every tensor must agree
// to 1e-5 relative (‖loco − torch‖ / ‖torch‖).
#include <gtest/gtest.h>

#include "loco/algorithms/streaming.h"
#include "loco/model/transformer.h"
#include "loco/optim/adamw.h"
#include "loco/optim/outer.h"
#include "loco/runtime/store/safetensors.h"

namespace loco {
namespace {

namespace fs = std::filesystem;
constexpr double kTolerance = 1e-5;

struct Fixture {
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, std::string> metadata;
  const torch::Tensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw std::runtime_error("the fixture has no tensor " + name);
    return it->second;
  }
  double number(const std::string& key) const { return std::stod(metadata.at(key)); }
};

Fixture load(const std::string& name) {
  const auto file = runtime::load_safetensors(fs::path(LOCO_SOURCE_DIR) / "tests" / "golden" / "fixtures" / (name + ".safetensors"));
  Fixture f;
  for (const auto& [key, tensor] : file.tensors) f.tensors[key] = tensor;
  f.metadata = file.metadata;
  return f;
}

double relative_error(const torch::Tensor& ours, const torch::Tensor& theirs) {
  auto a = ours.detach().to(torch::kFloat64), b = theirs.to(torch::kFloat64);
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
}

model::ModelOptions options_of(const Fixture& f) {
  model::ModelOptions o;
  o.vocab_size = static_cast<int64_t>(f.number("vocab"));
  o.context = static_cast<int64_t>(f.number("context"));
  o.layers = static_cast<int64_t>(f.number("layers"));
  o.width = static_cast<int64_t>(f.number("width"));
  o.heads = static_cast<int64_t>(f.number("heads"));
  o.mlp_ratio = f.number("mlp_ratio");
  o.norm_eps = f.number("eps");
  o.rope_base = f.number("rope_base");
  o.norm = f.metadata.at("norm") == "rmsnorm" ? model::NormKind::kRMSNorm : model::NormKind::kLayerNorm;
  o.position = f.metadata.at("position") == "rope" ? model::PositionKind::kRope : model::PositionKind::kLearned;
  o.mlp = f.metadata.at("mlp") == "gelu" ? model::MlpKind::kGelu : model::MlpKind::kSwiGlu;
  o.qk_norm = f.metadata.at("qk_norm") == "True";
  if (f.metadata.count("architecture") && f.metadata.at("architecture") == "llama") {
    o.kv_heads = static_cast<int64_t>(f.number("kv_heads"));
    o.mlp_hidden_size = static_cast<int64_t>(f.number("mlp_hidden"));
    o.attention_bias = true;
    o.tie_embeddings = false;
  }
  return o;
}

class GoldenModel : public testing::TestWithParam<std::string> {};

TEST_P(GoldenModel, LossAndGradientsMatchPyTorch) {
  const auto f = load(GetParam());
  model::Transformer model(options_of(f), 7);
  int64_t loaded = 0;
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      item.value().copy_(f.at("param." + item.key()));
      ++loaded;
    }
  }
  int64_t fixture_params = 0;
  for (const auto& [key, _] : f.tensors) fixture_params += key.starts_with("param.") ? 1 : 0;
  ASSERT_EQ(loaded, fixture_params) << "loco's parameters and the fixture's differ in number";

  auto logits = model->forward(f.at("tokens"));
  auto parts = model::language_model_loss(logits, f.at("targets"), f.number("z_loss"));
  parts.loss.backward();
  EXPECT_LT(relative_error(parts.loss, f.at("loss")[0]), kTolerance) << parts.loss.item<double>() << " vs " << f.at("loss")[0].item<double>();
  EXPECT_LT(relative_error(parts.cross_entropy, f.at("cross_entropy")[0]), kTolerance);
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_LT(relative_error(item.value().grad(), f.at("grad." + item.key())), kTolerance) << item.key();
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, GoldenModel,
                         testing::Values("model_rmsnorm_rope_gelu", "model_layernorm_learned_swiglu_qknorm",
                                         "model_llama_gqa_bias_untied"),
                         [](const auto& info) { return info.param.substr(6); });

TEST(Golden, AdamWStepsMatchTorchOptimAdamW) {
  const auto f = load("adamw");
  auto matrix = f.at("matrix").clone().requires_grad_(true);
  auto vector = f.at("vector").clone().requires_grad_(true);
  optim::AdamWOptions o{f.number("beta1"), f.number("beta2"), f.number("eps"), f.number("weight_decay")};
  optim::AdamW adamw({{"matrix", matrix, true}, {"vector", vector, false}}, o);
  const auto lrs = f.at("lr");
  for (int64_t i = 0; i < lrs.size(0); ++i) {
    matrix.mutable_grad() = f.at(fmt::format("matrix.grad.{}", i)).clone();
    vector.mutable_grad() = f.at(fmt::format("vector.grad.{}", i)).clone();
    adamw.step(lrs[i].item<double>());
  }
  EXPECT_LT(relative_error(matrix, f.at("matrix.after")), kTolerance);
  EXPECT_LT(relative_error(vector, f.at("vector.after")), kTolerance);
}

TEST(Golden, OuterNesterovMatchesTorchSgdNesterov) {
  const auto f = load("nesterov");
  auto theta = f.at("theta").clone();
  optim::OuterOptions o = optim::default_outer_options(optim::OuterKind::kNesterov);
  o.lr = f.number("lr");
  o.momentum = f.number("momentum");
  optim::OuterOptimizer outer({"theta"}, {theta}, o);
  for (int i = 0; i < 3; ++i) outer.step({f.at(fmt::format("delta.{}", i))});
  EXPECT_LT(relative_error(theta, f.at("theta.after")), kTolerance);
}

// One worker, one fragment, H = 2, τ = 1, α from the fixture: the model is set to θ_m(2) before the
// step where the sync starts and to θ_m(3) before the step where it lands.
TEST(Golden, StreamingMergeMatchesPyTorch) {
  const auto f = load("merge");
  model::ModelOptions tiny;
  tiny.vocab_size = 4;
  tiny.context = 2;
  tiny.layers = 1;
  tiny.width = 2;
  tiny.heads = 1;
  model::Transformer model(tiny, 3);
  // The fixture's 10 values are spread over the model's first parameters; the rest stay as they are.
  auto place = [&](const torch::Tensor& values) {
    torch::NoGradGuard no_grad;
    int64_t at = 0;
    for (auto& p : model->parameters()) {
      const int64_t n = std::min(p.numel(), values.numel() - at);
      if (n <= 0) break;
      p.view(-1).narrow(0, 0, n).copy_(values.narrow(0, at, n));
      at += n;
    }
  };
  auto gather = [&](const std::vector<torch::Tensor>& tensors) {
    std::vector<torch::Tensor> flat;
    for (const auto& t : tensors) flat.push_back(t.detach().reshape(-1));
    return torch::cat(flat).narrow(0, 0, f.at("theta").numel());
  };
  place(f.at("theta"));
  algorithms::StreamingOptions o;
  o.inner_steps = 2;
  o.total_steps = 10;
  o.fragments = 1;
  o.overlap_steps = 1;
  o.merge_alpha = f.number("alpha");
  o.outer.lr = f.number("lr");
  o.outer.momentum = f.number("momentum");
  algorithms::StreamingDiLoCo sync(comm::Group::single(), o);
  sync.on_start(model, 0);
  algorithms::StepContext context{0, 8, &model};
  EXPECT_TRUE(sync.after_step(context).empty());
  place(f.at("model.at_start"));
  context.step = 1;
  EXPECT_TRUE(sync.after_step(context).empty());  // step 2: the sync starts
  place(f.at("model.at_merge"));
  context.step = 2;
  ASSERT_EQ(sync.after_step(context).size(), 1u);  // step 3: it lands, and the merge
  EXPECT_LT(relative_error(gather(*sync.evaluation_parameters()), f.at("theta.after")), kTolerance);
  EXPECT_LT(relative_error(gather(model->parameters()), f.at("model.after")), kTolerance);
}

}  // namespace
}  // namespace loco
