// Screening of outer gradients (options.h, Screening): ranks as threads over Gloo, each "inner step"
// a known move, FedAvg as the outer step (sgd, lr 1), so that θ after a sync is the weighted average
// of what was kept, in closed form. One rank's outer gradient is poisoned (sync.poison): times 100,
// or one value NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "algorithms/algorithms_util.h"
#include "loco/algorithms/screening.h"
#include "loco/algorithms/streaming.h"
#include "loco/core/error.h"
#include "test_util.h"

namespace loco::algorithms {
namespace {

using testing_util::run_ranks;

TEST(Screening, TheWeightsLeaveOutWhatIsNotFiniteOrFarFromTheOthersAndClip) {
  const double nan = std::nan("");
  // (s_m, counted_m, kept_m, ‖Δ_m‖²)
  auto out = screen({{1, 1, 1, 4}, {1, 1, 1, 9}, {1, 1, 1, nan}, {1, 1, 1, 4e6}}, Screening{10, 0});
  EXPECT_EQ(out.weights, (std::vector<double>{0.5, 0.5, 0, 0}));
  EXPECT_EQ(out.kept, 2);
  EXPECT_EQ(out.rejected, 2);
  EXPECT_EQ(out.not_finite, 1);
  EXPECT_EQ(out.why, "rank 2: not finite; rank 3: norm 2000 is 800x the others' median 2.5");

  out = screen({{1, 1, 1, 4}, {3, 1, 1, 16}, {0, 0, 0, 0}}, Screening{0, 2});  // a joiner (not kept) and a clip
  EXPECT_EQ(out.weights, (std::vector<double>{0.25, 0.75 * 0.5, 0}));
  EXPECT_EQ(out.rejected, 0);
  EXPECT_EQ(out.why, "rank 1: norm 4 clipped to 2");

  out = screen({{1, 1, 1, 4}, {1, 1, 1, 400}}, Screening{});  // off: only the not finite go
  EXPECT_EQ(out.weights, (std::vector<double>{0.5, 0.5}));
  EXPECT_TRUE(out.why.empty());

  // A stated size that no honest worker sends cannot take the others' weights; a robust mean
  // weighs every kept contribution alike, whatever its size.
  const double inf = std::numeric_limits<double>::infinity();
  out = screen({{1, 1, 1, 4}, {inf, 1, 1, 4}, {-5, 1, 1, 4}, {3, 1, 1, 4}}, Screening{});
  EXPECT_EQ(out.weights, (std::vector<double>{0.25, 0, 0, 0.75}));
  EXPECT_EQ(out.why, "rank 1: malformed numbers; rank 2: malformed numbers");
  out = screen({{1, 1, 1, 4}, {3, 1, 1, 4}}, Screening{0, 0, comm::Combine::kMedian, 1});
  EXPECT_EQ(out.weights, (std::vector<double>{0.5, 0.5}));
}

TEST(Screening, PoisonSpecsAreParsedOrRefusedByName) {
  auto p = parse_poison("1:x100");
  EXPECT_EQ(p.worker, 1);
  EXPECT_EQ(p.scale, 100);
  EXPECT_TRUE(p.hits(1, 7));
  EXPECT_FALSE(p.hits(0, 7));
  p = parse_poison("2:nan@3");
  EXPECT_TRUE(std::isnan(p.scale));
  EXPECT_TRUE(p.hits(2, 3));
  EXPECT_FALSE(p.hits(2, 4));
  EXPECT_EQ(parse_poison("").worker, -1);
  for (const char* bad : {"1", "x:x2", "1:y2", "1:x", "1:nan@", "-1:x2", "1:xinf"}) {
    testing_util::expect_error<ConfigError>([&] { parse_poison(bad); }, "sync.poison = '" + std::string(bad) + "'");
  }
}

struct Synced {
  SyncReport report;
  std::vector<torch::Tensor> theta;  // the model after the run: θ
  std::vector<torch::Tensor> start;
};

// `ranks` ranks, H = 2 and `steps` steps (eager: eager outer updates): rank r moves every
// parameter by 0.01·(r + 1) a step, so its outer gradient is Δ_r = −0.02·(r + 1) everywhere.
// Returns each rank's model at the end and its last report, whose `rejected` counts the
// contributions all its syncs found left out.
std::vector<Synced> run_syncs(int64_t ranks, int64_t steps, bool eager, comm::Encoding exchange, const Screening& screening,
                              const std::string& poison, const std::string& prefix) {
  auto store = std::make_shared<comm::MemoryKeyValueStore>();
  auto results = run_ranks<Synced>(ranks, [&](int64_t rank) {
    model::Transformer model(tiny_model(), 5);
    StreamingOptions o;
    o.inner_steps = 2;
    o.total_steps = steps;
    o.fragments = 1;
    o.overlap_steps = 0;
    o.merge_alpha = 0;
    o.eager = eager;
    o.exchange = exchange;
    o.outer = optim::default_outer_options(optim::OuterKind::kSgd);
    o.screening = screening;
    o.poison = parse_poison(poison);
    StreamingDiLoCo sync(connect(store, rank, ranks, prefix), o);
    sync.on_start(model, 0);
    Synced out;
    out.start = snapshot(model);
    int64_t rejected = 0;
    for (int64_t step = 0; step < steps; ++step) {
      {
        torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) p.add_(0.01 * static_cast<double>(rank + 1));
      }
      StepContext context{step, 32, &model};
      for (const auto& report : sync.after_step(context)) {
        out.report = report;
        rejected += report.rejected;
      }
    }
    out.report.rejected = rejected;
    out.theta = snapshot(model);
    return out;
  });
  std::vector<Synced> out;
  for (auto& r : results) {
    EXPECT_FALSE(r.error) << r.message();
    if (r.value) out.push_back(*r.value);
  }
  return out;
}

// Four ranks, two steps, one sync at the end.
std::vector<Synced> one_sync(comm::Encoding exchange, const Screening& screening, const std::string& poison,
                             const std::string& prefix) {
  return run_syncs(4, 2, false, exchange, screening, poison, prefix);
}

// θ − start, the same everywhere (checked), on rank 0.
double moved(const Synced& s, double tolerance) {
  const double by = (s.theta[0] - s.start[0]).view({-1})[0].item<double>();
  for (size_t i = 0; i < s.theta.size(); ++i) {
    EXPECT_TRUE(torch::allclose(s.theta[i] - s.start[i], torch::full_like(s.start[i], by), 0, tolerance)) << i;
  }
  return by;
}

TEST(Screening, AnOuterGradientTimesAHundredIsLeftOutOrMovesEveryone) {
  // Without screening, rank 3's 100x share moves θ by (0.02 + 0.04 + 0.06 + 8) / 4.
  auto harmed = one_sync(comm::Encoding::kFp32, Screening{}, "3:x100", "harm");
  ASSERT_EQ(harmed.size(), 4u);
  EXPECT_NEAR(moved(harmed[0], 1e-5), (0.02 + 0.04 + 0.06 + 8.0) / 4, 1e-5);
  EXPECT_EQ(harmed[0].report.rejected, 0);

  for (const auto exchange : {comm::Encoding::kFp32, comm::Encoding::kBf16}) {
    const auto what = to_string(exchange);
    auto kept = one_sync(exchange, Screening{10, 0}, "3:x100", std::string("reject-") + what);
    ASSERT_EQ(kept.size(), 4u);
    EXPECT_NEAR(moved(kept[0], 1e-4), 0.04, 1e-4) << what << ": the mean of the other three";
    for (const auto& rank : kept) {
      EXPECT_EQ(rank.report.rejected, 1);
      EXPECT_EQ(rank.report.world_size, 4);
      EXPECT_EQ(rank.report.params_hash, kept[0].report.params_hash);
      EXPECT_NE(rank.report.screening.find("rank 3: norm"), std::string::npos) << rank.report.screening;
    }
    EXPECT_EQ(kept[3].report.weight, 0.0);
  }
}

// A robust mean needs no norm: the median of 0.02, 0.04, 0.06 and 8 is 0.05, whatever rank 3 states.
TEST(Screening, AMedianOfTheOuterGradientsHoldsAgainstOneFarOff) {
  for (const auto exchange : {comm::Encoding::kFp32, comm::Encoding::kE3M0}) {
    const auto what = to_string(exchange);
    auto kept = one_sync(exchange, Screening{0, 0, comm::Combine::kMedian, 1}, "3:x100", std::string("median-") + what);
    ASSERT_EQ(kept.size(), 4u);
    EXPECT_NEAR(moved(kept[0], exchange == comm::Encoding::kFp32 ? 1e-6 : 0.02), 0.05, exchange == comm::Encoding::kFp32 ? 1e-6 : 0.02)
        << what;
    EXPECT_EQ(kept[0].report.rejected, 0);
  }
}

TEST(Screening, ANotFiniteOuterGradientIsLeftOut) {
  for (const auto exchange : {comm::Encoding::kFp32, comm::Encoding::kE3M0}) {
    const auto what = to_string(exchange);
    auto kept = one_sync(exchange, Screening{}, "1:nan", std::string("nan-") + what);
    ASSERT_EQ(kept.size(), 4u);
    const double by = moved(kept[0], exchange == comm::Encoding::kFp32 ? 1e-6 : 0.02);
    EXPECT_TRUE(std::isfinite(by));
    if (exchange == comm::Encoding::kFp32) EXPECT_NEAR(by, (0.02 + 0.06 + 0.08) / 3, 1e-6);
    EXPECT_EQ(kept[2].report.rejected, 1);
    EXPECT_EQ(kept[2].report.screening, "rank 1: not finite");
  }
  Screening off;
  off.reject_not_finite = false;  // what it prevents: θ takes the NaN
  auto harmed = one_sync(comm::Encoding::kFp32, off, "1:nan", "nan-kept");
  ASSERT_EQ(harmed.size(), 4u);
  EXPECT_TRUE(std::isnan(harmed[0].theta[0].view({-1})[0].item<double>()));
}

TEST(Screening, ClippingBoundsEveryOuterGradientsNorm) {
  // Clipped to rank 0's norm, every Δ_r becomes Δ_0: θ moves by 0.02, sent as θ_m (fp32) or Δ_m (bf16).
  int64_t values = 0;
  for (const auto& p : model::Transformer(tiny_model(), 5)->parameters()) values += p.numel();
  const double norm0 = 0.02 * std::sqrt(static_cast<double>(values));
  for (const auto exchange : {comm::Encoding::kFp32, comm::Encoding::kBf16}) {
    auto clipped = one_sync(exchange, Screening{0, norm0 * 1.000001}, "", std::string("clip-") + to_string(exchange));
    ASSERT_EQ(clipped.size(), 4u);
    EXPECT_NEAR(moved(clipped[0], 1e-4), 0.02, 2e-4) << to_string(exchange);
    EXPECT_EQ(clipped[0].report.rejected, 0);
    EXPECT_NE(clipped[0].report.screening.find("rank 3: norm"), std::string::npos);
  }
}

// Eager updates (docs/streaming.md): every sync, each worker steps with the others' share of the
// last sum and its own fresh outer gradient. Three syncs over six steps.
std::vector<Synced> eager_syncs(int64_t ranks, const Screening& screening, const std::string& poison,
                                const std::string& prefix) {
  return run_syncs(ranks, 6, true, comm::Encoding::kFp32, screening, poison, prefix);
}

// Rank 3 sends its outer gradient x100 at every sync. Screened by norm, it is left out of every sum,
// and takes back the fresh share of its own it applied a sync before: with a linear outer step every
// replica ends exactly as the eager run of the three others alone does. Unscreened, it moves θ by
// about 100 times as much.
TEST(Screening, EagerUpdatesLeaveOutAFarOffOuterGradientAsIfItsWorkerWereAbsent) {
  const auto three = eager_syncs(3, Screening{}, "", "eager-three");
  ASSERT_EQ(three.size(), 3u);
  const double clean = moved(three[0], 1e-5);
  EXPECT_NEAR(clean, 3 * 0.04, 1e-4) << "three syncs of the others' mean move, 0.04 each";
  const auto screened = eager_syncs(4, Screening{10, 0}, "3:x100", "eager-screened");
  ASSERT_EQ(screened.size(), 4u);
  for (const auto& rank : screened) {
    EXPECT_NEAR(moved(rank, 1e-5), clean, 1e-5) << "every replica, rank 3's too, as without rank 3";
    EXPECT_EQ(rank.report.rejected, 2) << "the sums of the 2nd and 3rd syncs (the 1st steps with no sum yet)";
  }
  const auto harmed = eager_syncs(4, Screening{}, "3:x100", "eager-harmed");
  ASSERT_EQ(harmed.size(), 4u);
  EXPECT_GT(std::abs(moved(harmed[0], 1e-4)), 2.0);
  EXPECT_EQ(harmed[0].report.rejected, 0);
}

}  // namespace
}  // namespace loco::algorithms
