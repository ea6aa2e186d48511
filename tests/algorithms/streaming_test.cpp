// Streaming DiLoCo with ranks as threads over Gloo: fragment plans, the staggered schedule, τ = 0,
// α = 0, P = 1 reproducing DiLoCo bit for bit, identical θ on every rank after every fragment sync
// with 4-bit exchange, the merge against its closed form, and a checkpoint taken while a
// fragment is on the wire resuming into the uninterrupted run.
#include <gtest/gtest.h>

#include <set>

#include "algorithms/algorithms_util.h"
#include "loco/algorithms/diloco.h"
#include "loco/algorithms/flat_buffer.h"
#include "loco/algorithms/streaming.h"
#include "loco/core/error.h"

namespace loco::algorithms {
namespace {

using testing_util::run_ranks;

StreamingOptions streaming(int64_t h, int64_t total, int64_t p, int64_t tau, double alpha,
                           comm::Encoding exchange = comm::Encoding::kFp32) {
  StreamingOptions o;
  o.inner_steps = h;
  o.total_steps = total;
  o.fragments = p;
  o.overlap_steps = tau;
  o.merge_alpha = alpha;
  o.exchange = exchange;
  return o;
}

TEST(Streaming, FragmentPlansCoverEveryParameterRowOnce) {
  model::Transformer model(tiny_model(6), 5);
  const auto params = model->parameters();
  for (auto pattern : {FragmentPattern::kStrided, FragmentPattern::kSequential}) {
    auto plan = plan_fragments(model, 3, pattern);
    ASSERT_EQ(plan.size(), 3u);
    std::vector<int64_t> covered(params.size(), 0), sizes;
    for (size_t p = 0; p < plan.size(); ++p) {
      int64_t size = 0;
      std::set<int64_t> blocks;
      for (const auto& s : plan[p]) {
        covered[s.index] += s.rows;
        size += s.rows * (params[s.index].numel() / params[s.index].size(0));
        if (s.name.starts_with("blocks.")) blocks.insert(std::stoll(s.name.substr(7)));
        else EXPECT_NE(s.name.find('['), std::string::npos) << s.name << ": a non-block parameter is cut in rows";
      }
      // strided: {p, p + 3}; sequential: {2p, 2p + 1}
      const std::set<int64_t> expected = pattern == FragmentPattern::kStrided
                                             ? std::set<int64_t>{static_cast<int64_t>(p), static_cast<int64_t>(p) + 3}
                                             : std::set<int64_t>{2 * static_cast<int64_t>(p), 2 * static_cast<int64_t>(p) + 1};
      EXPECT_EQ(blocks, expected) << "fragment " << p;
      sizes.push_back(size);
    }
    for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(covered[i], params[i].size(0)) << "parameter " << i;
    EXPECT_LE(*std::max_element(sizes.begin(), sizes.end()) - *std::min_element(sizes.begin(), sizes.end()), 16 * 2)
        << "fragments of equal blocks differ only by a row or two of the cut parameters";
  }
  auto whole = plan_fragments(model, 1, FragmentPattern::kStrided);
  ASSERT_EQ(whole[0].size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(whole[0][i].index, i) << "one fragment is the model in order";
  EXPECT_THROW(plan_fragments(model, 7, FragmentPattern::kStrided), ConfigError);
}

TEST(Streaming, OptionsAreValidated) {
  EXPECT_NO_THROW(streaming(10, 100, 4, 1, 0.5).validate());
  EXPECT_THROW(streaming(10, 100, 11, 1, 0.5).validate(), ConfigError);  // P > H
  EXPECT_THROW(streaming(10, 100, 2, 10, 0.5).validate(), ConfigError);  // τ >= H
  EXPECT_THROW(streaming(10, 100, 2, -1, 0.5).validate(), ConfigError);
  EXPECT_THROW(streaming(10, 100, 2, 1, 1.5).validate(), ConfigError);
  auto timed = streaming(10, 100, 2, 0, 0.0);
  timed.round_seconds = 1;
  EXPECT_THROW(timed.validate(), ConfigError) << "time-budgeted rounds are DiLoCo's: one fragment";
  timed.fragments = 1;
  EXPECT_NO_THROW(timed.validate());
}

// Three ranks, real AdamW steps on different data: with P = 1, τ = 0, α = 0 and fp32, Streaming
// DiLoCo takes exactly DiLoCo's path. (DiLoCo is this class with DiLoCoOptions::as_streaming(): the
// test checks that those options are all DiLoCo is, bit for bit, with unequal token weights.)
TEST(Streaming, OneFragmentWithoutOverlapIsDiLoCoBitForBit) {
  constexpr int64_t kSize = 3, kSteps = 8;
  auto run = [&](bool stream) {
    auto store = std::make_shared<comm::MemoryKeyValueStore>();
    auto results = run_ranks<std::pair<std::vector<uint64_t>, std::vector<torch::Tensor>>>(kSize, [&](int64_t rank) {
      model::Transformer model(tiny_model(), 5);
      auto adamw = make_adamw(model);
      std::unique_ptr<SyncStrategy> sync;
      if (stream) {
        sync = std::make_unique<StreamingDiLoCo>(connect(store, rank, kSize, "s"), streaming(3, kSteps, 1, 0, 0.0));
      } else {
        DiLoCoOptions o;
        o.inner_steps = 3;
        o.total_steps = kSteps;
        sync = std::make_unique<DiLoCo>(connect(store, rank, kSize, "d"), o);
      }
      sync->on_start(model, 0);
      std::vector<uint64_t> hashes;
      for (int64_t step = 0; step < kSteps; ++step) {
        train_step(model, adamw, batch(100 * rank + step, 4));
        adamw.step(1e-2);
        StepContext context{step, 32 + 8 * rank, &model};  // unequal tokens: unequal weights
        for (const auto& report : sync->after_step(context)) hashes.push_back(report.params_hash);
      }
      EXPECT_TRUE(sync->in_sync());
      return std::pair{hashes, snapshot(model)};
    });
    for (const auto& r : results) EXPECT_FALSE(r.error) << r.message();
    return *results[1].value;
  };
  const auto diloco = run(false), stream = run(true);
  ASSERT_EQ(diloco.first.size(), 3u);  // steps 3, 6 and 8
  EXPECT_EQ(stream.first, diloco.first);
  for (size_t i = 0; i < diloco.second.size(); ++i) EXPECT_TRUE(torch::equal(stream.second[i], diloco.second[i])) << i;
}

// P = 2, H = 4, τ = 1, α = 0.5, e3m0 over 11 steps: fragment 0 starts at 4 and 8, fragment 1 (offset
// 2) after its own H steps, at 6 and 10; results land a step later. At step 11 fragment 0, which
// trained since its last sync, synchronizes once more; fragment 1, whose result was applied at step
// 11, does not (a second sync would send Δ = 0 and still move θ by the stale Nesterov momentum).
// The model becomes θ. Every rank holds the same θ after every sync.
TEST(Streaming, StaggeredFourBitSyncsLeaveEveryRankWithTheSameTheta) {
  constexpr int64_t kSize = 3, kSteps = 11;
  auto store = std::make_shared<comm::MemoryKeyValueStore>();
  struct Out {
    std::vector<SyncReport> reports;
    uint64_t model_hash = 0;
    bool in_sync = false;
  };
  auto results = run_ranks<Out>(kSize, [&](int64_t rank) {
    model::Transformer model(tiny_model(), 5);
    auto adamw = make_adamw(model);
    StreamingDiLoCo sync(connect(store, rank, kSize, "staggered"), streaming(4, kSteps, 2, 1, 0.5, comm::Encoding::kE3M0));
    sync.on_start(model, 0);
    Out out;
    for (int64_t step = 0; step < kSteps; ++step) {
      train_step(model, adamw, batch(100 * rank + step, 4));
      adamw.step(1e-2);
      StepContext context{step, 32, &model};
      for (const auto& report : sync.after_step(context)) out.reports.push_back(report);
      if (step + 1 < kSteps) EXPECT_FALSE(sync.in_sync()) << "step " << step + 1;
    }
    out.model_hash = hash_tensors(model->parameters());
    out.in_sync = sync.in_sync();
    return out;
  });
  for (const auto& r : results) ASSERT_FALSE(r.error) << r.message();
  // (fragment, step at which its result was applied)
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 5}, {1, 7}, {0, 9}, {1, 11}, {0, 11}};
  for (const auto& r : results) {
    const auto& out = *r.value;
    ASSERT_EQ(out.reports.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(out.reports[i].fragment, expected[i].first) << "sync " << i;
      EXPECT_EQ(out.reports[i].step, expected[i].second) << "sync " << i;
      EXPECT_EQ(out.reports[i].round, static_cast<int64_t>(i) + 1);
      EXPECT_EQ(out.reports[i].world_size, kSize);
      EXPECT_EQ(out.reports[i].params_hash, results[0].value->reports[i].params_hash) << "θ differs after sync " << i;
      EXPECT_GT(out.reports[i].stats.bytes_sent, 0);
    }
    EXPECT_TRUE(out.in_sync);
    EXPECT_EQ(out.model_hash, out.reports.back().params_hash) << "a finished run's model is θ";
  }
  EXPECT_NE(results[0].value->reports[0].params_hash, results[0].value->reports[1].params_hash);
}

// One rank, one fragment, τ = 1, α = 0.5, FedAvg (sgd lr 1): the sync started at step t returns
// θ̃ = θ_m(t) and at step t + 1 the model becomes 0.5·θ_m(t + 1) + 0.5·θ_m(t).
TEST(Streaming, MergeMatchesItsClosedForm) {
  model::Transformer model(tiny_model(), 5);
  auto o = streaming(2, 4, 1, 1, 0.5);
  o.outer = optim::default_outer_options(optim::OuterKind::kSgd);
  StreamingDiLoCo sync(comm::Group::single(), o);
  sync.on_start(model, 0);
  auto move = [&](double by) {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(by);
  };
  StepContext context{0, 8, &model};
  move(1.0);
  EXPECT_TRUE(sync.after_step(context).empty());
  move(2.0);  // step 2: fragment 0 starts with θ_m(2) = θ0 + 3
  context.step = 1;
  const auto at_start = snapshot(model);
  EXPECT_TRUE(sync.after_step(context).empty());
  move(4.0);  // step 3: θ_m(3) = θ0 + 7, then the merge
  context.step = 2;
  const auto before_merge = snapshot(model);
  ASSERT_EQ(sync.after_step(context).size(), 1u);
  const auto merged = snapshot(model);
  for (size_t i = 0; i < merged.size(); ++i) {
    EXPECT_TRUE(torch::allclose(merged[i], 0.5 * before_merge[i] + 0.5 * at_start[i], 1e-6, 1e-6)) << i;
    EXPECT_TRUE(torch::equal((*sync.evaluation_parameters())[i], at_start[i])) << "θ is the FedAvg of one worker";
  }
}

// Deterministic "inner steps" (each adds a step-dependent amount), one rank, P = 2, τ = 2, e3m0: a
// checkpoint at step 5, while fragment 0's sync (started at step 4, due at 6) is in flight,
// restores into a run that ends exactly where the uninterrupted one does.
TEST(Streaming, CheckpointWhileAFragmentIsInFlightResumesExactly) {
  const auto options = streaming(4, 12, 2, 2, 0.5, comm::Encoding::kE3M0);
  auto inner_step = [](model::Transformer& model, int64_t step) {
    torch::NoGradGuard no_grad;
    int64_t i = 0;
    for (auto& p : model->parameters()) p.add_(0.01 * std::sin(static_cast<double>(step * 7 + i++)));
  };
  auto run = [&](model::Transformer& model, StreamingDiLoCo& sync, int64_t from, int64_t to) {
    std::vector<uint64_t> hashes;
    for (int64_t step = from; step < to; ++step) {
      inner_step(model, step);
      StepContext context{step, 16, &model};
      for (const auto& report : sync.after_step(context)) hashes.push_back(report.params_hash);
    }
    return hashes;
  };
  model::Transformer straight(tiny_model(), 5);
  StreamingDiLoCo uninterrupted(comm::Group::single(), options);
  uninterrupted.on_start(straight, 0);
  const auto expected = run(straight, uninterrupted, 0, 12);

  model::Transformer first(tiny_model(), 5);
  NamedTensors saved;
  std::vector<torch::Tensor> saved_model;
  std::vector<uint64_t> hashes;
  {
    StreamingDiLoCo sync(comm::Group::single(), options);
    sync.on_start(first, 0);
    hashes = run(first, sync, 0, 5);  // fragment 0 started at step 4 (due at 6); fragment 1 starts at 6
    for (const auto& [name, tensor] : sync.state()) saved.emplace_back(name, tensor.clone());
    saved_model = snapshot(first);
    bool in_flight = false;
    for (const auto& [name, tensor] : saved) in_flight = in_flight || name.ends_with(".result");
    EXPECT_TRUE(in_flight) << "the checkpoint must catch a sync in flight to test anything";
  }
  model::Transformer second(tiny_model(), 99);
  {
    torch::NoGradGuard no_grad;
    auto params = second->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(saved_model[i]);
  }
  StreamingDiLoCo resumed(comm::Group::single(), options);
  resumed.load_state(saved);
  for (const auto& report : resumed.on_start(second, 5)) hashes.push_back(report.params_hash);
  const auto rest = run(second, resumed, 5, 12);
  hashes.insert(hashes.end(), rest.begin(), rest.end());
  EXPECT_EQ(hashes, expected);
  const auto a = snapshot(straight), b = snapshot(second);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

// Eager outer updates against their closed form. Two ranks as threads, one fragment, H = 2, 7 steps,
// uniform weights (w = 1/2), outer SGD with lr 0.7 (θ ← θ − 0.7·g), fp32. Each "inner step" adds a
// known amount a(m, s) to every parameter, so every parameter is its initial value plus one offset
// per rank, which the test tracks in plain arithmetic:
//   sync r at step t (not the last): Δ_m = θ_m − x_m;
//     g_m = S_{r−1} − w·Δ_m^{r−1} + w·Δ_m^r   (S = Σ_k w·Δ_k; S_0 = 0, Δ^0 = 0);  θ_m −= 0.7·g_m;  x_m = θ_m
//   the last step: g_m = S_{R−1} − w·Δ_m^{R−1} + S_R;  θ_m −= 0.7·g_m;  then θ = mean_m θ_m, x_m = θ.
TEST(Streaming, EagerUpdatesMatchTheirClosedForm) {
  constexpr int64_t kSize = 2, kSteps = 7, kH = 2;
  const auto inner = [](int64_t rank, int64_t step) { return 0.25 * static_cast<double>(rank + 1) + 0.125 * static_cast<double>(step % 3); };
  // The closed form, both ranks at once: offsets after each step (x) and θ after each sync.
  std::vector<std::vector<double>> expected_x(kSize), expected_theta(kSize);
  {
    const double w = 0.5, lr = 0.7;
    double x[kSize] = {0, 0}, theta[kSize] = {0, 0}, previous[kSize] = {0, 0}, previous_sum = 0;
    for (int64_t step = 0; step < kSteps; ++step) {
      for (int64_t m = 0; m < kSize; ++m) x[m] += inner(m, step);
      const int64_t t = step + 1;
      const bool last = t == kSteps;
      if (t % kH != 0 && !last) {
        for (int64_t m = 0; m < kSize; ++m) expected_x[m].push_back(x[m]);
        continue;
      }
      double delta[kSize], sum = 0;
      for (int64_t m = 0; m < kSize; ++m) sum += w * (delta[m] = theta[m] - x[m]);
      for (int64_t m = 0; m < kSize; ++m) {
        const double g = previous_sum - w * previous[m] + (last ? sum : w * delta[m]);
        theta[m] -= lr * g;
      }
      if (last) theta[0] = theta[1] = (theta[0] + theta[1]) / 2;
      for (int64_t m = 0; m < kSize; ++m) {
        x[m] = theta[m];
        previous[m] = delta[m];
        expected_x[m].push_back(x[m]);
        expected_theta[m].push_back(theta[m]);
      }
      previous_sum = sum;
    }
  }
  auto store = std::make_shared<comm::MemoryKeyValueStore>();
  struct Out {
    std::vector<std::vector<double>> x_offsets, theta_offsets;  // per step / per sync: every parameter's offset
    std::vector<SyncReport> reports;
    bool in_sync = false;
  };
  auto results = run_ranks<Out>(kSize, [&](int64_t rank) {
    model::Transformer model(tiny_model(), 5);
    const auto initial = snapshot(model);
    auto o = streaming(kH, kSteps, 1, 0, 0.0);
    o.eager = true;
    o.weighting = Weighting::kUniform;
    o.outer = optim::default_outer_options(optim::OuterKind::kSgd);
    o.outer.lr = 0.7;
    StreamingDiLoCo sync(connect(store, rank, kSize, "eager"), o);
    sync.on_start(model, 0);
    const auto offsets = [&](const std::vector<torch::Tensor>& now) {
      std::vector<double> out;
      for (size_t i = 0; i < now.size(); ++i) {
        const auto d = (now[i] - initial[i]).to(torch::kFloat64);
        out.push_back(d.mean().item<double>());
        if ((d - d.mean()).abs().max().item<double>() > 1e-5) out.push_back(NAN);  // not one offset: fails below
      }
      return out;
    };
    Out out;
    for (int64_t step = 0; step < kSteps; ++step) {
      {
        torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) p.add_(inner(rank, step));
      }
      StepContext context{step, 8, &model};
      for (const auto& report : sync.after_step(context)) {
        out.reports.push_back(report);
        out.theta_offsets.push_back(offsets(*sync.evaluation_parameters()));
      }
      out.x_offsets.push_back(offsets(snapshot(model)));
    }
    out.in_sync = sync.in_sync();
    return out;
  });
  for (const auto& r : results) ASSERT_FALSE(r.error) << r.message();
  for (int64_t m = 0; m < kSize; ++m) {
    const auto& out = *results[static_cast<size_t>(m)].value;
    ASSERT_EQ(out.reports.size(), 4u) << "syncs at steps 2, 4, 6 and the last, 7";
    ASSERT_EQ(out.theta_offsets.size(), expected_theta[m].size());
    for (size_t r = 0; r < out.theta_offsets.size(); ++r) {
      for (double offset : out.theta_offsets[r]) EXPECT_NEAR(offset, expected_theta[m][r], 1e-5) << "rank " << m << " sync " << r;
    }
    for (size_t s = 0; s < out.x_offsets.size(); ++s) {
      for (double offset : out.x_offsets[s]) EXPECT_NEAR(offset, expected_x[m][s], 1e-5) << "rank " << m << " step " << s + 1;
    }
    EXPECT_TRUE(out.in_sync);
    EXPECT_EQ(out.reports[0].stats.bytes_sent, 0) << "the first eager step has nothing to wait for";
    EXPECT_GT(out.reports[1].stats.bytes_sent, 0);
    for (size_t r = 0; r < out.reports.size(); ++r) {
      EXPECT_EQ(out.reports[r].params_hash, results[0].value->reports[r].params_hash) << "every rank reports the shared sum";
    }
  }
  EXPECT_NE(expected_theta[0][1], expected_theta[1][1]) << "the replicas' θ differ mid-run, or the test tests little";
}

// Eager, two ranks, P = 2, e3m0: each rank checkpoints at step 5, while both fragments' exchanges
// are in flight, and a new strategy resumes from it; every rank ends exactly where the
// uninterrupted run does.
TEST(Streaming, EagerCheckpointMidFlightResumesExactly) {
  constexpr int64_t kSize = 2, kSteps = 12;
  auto options = streaming(4, kSteps, 2, 0, 0.25, comm::Encoding::kE3M0);
  options.eager = true;
  auto inner_step = [](model::Transformer& model, int64_t rank, int64_t step) {
    torch::NoGradGuard no_grad;
    int64_t i = 0;
    for (auto& p : model->parameters()) p.add_(0.01 * std::sin(static_cast<double>(step * 7 + i++ + 13 * rank)));
  };
  auto run = [&](model::Transformer& model, StreamingDiLoCo& sync, int64_t rank, int64_t from, int64_t to) {
    std::vector<uint64_t> hashes;
    for (int64_t step = from; step < to; ++step) {
      inner_step(model, rank, step);
      StepContext context{step, 16, &model};
      for (const auto& report : sync.after_step(context)) hashes.push_back(report.params_hash);
    }
    return hashes;
  };
  using Out = std::pair<std::vector<uint64_t>, std::vector<torch::Tensor>>;
  auto straight_store = std::make_shared<comm::MemoryKeyValueStore>();
  auto straight = run_ranks<Out>(kSize, [&](int64_t rank) {
    model::Transformer model(tiny_model(), 5);
    StreamingDiLoCo sync(connect(straight_store, rank, kSize, "straight"), options);
    sync.on_start(model, 0);
    auto hashes = run(model, sync, rank, 0, kSteps);
    return Out{hashes, snapshot(model)};
  });
  auto store = std::make_shared<comm::MemoryKeyValueStore>();
  auto resumed = run_ranks<Out>(kSize, [&](int64_t rank) {
    auto group = connect(store, rank, kSize, "resumed");
    model::Transformer model(tiny_model(), 5);
    NamedTensors saved;
    std::vector<uint64_t> hashes;
    bool in_flight = false;
    {
      StreamingDiLoCo sync(group, options);
      sync.on_start(model, 0);
      hashes = run(model, sync, rank, 0, 5);  // fragment 0 synced at 4 (its exchange in flight); fragment 1 at 6
      for (const auto& [name, tensor] : sync.state()) {
        saved.emplace_back(name, tensor.clone());
        in_flight = in_flight || name == "streaming.0.weight";
      }
    }
    if (!in_flight) throw std::runtime_error("the checkpoint must catch an exchange in flight to test anything");
    model::Transformer second(tiny_model(), 99);
    {
      torch::NoGradGuard no_grad;
      const auto from = snapshot(model);
      auto params = second->parameters();
      for (size_t i = 0; i < params.size(); ++i) params[i].copy_(from[i]);
    }
    StreamingDiLoCo sync(group, options);
    sync.load_state(saved);
    for (const auto& report : sync.on_start(second, 5)) hashes.push_back(report.params_hash);
    const auto rest = run(second, sync, rank, 5, kSteps);
    hashes.insert(hashes.end(), rest.begin(), rest.end());
    return Out{hashes, snapshot(second)};
  });
  for (int64_t m = 0; m < kSize; ++m) {
    const auto& a = straight[static_cast<size_t>(m)];
    const auto& b = resumed[static_cast<size_t>(m)];
    ASSERT_FALSE(a.error) << a.message();
    ASSERT_FALSE(b.error) << b.message();
    EXPECT_EQ(b.value->first, a.value->first) << "rank " << m;
    for (size_t i = 0; i < a.value->second.size(); ++i) {
      EXPECT_TRUE(torch::equal(a.value->second[i], b.value->second[i])) << "rank " << m << " parameter " << i;
    }
  }
  // The run ends on one θ: both ranks' final models agree.
  for (size_t i = 0; i < straight[0].value->second.size(); ++i) {
    EXPECT_TRUE(torch::equal(straight[0].value->second[i], straight[1].value->second[i])) << i;
  }
}

TEST(Streaming, EagerOptionsAreValidated) {
  auto o = streaming(4, 12, 1, 1, 0.0);
  o.eager = true;
  EXPECT_THROW(o.validate(), ConfigError);  // τ > 0
  o.overlap_steps = 0;
  o.drop_probability = 0.1;
  EXPECT_THROW(o.validate(), ConfigError);
  o.drop_probability = 0;
  EXPECT_NO_THROW(o.validate());
  o.screening.reject_ratio = 10;  // screening by norm and clipping weigh a worker's share: eager steps with it
  o.screening.clip_norm = 1;
  EXPECT_NO_THROW(o.validate());
  o.screening.combine = comm::Combine::kMedian;  // a median has no share of one worker to take back
  EXPECT_THROW(o.validate(), ConfigError);
}

}  // namespace
}  // namespace loco::algorithms
