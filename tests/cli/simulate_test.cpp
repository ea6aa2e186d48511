// `loco simulate` (runtime/simulate/simulate.h): closed-form cases, the inverse, and the published
// simulation it imitates (Kale et al. 2025, arXiv 2502.12996, Table 5, which extends the Streaming
// DiLoCo paper's simulation table with overlapped variants).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include <fstream>
#include <optional>

#include "loco/core/error.h"
#include "loco/model/transformer.h"
#include "loco/runtime/simulate/simulate.h"
#include "process_util.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

SimulationOptions base(SimulatedAlgorithm algorithm) {
  SimulationOptions o;
  o.parameters = 1e8;
  o.layers = 12;
  o.step_s = 0.5;
  o.workers = 4;
  o.algorithm = algorithm;
  o.inner_steps = 50;
  o.bits = 32;
  o.bandwidth_bps = 1e9;
  o.latency_s = 0.05;
  o.transport = SimulationOptions::Transport::kIdeal;  // a ring of one-way hops, no control ring
  o.steps = 1000;
  return o;
}

TEST(SimulateTest, RingAllReduceCostsTwiceTheShareOfEachWorkerPlusItsHops) {
  // 2 (M − 1)/M × B × 8 / W + 2 (M − 1) λ
  EXPECT_DOUBLE_EQ(ring_all_reduce_s(1e6, 4, 8e6, 0.0), 1.5);
  EXPECT_DOUBLE_EQ(ring_all_reduce_s(1e6, 4, 8e6, 0.05), 1.5 + 0.3);
  EXPECT_DOUBLE_EQ(ring_all_reduce_s(1e6, 1, 8e6, 0.05), 0.0);
}

TEST(SimulateTest, BlockingMethodsMatchTheirClosedForms) {
  const auto ddp = base(SimulatedAlgorithm::kDdp);
  const double ddp_exchange = ring_all_reduce_s(4e8, 4, 1e9, 0.05);
  auto r = simulate(ddp);
  EXPECT_NEAR(r.utilization, 0.5 / (0.5 + ddp_exchange), 1e-9);
  EXPECT_NEAR(r.bytes_sent, 1000 * 1.5 * 4e8, 1);

  // DiLoCo: one exchange every H steps, waited for at once; 1000 steps = 20 rounds exactly.
  const auto diloco = base(SimulatedAlgorithm::kDiLoCo);
  r = simulate(diloco);
  EXPECT_NEAR(r.wall_s, 1000 * 0.5 + 20 * ddp_exchange, 1e-6);

  // Streaming, τ = 0: P exchanges of 1/P each per H steps, plus the last step's exchange of every
  // fragment whose sync started before it (fragments 1..3 have offsets 12, 25, 37).
  auto streaming = base(SimulatedAlgorithm::kStreaming);
  streaming.fragments = 4;
  r = simulate(streaming);
  const double fragment_exchange = ring_all_reduce_s(1e8, 4, 1e9, 0.05);
  const int64_t syncs = 20 + 3 * 19 + 3;
  EXPECT_NEAR(r.wall_s, 1000 * 0.5 + static_cast<double>(syncs) * fragment_exchange, 1e-6);
}

TEST(SimulateTest, TheGlooRingCostsARoundTripPerHopAndAWeightsRingPerSync) {
  auto diloco = base(SimulatedAlgorithm::kDiLoCo);
  diloco.transport = SimulationOptions::Transport::kGlooRing;
  diloco.bucket_bytes = 0;  // one collective
  const double hop = 2 * 0.05;
  const double sync = ring_all_reduce_s(24, 4, 1e9, hop) + ring_all_reduce_s(4e8, 4, 1e9, hop);
  EXPECT_NEAR(simulate(diloco).wall_s, 1000 * 0.5 + 20 * sync, 1e-6);
  auto ddp = base(SimulatedAlgorithm::kDdp);
  ddp.transport = SimulationOptions::Transport::kGlooRing;  // no weights ring; 400 MB in 13 buckets of 32 MB, each with its hops
  ddp.bucket_bytes = 32e6;
  EXPECT_NEAR(simulate(ddp).wall_s, 1000 * (0.5 + ring_all_reduce_s(4e8, 4, 1e9, 0) + 13 * 6 * hop), 1e-6);
}

