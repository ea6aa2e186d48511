#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "loco/core/error.h"
#include "loco/model/transformer.h"

namespace loco::model {
namespace {

ModelOptions tiny(NormKind norm = NormKind::kRMSNorm, PositionKind position = PositionKind::kRope,
                  MlpKind mlp = MlpKind::kGelu, bool qk_norm = false) {
  ModelOptions o;
  o.vocab_size = 97;
  o.context = 16;
  o.layers = 2;
  o.width = 32;
  o.heads = 4;
  o.mlp_ratio = 2.0;
  o.norm = norm;
  o.position = position;
  o.mlp = mlp;
  o.qk_norm = qk_norm;
  return o;
}

std::vector<ModelOptions> all_variants() {
  std::vector<ModelOptions> out;
  for (auto norm : {NormKind::kRMSNorm, NormKind::kLayerNorm})
    for (auto pos : {PositionKind::kRope, PositionKind::kLearned})
      for (auto mlp : {MlpKind::kGelu, MlpKind::kSwiGlu})
        for (bool qk : {false, true}) out.push_back(tiny(norm, pos, mlp, qk));
  return out;
}

std::string describe(const ModelOptions& o) {
  return fmt::format("{}/{}/{}/qk_norm={}", to_string(o.norm), to_string(o.position), to_string(o.mlp), o.qk_norm);
}

TEST(Transformer, ParameterCountMatchesClosedForm) {
  for (const auto& o : all_variants()) {
    Transformer model(o, 1);
    int64_t counted = 0;
    for (const auto& p : model->parameters()) counted += p.numel();
    EXPECT_EQ(counted, parameter_count(o)) << describe(o);
  }
  // One case by hand: V=97, d=32, 2 blocks, hidden 64, RMSNorm, RoPE, GELU.
  //   embed 97*32 = 3104; block = 2*32 (norms) + 4*32*32 (attention) + 2*32*64 (MLP) = 8256; final norm 32.
  EXPECT_EQ(parameter_count(tiny()), 3104 + 2 * 8256 + 32);
  // The Llama options: 2 key/value heads of 4 (keys and values 2*8 rows each), q/k/v biases, a
  // hidden width of 48, an untied head.
  auto llama = tiny(NormKind::kRMSNorm, PositionKind::kRope, MlpKind::kSwiGlu);
  llama.kv_heads = 2;
  llama.attention_bias = true;
  llama.mlp_hidden_size = 48;
  llama.tie_embeddings = false;
  Transformer model(llama, 1);
  int64_t counted = 0;
  for (const auto& p : model->parameters()) counted += p.numel();
  //   block = 2*32 + (32+16+16)*32 + (32+16+16) (q/k/v and biases) + 32*32 (output) + 3*32*48 (MLP) = 7808
  EXPECT_EQ(counted, 3104 + 2 * 7808 + 32 + 97 * 32);
  EXPECT_EQ(parameter_count(llama), counted);
}

// Grouped-query attention: each key/value head serves heads / kv_heads query heads in a row, as
// Llama's repeat_kv does. A model with 2 key/value heads computes what a model with 4 does when
// its keys and values of heads 2j and 2j+1 are both those of head j.
TEST(Transformer, GroupedQueryAttentionSharesEachKeyValueHeadWithItsQueryHeads) {
  auto grouped = tiny(NormKind::kRMSNorm, PositionKind::kRope, MlpKind::kSwiGlu);
  grouped.kv_heads = 2;
  grouped.attention_bias = true;
  auto full = grouped;
  full.kv_heads = 0;
  Transformer a(grouped, 7), b(full, 8);
  torch::NoGradGuard no_grad;
  for (const auto& item : a->named_parameters()) {
    if (item.key().ends_with(".bias")) EXPECT_EQ(item.value().abs().sum().item<float>(), 0.0f) << "biases start at 0";
  }
  a->named_parameters()["blocks.0.attn.qkv.bias"].normal_();  // biases count too
  const int64_t hd = grouped.head_dim(), d = grouped.width;
  for (const auto& item : a->named_parameters()) {
    torch::Tensor into = b->named_parameters()[item.key()];  // a handle on b's parameter
    if (!item.key().ends_with("attn.qkv.weight") && !item.key().ends_with("attn.qkv.bias")) {
      into.copy_(item.value());
      continue;
    }
    auto from = item.value();  // rows: q (4 heads), k (2 heads), v (2 heads)
    auto q = from.narrow(0, 0, d), k = from.narrow(0, d, 2 * hd), v = from.narrow(0, d + 2 * hd, 2 * hd);
    auto spread = [&](const torch::Tensor& t) {  // head j's rows for heads 2j and 2j+1
      return torch::cat({t.narrow(0, 0, hd), t.narrow(0, 0, hd), t.narrow(0, hd, hd), t.narrow(0, hd, hd)});
    };
    into.copy_(torch::cat({q, spread(k), spread(v)}));
  }
  auto tokens = torch::randint(0, grouped.vocab_size, {2, 12}, torch::kInt64);
  EXPECT_TRUE(torch::allclose(a->forward(tokens), b->forward(tokens), 1e-5, 1e-5));
}

// An untied head is a matrix of its own, in the "head" group: the logits are the final hidden
// states times it, and the token embedding only reads tokens in.
TEST(Transformer, AnUntiedHeadIsAMatrixOfItsOwnInTheHeadGroup) {
  auto o = tiny(NormKind::kRMSNorm, PositionKind::kRope, MlpKind::kSwiGlu);
  o.tie_embeddings = false;
  Transformer model(o, 3);
  ASSERT_TRUE(model->lm_head);
  EXPECT_EQ(model->parameter_groups().back().names, (std::vector<std::string>{"final_norm.rms.weight", "lm_head.weight"}));
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(0, o.vocab_size, {2, 8}, torch::kInt64);
  auto expected = torch::matmul(model->hidden(tokens), model->lm_head->weight.t());
  EXPECT_TRUE(torch::allclose(model->forward(tokens), expected, 1e-5, 1e-5));
  EXPECT_FALSE(torch::equal(model->lm_head->weight, model->tok_emb->weight));
}

TEST(Transformer, IsCausal) {
  for (const auto& o : all_variants()) {
    Transformer model(o, 7);
    model->eval();
    torch::NoGradGuard no_grad;
    auto tokens = torch::randint(0, o.vocab_size, {2, o.context}, torch::kInt64);
    auto base = model->forward(tokens);  // (B, T, V)
    for (int64_t t : {0L, 5L, o.context - 1}) {
      auto changed = tokens.clone();
      changed.index_put_({torch::indexing::Slice(), t}, (tokens.index({torch::indexing::Slice(), t}) + 1) % o.vocab_size);
      auto out = model->forward(changed);
      if (t > 0) {
        EXPECT_TRUE(torch::equal(out.narrow(1, 0, t), base.narrow(1, 0, t))) << describe(o) << " t=" << t;
      }
      // The changed position itself must matter, or the test proves nothing.
      EXPECT_FALSE(torch::allclose(out.narrow(1, t, 1), base.narrow(1, t, 1))) << describe(o) << " t=" << t;
    }
  }
}

TEST(Transformer, InitialLossIsNearLogVocab) {
  ModelOptions o = tiny();
  o.vocab_size = 512;
  o.width = 64;
  Transformer model(o, 3);
  torch::NoGradGuard no_grad;
  auto generator_tokens = torch::randint(0, o.vocab_size, {8, o.context + 1}, torch::kInt64);
  auto logits = model->forward(generator_tokens.narrow(1, 0, o.context));
  auto loss = language_model_loss(logits, generator_tokens.narrow(1, 1, o.context), 0.0).cross_entropy.item<double>();
  EXPECT_NEAR(loss, std::log(512.0), 0.1);
}

TEST(Transformer, TinyModelOverfitsTinyBatch) {
  ModelOptions o = tiny();
  Transformer model(o, 11);
  auto tokens = torch::randint(0, o.vocab_size, {4, o.context + 1}, torch::kInt64);
  auto inputs = tokens.narrow(1, 0, o.context), targets = tokens.narrow(1, 1, o.context);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-2));
  double first = 0, last = 0;
  for (int i = 0; i < 150; ++i) {
    adam.zero_grad();
    auto loss = language_model_loss(model->forward(inputs), targets, 0.0).loss;
    loss.backward();
    adam.step();
    if (i == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  EXPECT_GT(first, 4.0);
  EXPECT_LT(last, 0.1) << "a 2-block model should memorize 64 random tokens";
}

TEST(Transformer, SameSeedSameWeightsDifferentSeedDifferent) {
  Transformer a(tiny(), 5), b(tiny(), 5), c(tiny(), 6);
  auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  bool any_different = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i], pb[i]));
    if (pa[i].dim() >= 2 && !torch::equal(pa[i], pc[i])) any_different = true;
  }
  EXPECT_TRUE(any_different);
}

