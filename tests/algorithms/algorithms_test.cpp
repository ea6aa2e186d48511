// DiLoCo and DDP with ranks as threads over Gloo on 127.0.0.1: the outer step against its closed
// form across ranks, bit-identical θ on every rank after every round, DDP against one process with
// the M× batch, and a round left pending by a failed collective completing after a restore.
#include <gtest/gtest.h>

#include "algorithms/algorithms_util.h"
#include "loco/algorithms/ddp.h"
#include "loco/algorithms/diloco.h"

namespace loco::algorithms {
namespace {

using testing_util::run_ranks;

// Rank r moves every parameter by +(r + 1) and reports t_r tokens; one round (H = 1) of Nesterov:
//   Δ = Σ w_r (θ0 − (θ0 + r + 1)) = −Σ w_r (r + 1),  w_r = t_r / Σ t
//   v = Δ,  θ1 = θ0 − η (Δ + μ v) = θ0 − η (1 + μ) Δ
// Weighted by shard size instead, w_r = s_r / Σ s with shards of s_r tokens, the reverse of t_r.
class DiLoCoWeighting : public testing::TestWithParam<Weighting> {};

TEST_P(DiLoCoWeighting, OuterStepAcrossRanksMatchesTheClosedForm) {
  constexpr int64_t kSize = 3;
  const int64_t tokens[kSize] = {100, 300, 600};
  const int64_t shards[kSize] = {6000, 3000, 1000};
  const bool by_shard = GetParam() == Weighting::kShard;
  auto store = std::make_shared<comm::MemoryKeyValueStore>();
  struct Out {
    std::vector<torch::Tensor> before, after;
    SyncReport report;
  };
  auto results = run_ranks<Out>(kSize, [&](int64_t rank) {
    model::Transformer model(tiny_model(), 5);
    DiLoCoOptions o;
    o.inner_steps = 1;
    o.total_steps = 10;
    o.weighting = GetParam();
    o.shard_tokens = shards[rank];
    DiLoCo diloco(connect(store, rank, kSize, "closed-form"), o);
    diloco.on_start(model, 0);
    Out out;
    out.before = snapshot(model);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.add_(static_cast<double>(rank + 1));
    }
    StepContext context{0, tokens[rank], &model};
    out.report = diloco.after_step(context).at(0);
    out.after = snapshot(model);
    return out;
  });
  for (const auto& r : results) ASSERT_FALSE(r.error) << r.message();
  const auto& size = by_shard ? shards : tokens;
  const double total = static_cast<double>(size[0] + size[1] + size[2]);
  const double delta = -static_cast<double>(size[0] * 1 + size[1] * 2 + size[2] * 3) / total;
  const double eta = 0.7, mu = 0.9;
  for (const auto& r : results) {
    const auto& out = *r.value;
    for (size_t i = 0; i < out.before.size(); ++i) {
      auto expected = out.before[i] - eta * (1 + mu) * delta;
      EXPECT_TRUE(torch::allclose(out.after[i], expected, 1e-5, 1e-5)) << "parameter " << i;
    }
    EXPECT_EQ(out.report.round, 1);
    EXPECT_DOUBLE_EQ(out.report.weight, static_cast<double>(size[&r - results.data()]) / total);
    EXPECT_EQ(out.report.world_size, kSize);
    EXPECT_EQ(out.report.params_hash, results[0].value->report.params_hash) << "θ must be bit-identical on every rank";
    EXPECT_GT(out.report.stats.bytes_sent, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(ByTokensAndByShard, DiLoCoWeighting, testing::Values(Weighting::kTokens, Weighting::kShard),
                         [](const auto& info) { return info.param == Weighting::kShard ? "Shard" : "Tokens"; });

// Dropped outer gradients (the DiLoCo paper's experiment), one round of H = 1 for each of 24 seeds
// on 4 ranks: rank r moves by r + 1; the ranks whose report says weight 0 were dropped, and θ must
// take Nesterov's first step on the average of the kept ones only (θ stays when all were dropped).
TEST(DiLoCo, DroppedOuterGradientsLeaveTheAverageOfTheRest) {
  constexpr int64_t kSize = 4;
  int64_t drops = 0, partial = 0;
  for (uint64_t seed = 0; seed < 24; ++seed) {
    auto store = std::make_shared<comm::MemoryKeyValueStore>();
    struct Out {
      std::vector<torch::Tensor> before, after;
      double weight = -1;
    };
    auto results = run_ranks<Out>(kSize, [&](int64_t rank) {
      model::Transformer model(tiny_model(), 5);
      DiLoCoOptions o;
      o.inner_steps = 1;
      o.total_steps = 10;
      o.drop_probability = 0.5;
      o.drop_seed = seed;
      DiLoCo diloco(connect(store, rank, kSize, fmt::format("drop-{}", seed)), o);
      diloco.on_start(model, 0);
      Out out;
      out.before = snapshot(model);
      {
        torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) p.add_(static_cast<double>(rank + 1));
      }
      StepContext context{0, 100, &model};
      out.weight = diloco.after_step(context).at(0).weight;
      out.after = snapshot(model);
      return out;
    });
    double kept_sum = 0;
    int64_t kept = 0;
    for (size_t r = 0; r < results.size(); ++r) {
      ASSERT_FALSE(results[r].error) << results[r].message();
      if (results[r].value->weight == 0) continue;
      kept_sum += static_cast<double>(r + 1);
      ++kept;
    }
    drops += kSize - kept;
    partial += kept > 0 && kept < kSize ? 1 : 0;
    for (const auto& r : results) {
      if (r.value->weight != 0) EXPECT_DOUBLE_EQ(r.value->weight, 1.0 / static_cast<double>(kept)) << "equal tokens";
      const double delta = kept == 0 ? 0.0 : -kept_sum / static_cast<double>(kept);
      for (size_t i = 0; i < r.value->before.size(); ++i) {
        auto expected = r.value->before[i] - 0.7 * 1.9 * delta;
        EXPECT_TRUE(torch::allclose(r.value->after[i], expected, 1e-5, 1e-5)) << "seed " << seed << ", parameter " << i;
      }
    }
  }
  EXPECT_GT(partial, 0);
  EXPECT_GT(drops, 24 * kSize * 3 / 10) << "about half the outer gradients are dropped";
  EXPECT_LT(drops, 24 * kSize * 7 / 10);
}

// Real inner AdamW steps on different data per rank, H = 3 over 8 steps: rounds end at steps 3, 6
// and 8 (the short final round), and after each every rank holds the same θ, bit for bit.
TEST(DiLoCo, EveryRankHoldsTheSameParametersAfterEveryRound) {
  constexpr int64_t kSize = 3;
  auto store = std::make_shared<comm::MemoryKeyValueStore>();
  auto results = run_ranks<std::vector<SyncReport>>(kSize, [&](int64_t rank) {
    model::Transformer model(tiny_model(), 5);
    auto adamw = make_adamw(model);
    DiLoCoOptions o;
    o.inner_steps = 3;
    o.total_steps = 8;
    DiLoCo diloco(connect(store, rank, kSize, "rounds"), o);
    diloco.on_start(model, 0);
    std::vector<SyncReport> reports;
    for (int64_t step = 0; step < 8; ++step) {
      train_step(model, adamw, batch(100 * rank + step, 4));
      adamw.step(1e-2);
      StepContext context{step, 32, &model};
      for (const auto& report : diloco.after_step(context)) {
        reports.push_back(report);
        EXPECT_EQ(hash_tensors(model->parameters()), report.params_hash) << "the model continues from θ";
      }
      EXPECT_EQ(diloco.in_sync(), diloco.round_ends_at(step + 1));
    }
    return reports;
  });
  for (const auto& r : results) ASSERT_FALSE(r.error) << r.message();
  for (const auto& r : results) {
    ASSERT_EQ(r.value->size(), 3u);
    const int64_t steps[] = {3, 6, 8};
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ((*r.value)[i].step, steps[i]);
      EXPECT_EQ((*r.value)[i].params_hash, (*results[0].value)[i].params_hash) << "round " << i + 1;
    }
  }
  EXPECT_NE((*results[0].value)[0].params_hash, (*results[0].value)[1].params_hash) << "θ moves between rounds";
}

// DDP with M ranks on M slices of a batch takes the steps one process takes on the whole batch.
TEST(Ddp, MatchesOneProcessWithTheMTimesBatch) {
  constexpr int64_t kSize = 2, kSteps = 5, kPerRank = 3;
  std::vector<torch::Tensor> reference;
  {
    model::Transformer model(tiny_model(), 9);
    auto adamw = make_adamw(model);
    for (int64_t step = 0; step < kSteps; ++step) {
      train_step(model, adamw, batch(step, kSize * kPerRank));
      optim::clip_grad_norm(model->parameters(), 1.0);
      adamw.step(1e-2);
    }
    reference = snapshot(model);
  }
  auto store = std::make_shared<comm::MemoryKeyValueStore>();
  auto results = run_ranks<std::vector<torch::Tensor>>(kSize, [&](int64_t rank) {
    model::Transformer model(tiny_model(), 9);
    auto adamw = make_adamw(model);
    Ddp ddp(connect(store, rank, kSize, "ddp"), DdpOptions{64});  // tiny buckets: many collectives
    ddp.on_start(model, 0);
    for (int64_t step = 0; step < kSteps; ++step) {
      train_step(model, adamw, batch(step, kSize * kPerRank).narrow(0, rank * kPerRank, kPerRank));
      StepContext context{step, kPerRank * 8, &model};
      ddp.after_backward(context);
      optim::clip_grad_norm(model->parameters(), 1.0);
      adamw.step(1e-2);
      ddp.after_step(context);
    }
    return snapshot(model);
  });
  for (const auto& r : results) ASSERT_FALSE(r.error) << r.message();
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_TRUE(torch::equal((*results[0].value)[i], (*results[1].value)[i])) << "ranks differ in parameter " << i;
    EXPECT_TRUE(torch::allclose((*results[0].value)[i], reference[i], 1e-5, 1e-6))
        << "parameter " << i << " differs by " << ((*results[0].value)[i] - reference[i]).abs().max().item<float>();
  }
}

TEST(DiLoCo, DifferentStartingParametersAreRefused) {
  auto store = std::make_shared<comm::MemoryKeyValueStore>();
  auto results = run_ranks<int>(2, [&](int64_t rank) {
    model::Transformer model(tiny_model(), 5 + static_cast<uint64_t>(rank));  // a different seed on rank 1
    DiLoCoOptions o;
    o.total_steps = 10;
    DiLoCo diloco(connect(store, rank, 2, "differ"), o);
    diloco.on_start(model, 0);
    return 0;
  });
  for (const auto& r : results) {
    ASSERT_TRUE(r.error);
    EXPECT_NE(r.message().find("the initial parameters differ between workers"), std::string::npos) << r.message();
  }
}

// A DiLoCo run (H = 2 over 4 steps) checkpointed after round 1's last inner step but before its
// synchronization (a peer left): its state then, the model's parameters, and the report of the
// round as the uninterrupted run synchronized it.
struct PendingRound {
  DiLoCoOptions options;
  NamedTensors state;  // copied, as a checkpoint does (state() aliases the live tensors)
  std::vector<torch::Tensor> model;
  SyncReport expected;
};

PendingRound pending_round() {
  PendingRound out;
  out.options.inner_steps = 2;
  out.options.total_steps = 4;
  model::Transformer model(tiny_model(), 5);
  auto adamw = make_adamw(model);
  DiLoCo first(comm::Group::single(), out.options);
  first.on_start(model, 0);
  StepContext context{0, 32, &model};
  train_step(model, adamw, batch(0, 4));
  adamw.step(1e-2);
  first.after_step(context);
  train_step(model, adamw, batch(1, 4));
  adamw.step(1e-2);
  for (const auto& [name, tensor] : first.state()) out.state.emplace_back(name, tensor.clone());
  out.model = snapshot(model);
  context.step = 1;
  out.expected = first.after_step(context).at(0);
  return out;
}

// A model holding `parameters` (another seed's initialization overwritten).
model::Transformer model_with(const std::vector<torch::Tensor>& parameters) {
  model::Transformer restored(tiny_model(), 77);
  torch::NoGradGuard no_grad;
  auto params = restored->parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(parameters[i]);
  return restored;
}

// The pending round's checkpoint restores into a DiLoCo that performs the round's sync in
// on_start, as the uninterrupted run did.
TEST(DiLoCo, PendingRoundCompletesAfterARestore) {
  const auto pending = pending_round();
  auto restored = model_with(pending.model);
  DiLoCo second(comm::Group::single(), pending.options);
  second.load_state(pending.state);
  auto reports = second.on_start(restored, 2);
  ASSERT_EQ(reports.size(), 1u) << "the pending round is synchronized at start";
  EXPECT_EQ(reports[0].round, 1);
  EXPECT_EQ(reports[0].params_hash, pending.expected.params_hash);
  EXPECT_TRUE(second.in_sync());
}

// DiLoCo became Streaming DiLoCo's one-fragment case, and its checkpointed state took the
// streaming entries. A state in the earlier layout ("diloco.round", "diloco.synced_step",
// "diloco.round_tokens", "outer.<key>"; main jobs run before the change hold one) still resumes:
// its pending round completes with the θ the uninterrupted run reached.
TEST(DiLoCo, ACheckpointOfTheEarlierLayoutStillResumes) {
  const auto pending = pending_round();
  NamedTensors earlier;
  for (const auto& [name, tensor] : pending.state) {
    if (name == "streaming.rounds") earlier.emplace_back("diloco.round", tensor);
    else if (name == "streaming.0.started") earlier.emplace_back("diloco.synced_step", tensor);
    else if (name == "streaming.0.tokens") earlier.emplace_back("diloco.round_tokens", tensor);
    else if (name.starts_with("outer.0.")) earlier.emplace_back("outer." + name.substr(8), tensor);
    else if (name.starts_with("global.")) earlier.emplace_back(name, tensor);
  }
  ASSERT_EQ(std::count_if(earlier.begin(), earlier.end(), [](const auto& t) { return t.first.starts_with("diloco."); }), 3);
  auto restored = model_with(pending.model);
  DiLoCo second(comm::Group::single(), pending.options);
  second.load_state(earlier);
  auto reports = second.on_start(restored, 2);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].round, 1);
  EXPECT_EQ(reports[0].params_hash, pending.expected.params_hash);
  // An entry the layout never had is still refused.
  earlier.emplace_back("diloco.unknown", torch::tensor(int64_t{1}));
  DiLoCo third(comm::Group::single(), pending.options);
  third.load_state(earlier);
  EXPECT_THROW(third.on_start(restored, 2), DataError);
}

}  // namespace
}  // namespace loco::algorithms