// loco's direct all-reduce: a scatter's 2(M − 1)/M of the bytes and 3 one-way delays, or a
// gather's (M − 1) times the bytes and 2 delays, whichever is faster (a gather only while the
// others' tensors fit in 64 MiB; always at M = 2).
TEST(SimulateTest, TheDirectTransportCostsTwoOrThreeDelaysPerExchange) {
  auto diloco = base(SimulatedAlgorithm::kDiLoCo);
  diloco.transport = SimulationOptions::Transport::kDirect;
  auto r = simulate(diloco);  // 400 MB at M = 4: too big to gather
  EXPECT_NEAR(r.wall_s, 1000 * 0.5 + 20 * (1.5 * 4e8 * 8 / 1e9 + 3 * 0.05), 1e-6);
  EXPECT_NEAR(r.bytes_sent, 20 * 1.5 * 4e8, 1);
  diloco.workers = 2;
  r = simulate(diloco);
  EXPECT_NEAR(r.wall_s, 1000 * 0.5 + 20 * (4e8 * 8 / 1e9 + 2 * 0.05), 1e-6);
  // A small exchange among 4 over a long link gathers: 3 × 1 MB + 2 delays beats 1.5 MB + 3.
  diloco.workers = 4;
  diloco.parameters = 2.5e5;
  r = simulate(diloco);
  EXPECT_NEAR(r.wall_s, 1000 * 0.5 + 20 * (3 * 1e6 * 8 / 1e9 + 2 * 0.05), 1e-6);
  EXPECT_NEAR(r.bytes_sent, 20 * 3 * 1e6, 1);
}

TEST(SimulateTest, OverlapHidesAnExchangeShorterThanWhatItOverlaps) {
  auto streaming = base(SimulatedAlgorithm::kStreaming);
  streaming.fragments = 4;
  streaming.overlap_steps = 5;  // 2.5 s of compute against 1.2 + 0.3 s of exchange
  streaming.final_sync = false;
  auto r = simulate(streaming);
  EXPECT_DOUBLE_EQ(r.utilization, 1.0);
  // Only the run's last step waits: for the fragments synced there, one after another.
  streaming.final_sync = true;
  r = simulate(streaming);
  EXPECT_NEAR(r.wall_s, 500 + 4 * ring_all_reduce_s(1e8, 4, 1e9, 0.05), 1e-6);
  streaming.final_sync = false;

  auto slow = streaming;
  slow.bandwidth_bps = 1e8;  // 12 s + 0.3 s per fragment: τ hides 2.5 s of it
  r = simulate(slow);
  EXPECT_LT(r.utilization, 0.8);

  // Eager: a whole round (25 s) to hide each exchange of the whole model (2.4 s + 0.3 s at 1 Gbit/s).
  auto eager = base(SimulatedAlgorithm::kDiLoCo);
  eager.eager = true;
  eager.final_sync = false;
  const auto blocking = simulate(base(SimulatedAlgorithm::kDiLoCo));
  r = simulate(eager);
  EXPECT_DOUBLE_EQ(r.utilization, 1.0);
  // The end: the last exchange (issued at step 1000, after the one of step 950 was waited for),
  // then θ averaged in fp32.
  eager.final_sync = true;
  r = simulate(eager);
  EXPECT_NEAR(r.wall_s, 500 + 2 * ring_all_reduce_s(4e8, 4, 1e9, 0.05), 1e-6);
  EXPECT_GT(r.utilization, blocking.utilization);
}

// As loco ends a run: a fragment whose result is applied at the last step is not synced again.
// H = 50, P = 4, τ = 5, 290 steps: fragment 3 (offset 37) synced at 287, due at 290 (capped), so the
// last step waits for it and issues the other three; nothing else.
TEST(SimulateTest, TheLastStepDoesNotSyncAFragmentJustApplied) {
  auto streaming = base(SimulatedAlgorithm::kStreaming);
  streaming.fragments = 4;
  streaming.overlap_steps = 5;
  streaming.steps = 290;
  streaming.bandwidth_bps = 1e12;  // exchanges of the latency alone: 6 hops of 50 ms
  const double exchange = ring_all_reduce_s(1e8, 4, 1e12, 0.05);
  const auto r = simulate(streaming);
  // Syncs: fragment 0 at 50..250 (5), 1 at 62..262 (5), 2 at 75..275 (5), 3 at 87..287 (5), then 3 at 290.
  EXPECT_NEAR(r.bytes_sent, 23 * 1.5 * 1e8, 1);
  // Waits: at 290, fragment 3's result (issued at 287: 0.3 s after 1.5 s of compute, none left) and
  // the three last syncs one after another.
  EXPECT_NEAR(r.wall_s, 290 * 0.5 + 3 * exchange, 1e-6);
}