TEST(Transformer, ParameterGroupsPartitionTheParameters) {
  ModelOptions o = tiny(NormKind::kLayerNorm, PositionKind::kLearned, MlpKind::kSwiGlu, true);
  o.layers = 4;
  Transformer model(o, 1);
  auto groups = model->parameter_groups();
  ASSERT_EQ(groups.size(), 6u);
  EXPECT_EQ(groups.front().name, "embed");
  EXPECT_EQ(groups[3].name, "block.2");
  EXPECT_EQ(groups.back().name, "head");
  std::set<const void*> seen;
  size_t total = 0;
  for (const auto& g : groups) {
    ASSERT_EQ(g.names.size(), g.parameters.size());
    for (size_t i = 0; i < g.names.size(); ++i) {
      EXPECT_TRUE(seen.insert(g.parameters[i].data_ptr()).second) << g.names[i] << " is in two groups";
      if (g.name.starts_with("block.")) EXPECT_TRUE(g.names[i].starts_with("blocks." + g.name.substr(6) + ".")) << g.names[i];
    }
    total += g.parameters.size();
  }
  EXPECT_EQ(total, model->parameters().size());
  EXPECT_EQ(groups.front().names, (std::vector<std::string>{"tok_emb.weight", "pos_emb.weight"}));

  // A strided fragment {0, 2}: exactly the parameters of blocks 0 and 2, aliasing the live tensors.
  auto fragment = model->block_parameters({0, 2});
  EXPECT_EQ(fragment.size(), groups[1].parameters.size() + groups[3].parameters.size());
  EXPECT_EQ(fragment.front().data_ptr(), groups[1].parameters.front().data_ptr());
  EXPECT_EQ(model->non_block_parameters().size(), groups.front().parameters.size() + groups.back().parameters.size());
  EXPECT_THROW(model->block_parameters({4}), InternalError);
}

