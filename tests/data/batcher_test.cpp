#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "loco/core/error.h"
#include "loco/data/batcher.h"

namespace loco::data {
namespace {

std::vector<int32_t> ramp(int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(WindowSampler, TargetsAreInputsShiftedByOne) {
  WindowSampler sampler(ramp(101), 10, 1);
  auto batch = sampler.next(3);
  ASSERT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{3, 10}));
  EXPECT_EQ(batch.inputs.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(batch.targets, batch.inputs + 1));
  for (int64_t b = 0; b < 3; ++b) EXPECT_EQ(batch.inputs[b][0].item<int64_t>() % 10, 0) << "windows start on a multiple of context";
}

TEST(WindowSampler, EachEpochVisitsEveryWindowOnceInANewOrder) {
  WindowSampler sampler(ramp(101), 10, 7);  // 10 windows per epoch
  ASSERT_EQ(sampler.windows_per_epoch(), 10);
  std::vector<int64_t> first, second;
  for (int i = 0; i < 10; ++i) first.push_back(sampler.next(1).inputs[0][0].item<int64_t>());
  EXPECT_EQ(sampler.position(), (SamplerPosition{0, 10}));
  for (int i = 0; i < 10; ++i) second.push_back(sampler.next(1).inputs[0][0].item<int64_t>());
  EXPECT_EQ(sampler.position(), (SamplerPosition{1, 10}));
  EXPECT_EQ(std::set<int64_t>(first.begin(), first.end()).size(), 10u);
  EXPECT_EQ(std::set<int64_t>(second.begin(), second.end()).size(), 10u);
  EXPECT_NE(first, second);
}

TEST(WindowSampler, RestoreReproducesTheFuture) {
  WindowSampler a(ramp(1001), 10, 3);
  for (int i = 0; i < 37; ++i) a.next(3);  // crosses an epoch boundary
  const auto position = a.position();
  auto expected = a.next(5);

  WindowSampler b(ramp(1001), 10, 3);
  b.restore(position);
  auto got = b.next(5);
  EXPECT_TRUE(torch::equal(expected.inputs, got.inputs));
  EXPECT_THROW(b.restore({0, 10'000}), DataError);
}

TEST(WindowSampler, SeedChangesOrderAndShortStreamsAreRejected) {
  WindowSampler a(ramp(1001), 10, 1), b(ramp(1001), 10, 2);
  EXPECT_FALSE(torch::equal(a.next(8).inputs, b.next(8).inputs));
  EXPECT_THROW(WindowSampler(ramp(10), 10, 1), DataError);
}

TEST(EvaluationBatches, EvenlySpreadDeterministicAndBounded) {
  auto batches = evaluation_batches(ramp(1001), 10, 7, 3);  // 100 windows available, 7 taken
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].inputs.size(0), 3);
  EXPECT_EQ(batches[2].inputs.size(0), 1);
  std::vector<int64_t> starts;
  for (const auto& b : batches)
    for (int64_t i = 0; i < b.inputs.size(0); ++i) starts.push_back(b.inputs[i][0].item<int64_t>());
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 140, 280, 420, 570, 710, 850}));
  EXPECT_EQ(evaluation_batches(ramp(31), 10, 50, 8)[0].inputs.size(0), 3) << "capped by the windows available";
  EXPECT_THROW(evaluation_batches(ramp(5), 10, 1, 1), DataError);
}

// Covering windows: every target of the document (tokens 1..n-1, less the masked ones) exactly once,
// each with the inputs before it in the same window, and padding that is never a target.
TEST(CoveringBatches, ScoreEveryTargetOnceAndPadTheLastWindow) {
  const auto tokens = ramp(26);  // 25 targets: windows of 10 cover 10 + 10 + 5
  auto targets = tokens;
  targets[1] = targets[2] = kIgnoredTarget;  // as DiPaCo's routing tokens
  const auto batches = covering_batches(tokens, 10, 2, &targets);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].inputs.size(0), 2);
  EXPECT_EQ(batches[1].inputs.size(0), 1);
  std::vector<int64_t> scored;
  for (const auto& b : batches) {
    for (int64_t w = 0; w < b.inputs.size(0); ++w) {
      for (int64_t t = 0; t < 10; ++t) {
        const auto target = b.targets[w][t].item<int64_t>();
        if (target == kIgnoredTarget) continue;
        scored.push_back(target);
        EXPECT_EQ(b.inputs[w][t].item<int64_t>(), target - 1) << "a target follows its input";
      }
    }
  }
  std::vector<int64_t> expected;
  for (int64_t i = 3; i < 26; ++i) expected.push_back(i);
  EXPECT_EQ(scored, expected);
  EXPECT_EQ(batches[1].inputs[0][4].item<int64_t>(), 24);  // the last real input, then padding
  EXPECT_EQ(batches[1].targets[0][5].item<int64_t>(), kIgnoredTarget);
  EXPECT_EQ(covering_batches(ramp(11), 10, 8)[0].inputs.size(0), 1) << "10 targets fill one window exactly";
  EXPECT_EQ(covering_batches(ramp(2), 10, 8)[0].targets[0][0].item<int64_t>(), 1) << "a 2-token document has one target";
  EXPECT_THROW(covering_batches(ramp(1), 10, 1), DataError);
}

// A target stream: the inputs are the tokens, the targets come from it, shifted the same way, so
// that a masked position is never a target and is still an input.
TEST(TargetStreams, MaskedPositionsAreNeverTargets) {
  const auto tokens = ramp(1001);
  auto targets = tokens;
  for (size_t i = 0; i < targets.size(); i += 7) targets[i] = kIgnoredTarget;
  WindowSampler sampler(tokens, 10, 3, &targets), plain(tokens, 10, 3);
  for (int step = 0; step < 20; ++step) {
    const auto batch = sampler.next(4);
    const auto reference = plain.next(4);
    EXPECT_TRUE(torch::equal(batch.inputs, reference.inputs));
    for (int64_t b = 0; b < 4; ++b) {
      for (int64_t t = 0; t < 10; ++t) {
        const int64_t position = reference.targets[b][t].item<int64_t>();  // ramp: the token is its position
        EXPECT_EQ(batch.targets[b][t].item<int64_t>(), position % 7 == 0 ? kIgnoredTarget : position);
      }
    }
  }
  const auto eval = evaluation_batches(tokens, 10, 5, 5, &targets);
  const auto eval_plain = evaluation_batches(tokens, 10, 5, 5);
  EXPECT_TRUE(torch::equal(eval[0].inputs, eval_plain[0].inputs));
  EXPECT_TRUE(torch::equal(eval[0].targets, torch::where(eval_plain[0].targets % 7 == 0,
                                                         torch::full_like(eval_plain[0].targets, kIgnoredTarget),
                                                         eval_plain[0].targets)));
}

}  // namespace
}  // namespace loco::data