TEST(SimulateTest, TheInverseFindsTheBandwidthOfTheTarget) {
  auto diloco = base(SimulatedAlgorithm::kDiLoCo);
  diloco.latency_s = 0;
  // Closed form: u = H S / (H S + 1.5 · 4e8 · 8 / W)  =>  W = 1.5 · 3.2e9 · u / (H S (1 − u)).
  for (double target : {0.5, 0.9, 0.99}) {
    const double needed = bandwidth_for(diloco, target);
    EXPECT_NEAR(needed, 1.5 * 3.2e9 * target / (25 * (1 - target)), 1e-3 * needed) << target;
  }
  // Latency alone can forbid a target: DDP with 6 hops of 0.5 s against a 0.5 s step never reaches 50%.
  auto ddp = base(SimulatedAlgorithm::kDdp);
  ddp.latency_s = 0.5;
  EXPECT_TRUE(std::isinf(bandwidth_for(ddp, 0.5)));
  EXPECT_THROW(bandwidth_for(diloco, 1.5), ConfigError);
}

TEST(SimulateTest, OptionsAreValidated) {
  auto o = base(SimulatedAlgorithm::kStreaming);
  o.fragments = 13;  // more than the 12 layers
  EXPECT_THROW(simulate(o), ConfigError);
  o = base(SimulatedAlgorithm::kDdp);
  o.eager = true;
  EXPECT_THROW(simulate(o), ConfigError);
  o = base(SimulatedAlgorithm::kDiLoCo);
  o.step_s = 0;
  EXPECT_THROW(simulate(o), ConfigError);
}