TEST(Transformer, OptionsAreValidated) {
  ModelOptions o = tiny();
  o.heads = 5;
  EXPECT_THROW(o.validate(), ConfigError);
  o = tiny();
  o.width = 36;
  o.heads = 4;  // head_dim 9: odd, RoPE impossible
  EXPECT_THROW(o.validate(), ConfigError);
  o.position = PositionKind::kLearned;
  EXPECT_NO_THROW(o.validate());
  o = tiny();
  o.kv_heads = 3;  // does not divide 4 heads
  EXPECT_THROW(o.validate(), ConfigError);
  o.kv_heads = 2;
  EXPECT_NO_THROW(o.validate());
  o = tiny();
  o.vocab_size = 2;
  EXPECT_THROW(Transformer(o, 1), ConfigError);
}

TEST(Loss, ZLossAddsMeanSquaredLogPartition) {
  auto logits = torch::randn({2, 3, 11});
  auto targets = torch::randint(0, 11, {2, 3}, torch::kInt64);
  auto plain = language_model_loss(logits, targets, 0.0);
  auto with_z = language_model_loss(logits, targets, 1e-2);
  const double z = torch::logsumexp(logits, -1).pow(2).mean().item<double>();
  EXPECT_DOUBLE_EQ(plain.loss.item<double>(), plain.cross_entropy.item<double>());
  EXPECT_NEAR(with_z.loss.item<double>(), plain.cross_entropy.item<double>() + 1e-2 * z, 1e-6);
}

