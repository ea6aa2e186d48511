#include <gtest/gtest.h>

#include "loco/core/error.h"
#include "loco/model/sampling.h"
#include "loco/model/transformer.h"

namespace loco::model {
namespace {

ModelOptions small() {
  ModelOptions o;
  o.vocab_size = 50;
  o.context = 8;
  o.layers = 1;
  o.width = 16;
  o.heads = 2;
  return o;
}

TEST(Sampling, SeededAndBoundedByContext) {
  Transformer model(small(), 1);
  SampleOptions s;
  s.max_new_tokens = 20;  // longer than the context: the window must slide
  s.seed = 42;
  auto a = generate(model, {3, 4, 5}, s);
  auto b = generate(model, {3, 4, 5}, s);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 20u);
  for (int32_t id : a) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 50);
  }
  s.seed = 43;
  EXPECT_NE(generate(model, {3, 4, 5}, s), a);
}

TEST(Sampling, GreedyFollowsArgmaxAndTopOneIsGreedy) {
  Transformer model(small(), 2);
  SampleOptions greedy;
  greedy.max_new_tokens = 5;
  greedy.temperature = 0;
  SampleOptions top1 = greedy;
  top1.temperature = 1.0;
  top1.top_k = 1;
  auto g = generate(model, {1, 2}, greedy);
  EXPECT_EQ(generate(model, {1, 2}, top1), g);
  torch::NoGradGuard no_grad;
  auto logits = model->forward(torch::tensor({1L, 2L}).view({1, 2}));
  EXPECT_EQ(g[0], logits[0][1].argmax().item<int64_t>());
}

TEST(Sampling, StopsAtStopToken) {
  Transformer model(small(), 2);
  SampleOptions s;
  s.temperature = 0;
  s.max_new_tokens = 10;
  auto g = generate(model, {1, 2}, s);
  s.stop_token = g[2];
  auto stopped = generate(model, {1, 2}, s);
  ASSERT_LE(stopped.size(), 3u);
  EXPECT_EQ(stopped.back(), g[2]);
}

TEST(Sampling, RejectsBadOptions) {
  Transformer model(small(), 2);
  SampleOptions s;
  s.temperature = -1;
  EXPECT_THROW(generate(model, {1}, s), ConfigError);
}

}  // namespace
}  // namespace loco::model