// The Streaming DiLoCo paper's own table (Douillard et al. 2025, Table 4: Data-Parallel, DiLoCo,
// Streaming DiLoCo with τ = 0, τ = 1, and τ = 1 in FP4; 75 cells): every cell within one step of
// the published grid (21%) once ours is rounded up to it, but one: 100B Streaming DiLoCo (τ = 0) at
// 99%, where we need 13.3 Gbit/s and the table 19.3, two steps (docs/slow-links.md says why).
TEST(SimulateTest, MatchesTheStreamingDiLoCoPapersSimulationWithinOneGridStep) {
  int checked = 0;
  for (const auto& row : published_simulation()) {
    if (row.tables.find("Douillard T4") == std::string::npos) continue;
    for (size_t i = 0; i < kPublishedTargets.size(); ++i) {
      const double ours = on_published_grid(bandwidth_for(published_options(row), kPublishedTargets[i]) / 1e9);
      const int steps = std::abs(published_grid_index(ours) - published_grid_index(row.gbits[i]));
      const bool exception = row.model == "100B" && row.method == "Streaming DiLoCo" && i == 4;
      EXPECT_LE(steps, exception ? 2 : 1) << row.model << " " << row.method << " at " << kPublishedTargets[i] * 100
                                          << "%: published " << row.gbits[i] << ", ours " << ours;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 75);
}

// Kale et al.'s own rows (FP4 overlapped by τ = 1 at H = 30, and eager at H = 30 and 100) are not
// matched (docs/slow-links.md prints both), and cannot all be by a simulation in which every worker
// sends every fragment once a round: for eager at H = 100, and eager or τ = 1 at 100B and H = 30,
// the table's bandwidth for 99% carries less than one FP4 copy of the model per round of compute,
// the least any all-reduce among 2 workers sends (each needs the other's half, then the other's sum).
TEST(SimulateTest, SomeOfKaleEtAlsOverlappedRowsCarryLessThanTheModelOnceARound) {
  int below = 0;
  for (const auto& row : published_simulation()) {
    if (row.tables != "Kale T5") continue;
    const auto o = published_options(row);
    const double round_s = static_cast<double>(o.inner_steps) * o.step_s / 0.99;
    const double least_gbits = o.parameters * o.bits / round_s / 1e9;
    const bool expected_below = row.method.find("H=100") != std::string::npos || row.model == "100B" ||
                                (row.model == "10B" && row.method.starts_with("1-outer"));
    EXPECT_EQ(row.gbits[4] < least_gbits, expected_below) << row.model << " " << row.method << ": " << row.gbits[4]
                                                          << " Gbit/s published, one copy a round needs " << least_gbits;
    below += row.gbits[4] < least_gbits;
  }
  EXPECT_EQ(below, 6);
}

TEST(SimulateTest, PublishedGridRoundsUp) {
  EXPECT_NEAR(on_published_grid(86.0), 86.85, 0.01);
  EXPECT_NEAR(on_published_grid(0.1), 0.1, 1e-9);
  EXPECT_NEAR(on_published_grid(4.0), 4.29, 0.01);
  EXPECT_TRUE(std::isinf(on_published_grid(2000)));
}

TEST(SimulateTest, ReadsARunsConfigAndWhatItMeasured) {
  auto config = parse_config(R"([model]
vocab_size = 4096
context = 64
layers = 4
width = 128
heads = 4
[train]
steps = 300
[sync]
algorithm = "streaming"
inner_steps = 50
fragments = 4
overlap_steps = 5
exchange = "e3m0"
[cluster]
workers = 4
[link]
rate = "100mbit"
delay = "50ms"
)", "test");
  const auto o = simulation_options(config);
  EXPECT_EQ(o.parameters, static_cast<double>(model::parameter_count(config.model)));
  EXPECT_EQ(o.layers, 4);
  EXPECT_EQ(o.algorithm, SimulatedAlgorithm::kStreaming);
  EXPECT_EQ(o.fragments, 4);
  EXPECT_EQ(o.overlap_steps, 5);
  EXPECT_EQ(o.bits, 4);
  EXPECT_EQ(o.steps, 300);
  EXPECT_DOUBLE_EQ(o.bandwidth_bps, 100e6);
  EXPECT_DOUBLE_EQ(o.latency_s, 0.05);
  config.sync.algorithm = Algorithm::kDdp;
  EXPECT_EQ(simulation_options(config).bits, 32) << "DDP sends fp32 gradients whatever sync.exchange says";
  config.sync.algorithm = Algorithm::kLocal;
  EXPECT_THROW(simulation_options(config), ConfigError);

  // JSON round trip of the options, every field away from its default.
  auto changed = o;
  changed.inner_steps = 7;
  changed.eager = true;
  changed.overlap_steps = 0;
  changed.overlap_backward = true;
  changed.final_sync = false;
  changed.concurrent_exchanges = true;
  changed.transport = SimulationOptions::Transport::kGlooRing;
  changed.bucket_bytes = 123;
  changed.step_s = 0.25;
  changed.exchange_s_per_value = 3e-8;
  changed.sync_s_per_value = 2e-8;
  changed.outside_loop_s = 12;
  const auto back = simulation_options_from_json(to_json(changed));
  EXPECT_EQ(to_json(back), to_json(changed));
  EXPECT_TRUE(back.eager && back.overlap_backward && !back.final_sync && back.concurrent_exchanges &&
              back.transport == SimulationOptions::Transport::kGlooRing);
  EXPECT_EQ(back.inner_steps, 7);
  EXPECT_EQ(back.bucket_bytes, 123);
  EXPECT_EQ(back.outside_loop_s, 12);
  EXPECT_THROW(simulation_options_from_json(nlohmann::json{{"parameters", 1}}), DataError);

  // A run's summaries: the slowest worker's step time (the others wait for it), the workers' means.
  testing_util::TempDir dir;
  std::ofstream(dir.path() / "metrics.jsonl")
      << R"({"event":"train","worker":0,"step":1})" << "\n"
      << R"({"event":"summary","worker":0,"steps":300,"compute_s":60,"compute_utilization":0.8,"end_to_end_utilization":0.75,"bytes_sent":1000})" << "\n"
      << R"({"event":"summary","worker":1,"steps":300,"compute_s":30,"compute_utilization":0.6,"end_to_end_utilization":0.55,"bytes_sent":3000})" << "\n";
  const auto m = measure_run(dir.path());
  EXPECT_DOUBLE_EQ(m.step_s, 60.0 / 300);
  EXPECT_DOUBLE_EQ(m.loop_s, (75.0 + 50.0) / 2);
  EXPECT_DOUBLE_EQ(m.utilization, 0.7);
  EXPECT_DOUBLE_EQ(m.end_to_end, 0.65);
  EXPECT_DOUBLE_EQ(m.bytes_sent, 2000);
  EXPECT_EQ(m.workers, 2);
  EXPECT_THROW(measure_run(dir.path() / "nothing"), DataError);
}

// The machine's costs of a sync, fitted on a run over no link, enter the replay: each sync's share of
// the training thread before its exchange, the exchange's compute in series with its bytes, and the
// time outside the loop in the run's wall time.
TEST(SimulateTest, TheMachinesCostsOfASyncAreFittedOnARunOverNoLinkAndReplayed) {
  auto o = base(SimulatedAlgorithm::kDiLoCo);  // blocking: each sync adds its costs in full
  o.steps = 100;
  MeasuredRun ideal;
  ideal.syncs = 2;                 // per worker
  ideal.sync_median_s = 0.4;       // over no link: the exchange's own compute
  ideal.compute_s = 50;
  ideal.stall_s = 1;
  ideal.loop_s = 53;               // 2 s beyond computing and waiting: 1 s of the training thread per sync
  ideal.wall_s = 60;
  fit_machine_costs(o, ideal);
  EXPECT_DOUBLE_EQ(o.exchange_s_per_value * o.parameters, 0.4);
  EXPECT_DOUBLE_EQ(o.sync_s_per_value * o.parameters, 1.0);
  EXPECT_DOUBLE_EQ(o.outside_loop_s, 7);
  const auto plain = [&] {
    auto p = o;
    p.exchange_s_per_value = p.sync_s_per_value = p.outside_loop_s = 0;
    return simulate(p);
  }();
  const auto fitted = simulate(o);
  EXPECT_NEAR(fitted.wall_s, plain.wall_s + 2 * (1.0 + 0.4), 1e-9) << "two syncs, each 1 s + 0.4 s more";
  EXPECT_NEAR(fitted.run_s, fitted.wall_s + 7, 1e-9);
  EXPECT_EQ(plain.run_s, plain.wall_s);
  // Streaming DiLoCo's fragments carry a P-th of the values each.
  auto streaming = base(SimulatedAlgorithm::kStreaming);
  streaming.fragments = 4;
  fit_machine_costs(streaming, ideal);
  EXPECT_DOUBLE_EQ(streaming.exchange_s_per_value * streaming.parameters / 4, 0.4);
  ideal.syncs = 0;
  EXPECT_THROW(fit_machine_costs(o, ideal), DataError) << "a run without timed syncs fits nothing";
}

// The runs of a file bench/wan.sh wrote, each predicted from its settings and measured step time:
// its time in the training loop and its bytes within 15% (DDP's loop time within `ddp_tolerance`).
// Returns how many runs the file holds.
size_t expect_predicted_within_15_percent(const char* file, std::optional<SimulationOptions::Transport> transport,
                                          double ddp_tolerance = 0.15) {
  std::ifstream in(testing_util::source_dir() / file);
  EXPECT_TRUE(in) << file << " is missing (docs/slow-links.md says how it is made)";
  if (!in) return 0;
  const auto runs = nlohmann::json::parse(in);
  for (const auto& run : runs) {
    const auto name = run.at("run").get<std::string>();
    const auto options = simulation_options_from_json(run.at("options"));
    if (transport) EXPECT_EQ(options.transport, *transport) << name;
    const auto measured = measured_run_from_json(run.at("measured"));
    const auto predicted = simulate(options);
    const double tolerance = options.algorithm == SimulatedAlgorithm::kDdp ? ddp_tolerance : 0.15;
    EXPECT_NEAR(predicted.wall_s, measured.loop_s, tolerance * measured.loop_s) << name;
    EXPECT_NEAR(predicted.bytes_sent, measured.bytes_sent, 0.15 * measured.bytes_sent) << name;
  }
  return runs.size();
}

// The measured benchmark on the transport before the direct all-reduce (bench/wan.sh over emulated
// links, bench/results/wan-gloo-ring.json); the simulator's model of Gloo's ring was fitted to these.
TEST(SimulateTest, PredictsTheMeasuredBenchmarkWithin15Percent) {
  EXPECT_EQ(expect_predicted_within_15_percent("bench/results/wan-gloo-ring.json", std::nullopt), 18u)
      << "6 methods over 3 links";
}

// Runs on the direct transport (bench/results/wan-direct.json: DDP at 1 Gbit/s, DiLoCo at
// 100 Mbit/s, Streaming τ = 5 e3m0 at all three links, 50 ms), measured after the simulator's
// model of that transport was written, not fitted to them.
TEST(SimulateTest, PredictsTheDirectTransportsRunsWithin15Percent) {
  EXPECT_EQ(expect_predicted_within_15_percent("bench/results/wan-direct.json", SimulationOptions::Transport::kDirect), 5u);
}

// The benchmark again on the direct transport, each worker held to a CPU share of its own, with
// glibc's default malloc (bench/results/wan-glibc-malloc.json, docs/slow-links.md "With glibc's
// default malloc": 7 methods at 1 Gbit/s and 100 Mbit/s, all but DDP at 10 Mbit/s), also methods
// the simulator's direct model was not checked on before: DiLoCo with e3m0, eager DiLoCo,
// Streaming τ = 1 in fp32. DDP's two runs are predicted 14–16% fast, and are held to 20%: each of
// its 300 steps waits for the slowest of the four workers at that step, whose speeds then differed
// by up to 10% (the page faults of core/allocator.h); the simulator knows the slowest worker's
// mean step time and nothing of the per-step spread.
TEST(SimulateTest, PredictsTheBenchmarkWithGlibcsMallocWithin15Percent) {
  EXPECT_EQ(expect_predicted_within_15_percent("bench/results/wan-glibc-malloc.json", SimulationOptions::Transport::kDirect,
                                               0.20),
            20u);
}

// The benchmark as it is now (bench/results/wan.json, docs/slow-links.md "Measured"): the same 20
// runs with malloc keeping each step's tensors mapped, so the workers compute at nearer one speed;
// measured after the simulator was last changed. Every run within 15%, DDP's too (11% and 14% fast).
TEST(SimulateTest, PredictsTheWholeBenchmarkOnTheDirectTransportWithin15Percent) {
  EXPECT_EQ(expect_predicted_within_15_percent("bench/results/wan.json", SimulationOptions::Transport::kDirect), 20u);
}

TEST(SimulateTest, TheCommandPrintsThePredictionAndTheBandwidthNeeded) {
  testing_util::TempDir dir;
  const std::string config = testing_util::source_dir().string() + "/configs/brown.toml";
  auto r = testing_util::run_command({testing_util::loco_binary(), "simulate", "--config", config, "--params", "1e9", "--layers", "24",
                                      "--step-time", "0.5", "--link", "rate=1gbit,delay=50ms", "--sync.algorithm=diloco",
                                      "--sync.inner_steps=100", "--target", "0.97"},
                                     (dir.path() / "out.log").string(), std::chrono::seconds(60));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("model 1e+09 parameters, 24 layers; step 0.5 s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("over 1 Gbit/s, 50 ms one-way, as loco runs it: compute utilization"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("97%: "), std::string::npos) << r.output;
  // Without a step time it says how to give one.
  r = testing_util::run_command({testing_util::loco_binary(), "simulate", "--config", config, "--params", "1e9"},
                                (dir.path() / "bad.log").string(), std::chrono::seconds(60));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("give the step time"), std::string::npos) << r.output;
  r = testing_util::run_command({testing_util::loco_binary(), "simulate", "--published"}, (dir.path() / "published.log").string(),
                                std::chrono::seconds(60));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("| 100B | Streaming DiLoCo | Douillard T4, Kale T5 | 2.4 / 2.9 (+1) |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| 1B | DiLoCo | Douillard T4 | 1.4 / 1.7 (+1) | 6.2 / 6.3 |"), std::string::npos) << r.output;
}