// The fused head and loss against the plain ones: values and both gradients, with unscored
// targets, the z-loss, and chunks that do and do not divide the rows.
TEST(LinearCrossEntropy, GivesThePlainHeadsLossAndGradients) {
  torch::manual_seed(11);
  const auto hidden0 = torch::randn({3, 7, 16}), weight0 = torch::randn({29, 16}) * 0.5;
  auto targets = torch::randint(0, 29, {3, 7}, torch::kInt64);
  targets[0][2] = -100;
  targets[2][6] = -100;
  for (double z : {0.0, 1e-2}) {
    auto h_ref = hidden0.clone().requires_grad_(), w_ref = weight0.clone().requires_grad_();
    auto ref = language_model_loss(torch::nn::functional::linear(h_ref, w_ref), targets, z);
    ref.loss.backward();
    for (int64_t chunk : {0, 1, 5, 21, 100}) {
      SCOPED_TRACE(fmt::format("z_loss {} chunk {}", z, chunk));
      auto h = hidden0.clone().requires_grad_(), w = weight0.clone().requires_grad_();
      auto fused = linear_cross_entropy(h, w, targets, z, chunk);
      EXPECT_NEAR(fused.loss.item<double>(), ref.loss.item<double>(), 1e-5);
      EXPECT_NEAR(fused.cross_entropy.item<double>(), ref.cross_entropy.item<double>(), 1e-5);
      EXPECT_FALSE(fused.cross_entropy.requires_grad()) << "the cross entropy is reported, not backpropagated";
      (fused.loss * 3).backward();  // the backward pass scales the gradients it computed
      EXPECT_TRUE(torch::allclose(h.grad(), 3 * h_ref.grad(), 1e-4, 1e-6));
      EXPECT_TRUE(torch::allclose(w.grad(), 3 * w_ref.grad(), 1e-4, 1e-6));
    }
  }
}

TEST(LinearCrossEntropy, WithoutGradientsItOnlyScores) {
  const auto hidden = torch::randn({2, 5, 8}, torch::requires_grad()), weight = torch::randn({13, 8});
  const auto targets = torch::randint(0, 13, {2, 5}, torch::kInt64);
  torch::NoGradGuard no_grad;
  auto fused = linear_cross_entropy(hidden, weight, targets, 0.0, 3);
  EXPECT_FALSE(fused.loss.requires_grad());
  EXPECT_NEAR(fused.loss.item<double>(),
              language_model_loss(torch::nn::functional::linear(hidden, weight), targets, 0.0).loss.item<double>(), 1e-5);
  // No target scored: NaN, as cross_entropy gives (a training step skips such micro-batches).
  EXPECT_TRUE(std::isnan(linear_cross_entropy(hidden, weight, torch::full({2, 5}, -100, torch::kInt64), 0.0).cross_entropy.item<double>()));
  EXPECT_THROW(linear_cross_entropy(hidden, weight, torch::zeros({2, 4}, torch::kInt64), 0.0), InternalError);
  EXPECT_THROW(linear_cross_entropy(hidden, torch::randn({13, 9}), targets, 0.0), InternalError);
}

// The model's own loss is the head's loss of its hidden states (the golden tests check it
// against PyTorch too).
TEST(LinearCrossEntropy, TheModelsLossIsItsForwardsLoss) {
  Transformer model(tiny(), 5);
  auto tokens = torch::randint(0, 97, {2, 17}, torch::kInt64);
  auto inputs = tokens.narrow(1, 0, 16), targets = tokens.narrow(1, 1, 16);
  torch::NoGradGuard no_grad;
  EXPECT_NEAR(model->loss(inputs, targets, 1e-3).loss.item<double>(),
              language_model_loss(model->forward(inputs), targets, 1e-3).loss.item<double>(), 1e-5);
}

}  // namespace
}  // namespace loco::model