// Held out: the runs at model scale over shaped links (bench/results/wan-scale-m{4,8,16}.json,
// wan-scale-m8-900steps.json and wan-scale-m8-cpu.json, written by bench/wan-scale.sh; docs/slow-links.md "Fitted on a run over no link, held out on
// shaped ones"), each predicted by `loco simulate --from-run RUN --fit IDEAL`: its costs fitted on
// the same method's run over no link, never on a shaped one. Streaming DiLoCo's runs are within
// 10% of their wall time at 4 and 8 islands, 15% at 16; so are DiLoCo's and DDP's at 100 Mbit/s
// and below, where their bytes dominate. Faster, their fp32 exchanges take more than their bytes
// plus their compute on this machine's emulated islands (the relay and TCP under an all-to-all on
// 2 cores), which the simulator does not model: it predicts them fast, and the test says so. A model
// without communication (the same steps at the same step time, nothing else; or with the fitted
// costs but no link) is off by more than 10% on at least half of the runs.
TEST(SimulateTest, FittedOnRunsOverNoLinkPredictsTheShapedRunsAtModelScale) {
  int held_out = 0, streaming = 0, bare_misses = 0, linkless_misses = 0;
  for (const char* file : {"bench/results/wan-scale-m4.json", "bench/results/wan-scale-m8.json", "bench/results/wan-scale-m16.json",
                           "bench/results/wan-scale-m8-900steps.json", "bench/results/wan-scale-m8-cpu.json"}) {
    std::ifstream in(testing_util::source_dir() / file);
    ASSERT_TRUE(in) << file << " is missing (bench/wan-scale.sh writes it)";
    const auto results = nlohmann::json::parse(in);
    for (const auto& run : results.at("runs")) {
      if (!run.contains("simulated") || run.at("simulated").is_null()) continue;
      const auto name = fmt::format("{} islands, {} {}", results.at("workers").get<int>(), run.at("link").get<std::string>(),
                                    run.at("report").at("name").get<std::string>());
      const auto options = simulation_options_from_json(run.at("simulated").at("options"));
      const auto measured = measured_run_from_json(run.at("simulated").at("measured"));
      ASSERT_GT(options.exchange_s_per_value, 0) << name << ": fitted";
      ASSERT_GT(measured.wall_s, 0) << name;
      ++held_out;
      const double ratio = simulate(options).run_s / measured.wall_s;
      if (options.algorithm == SimulatedAlgorithm::kStreaming) {
        ++streaming;
        // 16 islands on 2 cores: the relay runs up to 0.46 s late, which the run over no link (on
        // loopback) does not pay and the simulator does not model; held to 15%.
        EXPECT_NEAR(ratio, 1.0, options.workers >= 16 ? 0.15 : 0.10) << name;
      } else if (options.bandwidth_bps <= 100e6) {
        // DiLoCo's and DDP's fp32 exchanges where the bytes dominate them: within 10%.
        EXPECT_NEAR(ratio, 1.0, 0.10) << name;
      } else {
        EXPECT_LT(ratio, 1.0) << name << ": the simulator does not model the emulator's slow fp32 all-to-all; if it now "
                                         "predicts this run, say so in docs/slow-links.md";
      }
      auto linkless = options;  // the machine's costs, no link
      linkless.bandwidth_bps = 1e14;
      linkless.latency_s = 0;
      const double no_link = simulate(linkless).run_s / measured.wall_s;
      const double compute = static_cast<double>(options.steps) * options.step_s / measured.wall_s;
      if (std::abs(no_link - 1) > 0.10) ++linkless_misses;
      if (std::abs(compute - 1) > 0.10) ++bare_misses;
      fmt::print("{}: predicted / measured wall time {:.3f}; no link {:.3f}; compute alone {:.3f}\n", name, ratio, no_link, compute);
    }
  }
  EXPECT_EQ(held_out, 23) << "4 islands: 2 runs; 8: 14, one of 900 steps and 3 with CPU shares; 16: 3";
  EXPECT_EQ(streaming, 11);
  EXPECT_GE(2 * bare_misses, held_out) << "compute alone misses at least half";
  EXPECT_GE(2 * linkless_misses, held_out) << "no link misses at least half";
}

}  // namespace
}  // namespace loco::runtime
