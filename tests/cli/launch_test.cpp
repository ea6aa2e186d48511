// Multi-process runs end to end: `loco launch` (a coordinator and real worker processes over
// loopback), `loco coordinator` with `loco worker`, real signals (SIGINT, SIGKILL), and the errors
// of bad input. Tiny model, short timeouts.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fstream>
#include <sstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "loco/core/files.h"
#include "loco/core/run_folder.h"
#include "process_util.h"
#include "test_util.h"
#include "cli_util.h"

namespace loco {
namespace {

using testing_util::Child;
using testing_util::free_port;
using testing_util::processes_mentioning;
using testing_util::run_command;
using testing_util::TempDir;
using namespace std::chrono_literals;

class LaunchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_NO_FATAL_FAILURE(testing_util::prepare_tiny_dataset(dir_->path(), data()));
    std::ofstream(config()) << testing_util::tiny_launch_config(3);
  }
  static void TearDownTestSuite() { delete dir_; }
  void TearDown() override {
    const auto left = processes_mentioning(dir_->path().string());
    EXPECT_TRUE(left.empty()) << "a loco process outlived its test:\n" << testing_util::describe_processes(left);
  }

  static fs::path data() { return dir_->path() / "data"; }
  static fs::path config() { return dir_->path() / "tiny.toml"; }
  static fs::path run(const std::string& name) { return dir_->path() / name; }
  static std::string log(const std::string& name) { return (dir_->path() / (name + ".log")).string(); }
  static std::vector<std::string> launch_args(const std::string& name, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {testing_util::loco_binary(), "launch", "--config", config().string(), "--data.dir=" + data().string(),
                                     "--run.dir=" + run(name).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  // The processes of run `name` started as worker `rank` (their command line holds "--rank R").
  static std::vector<pid_t> workers_of_rank(const std::string& name, int rank) {
    const std::string flag = std::string("--rank") + '\0' + std::to_string(rank) + '\0';
    std::vector<pid_t> out;
    for (pid_t pid : processes_mentioning(run(name).string())) {
      std::ifstream in(fmt::format("/proc/{}/cmdline", pid));
      std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (cmdline.find(flag) != std::string::npos) out.push_back(pid);
    }
    return out;
  }
  // The events of a run, also of one still running: a last line not yet ended by its newline is
  // being written, and is left out (read mid-write, it failed to parse once).
  static std::vector<nlohmann::json> events(const std::string& name, const std::string& kind) {
    std::vector<nlohmann::json> out;
    std::ifstream in(run(name) / "metrics.jsonl");
    std::stringstream all;
    all << in.rdbuf();
    std::string text = all.str();
    text.erase(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.at("event") == kind) out.push_back(j);
    }
    return out;
  }
  // The global parameters' hash after the last round, which every worker must agree on.
  static std::string final_hash(const std::string& name) {
    std::map<int64_t, std::string> by_round;
    for (const auto& e : events(name, "sync")) by_round[e["round"].get<int64_t>()] = e["params_hash"].get<std::string>();
    return by_round.empty() ? "" : by_round.rbegin()->second;
  }

  static TempDir* dir_;
};
TempDir* LaunchTest::dir_ = nullptr;

TEST_F(LaunchTest, DiLoCoWorkersHoldIdenticalParametersAfterEveryRound) {
  auto result = run_command(launch_args("diloco"), log("diloco"), 240s);
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find("trained diloco with 3 workers: 40 steps each"), std::string::npos) << result.output;

  // Every worker logs a sync event per round (H = 5 over 40 steps: 8 rounds) and all agree on θ.
  std::map<int64_t, std::set<std::string>> hashes;
  std::map<int64_t, int> per_worker;
  for (const auto& e : events("diloco", "sync")) {
    for (const char* key : {"round", "worker", "world_size", "bytes_sent", "bytes_received", "seconds", "params_hash"}) {
      ASSERT_TRUE(e.contains(key)) << key;
    }
    EXPECT_EQ(e["world_size"], 3);
    hashes[e["round"].get<int64_t>()].insert(e["params_hash"].get<std::string>());
    per_worker[e["worker"].get<int64_t>()] += 1;
    EXPECT_GT(e["bytes_sent"].get<int64_t>(), 0);
  }
  ASSERT_EQ(hashes.size(), 8u);
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "workers disagree on θ after round " << round;
  EXPECT_EQ(per_worker, (std::map<int64_t, int>{{0, 8}, {1, 8}, {2, 8}}));
  EXPECT_NE(hashes[1], hashes[8]) << "θ must move";

  // One summary per worker with its totals. Each round's bytes are those of the route its sync event
  // names (kAuto picks by the measured link, so it may differ between machines): the direct
  // scatter sends 2 (M − 1) / M of the parameters, give or take a chunk's rounding to whole
  // 256-value blocks, the gather (M − 1) times them.
  const double parameter_bytes = 34976 * 4;
  std::map<int64_t, double> expected;
  for (const auto& e : events("diloco", "sync")) {
    const auto route = e["route"].get<std::string>();
    ASSERT_TRUE(route == "scatter" || route == "gather") << route;
    expected[e["worker"].get<int64_t>()] += route == "scatter" ? 2 * 2 * parameter_bytes / 3 : 2 * parameter_bytes;
  }
  auto summaries = events("diloco", "summary");
  ASSERT_EQ(summaries.size(), 3u);
  for (const auto& s : summaries) {
    EXPECT_EQ(s["rounds"], 8);
    EXPECT_EQ(s["bytes_sent"], s["bytes_received"]);
    EXPECT_NEAR(s["bytes_sent"].get<double>(), expected[s["worker"].get<int64_t>()], 8 * 2 * 256 * 4)
        << "8 rounds of 34,976 fp32 parameters";
  }
  // The global parameters are scored once, by worker 0, and `loco eval` finds them in the run.
  for (const auto& e : events("diloco", "eval")) EXPECT_EQ(e["worker"], 0);
  auto eval = run_command({testing_util::loco_binary(), "eval", "--checkpoint", run("diloco").string()}, log("diloco-eval"));
  ASSERT_EQ(eval.status, 0) << eval.output;
  EXPECT_NE(eval.output.find(fmt::format("val_loss {:.4f}", events("diloco", "eval").back()["val_loss"].get<double>())),
            std::string::npos) << eval.output;

  // The shards are recorded: a partition of the training documents.
  auto shards = nlohmann::json::parse(read_file(run("diloco") / "shards.json", "test"));
  EXPECT_EQ(shards["policy"], "iid");
  std::set<int64_t> documents;
  size_t total = 0;
  for (const auto& w : shards["workers"]) {
    for (const auto& d : w["document_indices"]) documents.insert(d.get<int64_t>());
    total += w["document_indices"].size();
  }
  EXPECT_EQ(documents.size(), total) << "no document in two shards";
}

// Streaming DiLoCo with 4-bit exchange: P = 2 fragments, H = 10, τ = 1 over 40 steps: fragment 0
// syncs from step 10, fragment 1 (offset 5) after its own H steps, from step 15, both once more at
// the end: 8 syncs, on which every worker agrees. Checkpoints every 10 steps catch fragment 0 on the wire; a run stopped with
// Ctrl-C and resumed ends on the uninterrupted run's θ.
TEST_F(LaunchTest, StreamingWorkersAgreeAndResumeMidFlight) {
  const std::vector<std::string> streaming = {"--sync.algorithm=streaming", "--sync.fragments=2", "--sync.inner_steps=10",
                                              "--sync.overlap_steps=1", "--sync.exchange=e3m0"};
  auto result = run_command(launch_args("streaming", streaming), log("streaming"), 240s);
  ASSERT_EQ(result.status, 0) << result.output;
  std::map<int64_t, std::set<std::string>> hashes;
  std::map<int64_t, int64_t> fragment_of;
  for (const auto& e : events("streaming", "sync")) {
    for (const char* key : {"fragment", "stall_s", "params_hash", "bytes_sent"}) ASSERT_TRUE(e.contains(key)) << key;
    hashes[e["round"].get<int64_t>()].insert(e["params_hash"].get<std::string>());
    fragment_of[e["round"].get<int64_t>()] = e["fragment"].get<int64_t>();
  }
  ASSERT_EQ(hashes.size(), 8u);
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "workers disagree on θ after sync " << round;
  EXPECT_EQ(fragment_of[1], 0);
  EXPECT_EQ(fragment_of[2], 1);
  std::map<int64_t, int64_t> largest_sync;  // per worker: the most bytes one fragment's sync sent
  for (const auto& e : events("streaming", "sync")) {
    auto& largest = largest_sync[e["worker"].get<int64_t>()];
    largest = std::max(largest, e["bytes_sent"].get<int64_t>());
  }
  for (const auto& s : events("streaming", "summary")) {
    // e3m0 sends a little over 1/8 of fp32's bytes; the syncs are 5 steps apart, so no step but
    // the last (where both fragments sync) carries more than one fragment.
    EXPECT_LT(s["bytes_sent"].get<int64_t>(), 8 * 34976 * 4 / 2 / 4) << "the exchange must be 4-bit";
    EXPECT_GT(s["peak_step_bytes"].get<int64_t>(), 0);
    EXPECT_LE(s["peak_step_bytes"].get<int64_t>(), largest_sync[s["worker"].get<int64_t>()]);
    EXPECT_GT(s["compute_utilization"].get<double>(), 0);
    EXPECT_LE(s["compute_utilization"].get<double>(), 1);
    // End to end: time computing over the whole wall time, which also holds start-up and evaluation.
    EXPECT_GT(s["compute_s"].get<double>(), 0);
    EXPECT_LE(s["compute_s"].get<double>(), s["wall_s"].get<double>());
    EXPECT_GT(s["end_to_end_utilization"].get<double>(), 0);
    EXPECT_LT(s["end_to_end_utilization"].get<double>(), s["compute_utilization"].get<double>());
  }
  EXPECT_NE(result.output.find("compute utilization end to end (time computing / wall time): "), std::string::npos)
      << result.output;
  auto report = run_command({testing_util::loco_binary(), "report", run("streaming").string()}, log("streaming-report"));
  ASSERT_EQ(report.status, 0) << report.output;
  EXPECT_NE(report.output.find("| compute, end to end |"), std::string::npos) << report.output;
  // θ is scored mid-run (step 20) without waiting for a round boundary, and at the end.
  std::vector<int64_t> eval_steps;
  for (const auto& e : events("streaming", "eval")) eval_steps.push_back(e["step"].get<int64_t>());
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{20, 40}));
  auto eval = run_command({testing_util::loco_binary(), "eval", "--checkpoint", run("streaming").string()}, log("streaming-eval"));
  ASSERT_EQ(eval.status, 0) << eval.output;
  EXPECT_NE(eval.output.find(fmt::format("val_loss {:.4f}", events("streaming", "eval").back()["val_loss"].get<double>())),
            std::string::npos) << eval.output;

  auto longer = streaming;
  longer.insert(longer.end(), {"--train.steps=200", "--eval.every=50"});
  auto straight = run_command(launch_args("streaming-straight", longer), log("streaming-straight"), 240s);
  ASSERT_EQ(straight.status, 0) << straight.output;
  Child launcher(launch_args("streaming-stopped", longer), log("streaming-stopped"));
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (events("streaming-stopped", "sync").size() < 3 * 8 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  launcher.signal(SIGINT);
  ASSERT_EQ(launcher.wait(120s), 130) << read_file(log("streaming-stopped"), "test");
  auto args = launch_args("streaming-stopped", longer);
  args.push_back("--resume");
  auto resumed = run_command(args, log("streaming-resumed"), 240s);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_EQ(final_hash("streaming-stopped"), final_hash("streaming-straight"));
}

// Eager updates with elastic membership (docs/streaming.md): without failures the coordinator's
// rounds (one exchange in flight, closed at the next sync; the final averages in rounds of their
// own) change nothing in the arithmetic, and the run ends bit-identical to the fixed one. Stopped
// mid-run (the leader's checkpoint holds the exchange in flight as sent), it resumes to the end.
TEST_F(LaunchTest, ElasticEagerUpdatesEndAsTheFixedRunAndResume) {
  std::vector<std::string> eager = {"--sync.algorithm=streaming", "--sync.fragments=2", "--sync.overlap_steps=0",
                                    "--sync.eager=true"};
  auto fixed = run_command(launch_args("eager-fixed", eager), log("eager-fixed"), 240s);
  ASSERT_EQ(fixed.status, 0) << fixed.output;
  eager.push_back("--cluster.elastic=true");
  auto elastic = run_command(launch_args("eager-elastic", eager), log("eager-elastic"), 240s);
  ASSERT_EQ(elastic.status, 0) << elastic.output;
  const auto fixed_eval = events("eager-fixed", "eval"), elastic_eval = events("eager-elastic", "eval");
  ASSERT_FALSE(fixed_eval.empty());
  ASSERT_FALSE(elastic_eval.empty());
  EXPECT_EQ(elastic_eval.back()["step"], 40);
  EXPECT_EQ(elastic_eval.back()["val_loss"].get<double>(), fixed_eval.back()["val_loss"].get<double>());
  std::map<int64_t, std::set<std::string>> hashes;
  for (const auto& e : events("eager-elastic", "sync")) hashes[e["round"].get<int64_t>()].insert(e["params_hash"].get<std::string>());
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "members disagree on round " << round << "'s sum";
  const auto rounds = events("eager-elastic", "round_complete");
  ASSERT_GE(rounds.size(), 2u);
  EXPECT_EQ(rounds.back()["step"], 40);
  EXPECT_EQ(rounds[rounds.size() - 2]["step"], 40) << "each fragment's average has a round at the last step";

  eager.insert(eager.end(), {"--train.steps=200", "--eval.every=50"});
  Child launcher(launch_args("eager-stopped", eager), log("eager-stopped"));
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (events("eager-stopped", "sync").size() < 3 * 12 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  launcher.signal(SIGINT);
  ASSERT_EQ(launcher.wait(120s), 130) << read_file(log("eager-stopped"), "test");
  auto args = launch_args("eager-stopped", eager);
  args.push_back("--resume");
  auto resumed = run_command(args, log("eager-resumed"), 240s);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const auto resumed_eval = events("eager-stopped", "eval");
  ASSERT_FALSE(resumed_eval.empty());
  EXPECT_EQ(resumed_eval.back()["step"], 200);
  EXPECT_TRUE(std::isfinite(resumed_eval.back()["val_loss"].get<double>()));
  // Every worker continued from the leader's checkpoint (its θ, its exchange in flight sent again,
  // its eager state): the members agree on every sum after the resume too, and no round failed.
  hashes.clear();
  for (const auto& e : events("eager-stopped", "sync")) hashes[e["round"].get<int64_t>()].insert(e["params_hash"].get<std::string>());
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "members disagree on round " << round << "'s sum";
  EXPECT_TRUE(events("eager-stopped", "round_retried").empty());
}

TEST_F(LaunchTest, DdpSynchronizesEveryStepAndLocalNever) {
  auto ddp = run_command(launch_args("ddp", {"--sync.algorithm=ddp", "--workers", "2", "--train.steps=10"}), log("ddp"), 240s);
  ASSERT_EQ(ddp.status, 0) << ddp.output;
  std::map<int64_t, std::set<std::string>> hashes;
  for (const auto& e : events("ddp", "sync")) hashes[e["round"].get<int64_t>()].insert(e["params_hash"].get<std::string>());
  ASSERT_EQ(hashes.size(), 10u);
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round;

  auto local = run_command(launch_args("local", {"--sync.algorithm=local", "--workers", "2", "--train.steps=10"}), log("local"), 240s);
  ASSERT_EQ(local.status, 0) << local.output;
  EXPECT_TRUE(events("local", "sync").empty());
  EXPECT_EQ(events("local", "summary").size(), 2u);
  EXPECT_NE(local.output.find("val_loss of each replica"), std::string::npos) << local.output;

  // `loco report`: what DDP would send for a run is what this DDP run measured; its report kept as
  // JSON serves as a baseline for another run.
  auto json = run_command({testing_util::loco_binary(), "report", "--json", run("ddp").string()}, log("report-json"));
  ASSERT_EQ(json.status, 0) << json.output;
  const auto reports = nlohmann::json::parse(json.output);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NEAR(reports[0]["ddp_bytes"].get<double>(), reports[0]["bytes_sent"].get<double>(),
              0.01 * reports[0]["bytes_sent"].get<double>());
  const auto saved = dir_->path() / "baselines.json";
  std::ofstream(saved) << json.output;
  auto compared = run_command({testing_util::loco_binary(), "report", run("local").string(), "--baseline", saved.string()}, log("report"));
  ASSERT_EQ(compared.status, 0) << compared.output;
  const double ddp_loss = reports[0]["val_loss"].get<double>();
  EXPECT_NE(compared.output.find(fmt::format("local against ddp (ddp, 2 workers): val_loss {:.4f} vs {:.4f}",
                                             (events("local", "summary")[0]["val_loss"].get<double>() +
                                              events("local", "summary")[1]["val_loss"].get<double>()) / 2,
                                             ddp_loss)),
            std::string::npos) << compared.output;
  EXPECT_NE(compared.output.find("local: DDP would have sent"), std::string::npos) << compared.output;
  std::ofstream(saved) << "[{\"name\": \"x\"}]";
  auto bad = run_command({testing_util::loco_binary(), "report", run("local").string(), "--baseline", saved.string()}, log("report-bad"));
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("has no text \"algorithm\""), std::string::npos) << bad.output;
}

// One worker through the launcher (a real process, a real coordinator) trains exactly as `loco train`.
TEST_F(LaunchTest, OneLaunchedWorkerIsPlainTraining) {
  auto launched = run_command(launch_args("one", {"--workers", "1", "--sync.inner_steps=1", "--outer.optimizer=sgd"}), log("one"), 240s);
  ASSERT_EQ(launched.status, 0) << launched.output;
  auto plain = run_command({testing_util::loco_binary(), "train", "--config", config().string(), "--data.dir=" + data().string(),
                            "--run.dir=" + run("plain").string(), "--cluster.workers=1", "--sync.algorithm=none"},
                           log("plain"));
  ASSERT_EQ(plain.status, 0) << plain.output;
  auto losses = [](const std::vector<nlohmann::json>& train) {
    std::vector<double> out;
    for (const auto& e : train) out.push_back(e["loss"].get<double>());
    return out;
  };
  EXPECT_EQ(losses(events("one", "train")), losses(events("plain", "train")));
  EXPECT_EQ(events("one", "summary")[0]["val_loss"], events("plain", "summary")[0]["val_loss"]);
}

// Ctrl-C mid-run: every worker finishes its step and checkpoints; --resume then ends on the very
// same global parameters as a run that was never interrupted.
TEST_F(LaunchTest, InterruptedLaunchResumesToTheSameParameters) {
  const std::vector<std::string> longer = {"--train.steps=200", "--sync.inner_steps=10", "--eval.every=50"};
  auto straight = run_command(launch_args("straight", longer), log("straight"), 240s);
  ASSERT_EQ(straight.status, 0) << straight.output;

  Child launcher(launch_args("stopped", longer), log("stopped"));
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (events("stopped", "sync").size() < 6 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  launcher.signal(SIGINT);
  ASSERT_EQ(launcher.wait(120s), 130) << read_file(log("stopped"), "test");
  const auto stopped = events("stopped", "summary");
  ASSERT_EQ(stopped.size(), 3u);
  for (const auto& s : stopped) EXPECT_TRUE(s["interrupted"].get<bool>()) << "the run stopped before its end";

  // The hint, run as printed: it needs none of the flags the run was started with (--train.steps
  // among them, which the config file does not hold), since the run folder keeps its config.
  const auto hint = testing_util::printed_command(read_file(log("stopped"), "test"), "continue with: ");
  ASSERT_EQ(hint, (std::vector<std::string>{testing_util::loco_binary(), "launch", "--resume", "--run.dir=" + run("stopped").string()}))
      << read_file(log("stopped"), "test");
  auto resumed = run_command(hint, log("resumed"), 240s);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_EQ(final_hash("stopped"), final_hash("straight"));
  // With a config that changes what defines the run, --resume refuses before starting anything, and
  // lists every difference.
  auto changed = launch_args("stopped", {"--train.steps=200", "--sync.inner_steps=5", "--optim.lr=0.01"});
  changed.push_back("--resume");
  auto refused = run_command(changed, log("resume-changed"), 60s);
  EXPECT_EQ(refused.status, 1) << refused.output;
  EXPECT_NE(refused.output.find("in keys that define the run: "), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("optim.lr: "), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("sync.inner_steps: 10 -> 5"), std::string::npos) << refused.output;
  EXPECT_FALSE(final_hash("straight").empty());
}

// A worker killed with SIGKILL: the others stop and save their state, nothing is left running, and
// --resume completes the run on the same parameters as an uninterrupted one.
TEST_F(LaunchTest, KilledWorkerStopsTheRunAndResumeCompletesIt) {
  const std::vector<std::string> longer = {"--train.steps=200", "--sync.inner_steps=10", "--eval.every=50"};
  auto straight = run_command(launch_args("unkilled", longer), log("unkilled"), 240s);
  ASSERT_EQ(straight.status, 0) << straight.output;

  Child launcher(launch_args("killed", longer), log("killed"));
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (events("killed", "sync").size() < 9 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  const auto victims = workers_of_rank("killed", 1);
  ASSERT_EQ(victims.size(), 1u) << "worker 1's process";
  ::kill(victims[0], SIGKILL);
  const int status = launcher.wait(120s);
  EXPECT_EQ(status, 2) << "a peer failed: " << read_file(log("killed"), "test");
  EXPECT_NE(read_file(log("killed"), "test").find("worker 1 exited with status 137 (killed by SIGKILL: by hand, by a "
                                                  "scheduler, or by the kernel's out-of-memory killer"), std::string::npos)
      << read_file(log("killed"), "test");

  auto args = launch_args("killed", longer);
  args.push_back("--resume");
  auto resumed = run_command(args, log("killed-resumed"), 240s);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_EQ(final_hash("killed"), final_hash("unkilled"));
}

TEST_F(LaunchTest, LabelAndKMeansShards) {
  auto label = run_command(launch_args("label", {"--data.shard=label", "--workers", "2"}), log("label"), 240s);
  EXPECT_EQ(label.status, 1);
  EXPECT_NE(label.output.find("has 1 label(s) ((none)) for 2 workers; hint"), std::string::npos) << label.output;

  auto kmeans = run_command(launch_args("kmeans", {"--data.shard=kmeans", "--workers", "2", "--train.steps=10"}), log("kmeans"), 240s);
  ASSERT_EQ(kmeans.status, 0) << kmeans.output;
  auto shards = nlohmann::json::parse(read_file(run("kmeans") / "shards.json", "test"));
  EXPECT_EQ(shards["policy"], "kmeans");
  EXPECT_EQ(shards["workers"].size(), 2u);
}

// `loco coordinator` + `loco worker`: a worker whose config or dataset differs is refused, naming
// the difference; a worker that never shows up fails the run after the join timeout, named.
TEST_F(LaunchTest, CoordinatorRefusesMismatchedWorkersAndNamesMissingOnes) {
  auto start_coordinator = [&](const std::string& name, int port, double join_timeout) {
    return std::make_unique<Child>(
        std::vector<std::string>{testing_util::loco_binary(), "coordinator", "--config", config().string(), "--data.dir=" + data().string(),
                                 "--run.dir=" + run(name).string(), "--port", std::to_string(port), "--bind", "127.0.0.1",
                                 "--workers", "2", fmt::format("--cluster.join_timeout_s={}", join_timeout)},
        log(name));
  };
  // The workers share the coordinator's run folder, where it keeps the run's generated join token.
  auto worker = [&](int port, const std::string& name, std::vector<std::string> extra,
                    const std::string& run_name = "coordinated") {
    std::vector<std::string> args = {testing_util::loco_binary(), "worker", "--coordinator", fmt::format("127.0.0.1:{}", port), "--config",
                                     config().string(), "--data.dir=" + data().string(),
                                     "--run.dir=" + run(run_name).string(), "--cluster.workers=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_command(args, log(name), 60s);
  };
  const int port = free_port();
  auto coordinator = start_coordinator("coordinated", port, 300);
  auto shape = worker(port, "bad-shape", {"--model.layers=3"});
  EXPECT_EQ(shape.status, 1);
  EXPECT_NE(shape.output.find("config differs from the run's (run -> worker): model.layers: 2 -> 3"), std::string::npos) << shape.output;

  const auto other = dir_->path() / "other-data";
  auto prepared = run_command({testing_util::loco_binary(), "prepare", "--corpus", (dir_->path() / "corpus").string(), "--out", other.string(),
                               "--vocab-size", "300", "--cache", (dir_->path() / "cache").string()}, log("other"));
  ASSERT_EQ(prepared.status, 0) << prepared.output;
  auto dataset = worker(port, "bad-data", {"--data.dir=" + other.string()});
  EXPECT_EQ(dataset.status, 1);
  EXPECT_NE(dataset.output.find("dataset differs from the run's: tokenizer"), std::string::npos) << dataset.output;

  auto rank = worker(port, "bad-rank", {"--rank", "7"});
  EXPECT_EQ(rank.status, 1);
  EXPECT_NE(rank.output.find("rank 7 is outside the run's 2 workers"), std::string::npos) << rank.output;
  coordinator->signal(SIGINT);
  EXPECT_EQ(coordinator->wait(30s), 130);

  // One worker joins; the second never does: the run fails after the join timeout, naming it.
  const int lonely_port = free_port();
  auto lonely_coordinator = start_coordinator("lonely-run", lonely_port, 10);
  auto lonely = worker(lonely_port, "lonely", {"--rank", "0"}, "lonely-run");
  EXPECT_EQ(lonely.status, 1);
  EXPECT_NE(lonely.output.find("worker rank(s) 1 never joined within 10 s"), std::string::npos) << lonely.output;
  EXPECT_EQ(lonely_coordinator->wait(30s), 1);
  EXPECT_NE(read_file(log("lonely-run"), "test").find("never joined"), std::string::npos);
}

// Issue #48: a start that failed before anything was saved (here a missing dataset) left a folder
// that refused both a retry ("already holds a run") and --resume ("no checkpoints"). It says to run
// the same command again, and that works.
TEST_F(LaunchTest, AFailedStartLeavesAFolderThatTheSameCommandTakesAgain) {
  auto failed = run_command(launch_args("retry", {"--data.dir=" + (dir_->path() / "no-data").string(), "--train.steps=4"}),
                            log("retry-failed"), 60s);
  EXPECT_EQ(failed.status, 1);
  EXPECT_NE(failed.output.find("nothing was saved: once that is fixed, run the same command again"), std::string::npos)
      << failed.output;
  EXPECT_EQ(failed.output.find("--resume"), std::string::npos) << failed.output;
  ASSERT_TRUE(RunFolder(run("retry")).unstarted()) << "the failed start left more than its join token";

  auto resumed = run_command(launch_args("retry", {"--train.steps=4", "--resume"}), log("retry-resume"), 60s);
  EXPECT_EQ(resumed.status, 1);
  EXPECT_NE(resumed.output.find("the run never started; start it without --resume"), std::string::npos) << resumed.output;

  auto again = run_command(launch_args("retry", {"--train.steps=4"}), log("retry-again"), 120s);
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_FALSE(events("retry", "summary").empty());

  // Once it holds a finished run, the same command says so, where the report and checkpoints are,
  // and exits 0 without writing (issue #68: every command safe to run again); a file is named as
  // what it is.
  const auto lines = read_file(run("retry") / "metrics.jsonl", "test");
  auto used = run_command(launch_args("retry", {"--train.steps=4"}), log("retry-used"), 60s);
  EXPECT_EQ(used.status, 0) << used.output;
  EXPECT_NE(used.output.find("finished already"), std::string::npos) << used.output;
  EXPECT_NE(used.output.find("holds its last step, 4"), std::string::npos) << used.output;
  EXPECT_NE(used.output.find("next: loco report " + run("retry").string()), std::string::npos) << used.output;
  EXPECT_EQ(read_file(run("retry") / "metrics.jsonl", "test"), lines);
  // One with more steps to train is still refused (it is no new run), and says how to go on.
  auto more = run_command(launch_args("retry", {"--train.steps=8"}), log("retry-more"), 60s);
  EXPECT_EQ(more.status, 1);
  EXPECT_NE(more.output.find("already holds a run; pass --resume"), std::string::npos) << more.output;
  std::ofstream(run("a-file")) << "x";
  auto file = run_command(launch_args("a-file"), log("a-file"), 60s);
  EXPECT_EQ(file.status, 1);
  EXPECT_NE(file.output.find("exists and is not a folder"), std::string::npos) << file.output;
}

// Issue #48: a worker killed before its first checkpoint left a fixed run that --resume refused.
// It now resumes from a copy of another worker's checkpoint, sent over the run's group, and the run
// completes with every worker on the same θ after every round. When no worker holds a checkpoint
// (here: all deleted), the refusal says so and prints the commands that start the run again from
// its own config; they work as printed.
TEST_F(LaunchTest, AWorkerKilledBeforeItsFirstCheckpointResumesFromACopy) {
  const std::vector<std::string> longer = {"--train.steps=200", "--sync.inner_steps=10", "--checkpoint.every=1000"};
  for (const std::string name : {"early", "early-lost"}) {
    Child launcher(launch_args(name, longer), log(name));
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (events(name, "sync").size() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    const auto victims = workers_of_rank(name, 1);
    ASSERT_EQ(victims.size(), 1u) << "worker 1's process";
    ::kill(victims[0], SIGKILL);
    EXPECT_EQ(launcher.wait(120s), 2) << read_file(log(name), "test");
  }
  ASSERT_FALSE(fs::exists(run("early") / "workers" / "1" / "checkpoints" / "latest"));
  auto resumed = run_command({testing_util::loco_binary(), "launch", "--resume", "--run.dir=" + run("early").string()},
                             log("early-resume"), 240s);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("worker 1 holds no checkpoint: it resumes from a copy of worker "), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("held no checkpoint; resumes from worker "), std::string::npos) << resumed.output;
  std::map<int64_t, std::set<std::string>> hashes;
  for (const auto& e : events("early", "sync")) hashes[e["round"].get<int64_t>()].insert(e["params_hash"].get<std::string>());
  EXPECT_EQ(hashes.size(), 20u) << "every round of 200 steps, H = 10";
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round << " ended with different θ";

  for (int rank = 0; rank < 3; ++rank) fs::remove_all(run("early-lost") / "workers" / std::to_string(rank) / "checkpoints");
  auto refused = run_command({testing_util::loco_binary(), "launch", "--resume", "--run.dir=" + run("early-lost").string()},
                             log("early-lost-resume"), 120s);
  EXPECT_NE(refused.status, 0) << refused.output;
  EXPECT_NE(refused.output.find("no worker holds a checkpoint to resume from: they stopped before their first "
                                "(checkpoint.every = 1000), or lost them"),
            std::string::npos)
      << refused.output;
  // The way forward, as printed: move the folder aside, start again from its config.
  const std::string lead = "start the run again: ";
  ASSERT_NE(refused.output.find(lead), std::string::npos) << refused.output;
  const auto restart = refused.output.substr(refused.output.find(lead) + lead.size());
  const auto failed = run("early-lost").string() + ".failed";
  ASSERT_EQ(restart.rfind(fmt::format("mv {} {} && loco launch --config {}/config.toml", run("early-lost").string(), failed, failed), 0),
            0u)
      << refused.output;
  fs::rename(run("early-lost"), failed);
  auto again = run_command({testing_util::loco_binary(), "launch", "--config", failed + "/config.toml"}, log("early-again"), 240s);
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_FALSE(final_hash("early-lost").empty());
}

// Issue #48: two launches into one run folder both ran (two coordinators, every event twice). The
// folder's lock refuses the second while the first runs, naming its holder, and writes nothing; a
// holder killed with SIGKILL leaves no stale lock, so --resume goes on at once.
TEST_F(LaunchTest, ASecondDriverOfARunningFolderIsRefused) {
  const std::vector<std::string> longer = {"--train.steps=400", "--sync.inner_steps=10"};
  Child first(launch_args("owned", longer), log("owned"));
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (events("owned", "sync").size() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  ASSERT_GE(events("owned", "sync").size(), 2u) << read_file(log("owned"), "test");

  for (const auto& second : {launch_args("owned", longer),
                             std::vector<std::string>{testing_util::loco_binary(), "train", "--config", config().string(),
                                                      "--data.dir=" + data().string(), "--run.dir=" + run("owned").string(),
                                                      "--cluster.workers=1", "--resume"}}) {
    auto refused = run_command(second, log("owned-second"), 60s);
    EXPECT_EQ(refused.status, 1) << refused.output;
    EXPECT_NE(refused.output.find(fmt::format("is in use by another process (pid {} on ", first.pid())), std::string::npos)
        << refused.output;
    EXPECT_NE(refused.output.find(": loco launch, since "), std::string::npos) << refused.output;
  }
  // Killed outright: the kernel drops its lock at once; the file only names its last holder.
  first.signal(SIGKILL);
  first.wait(30s);
  // Its workers follow it: their parent's death sends them SIGTERM, and each stops as on Ctrl-C,
  // which can take a collective's timeout (cluster.timeout_s, 20 s) and its report to the gone
  // coordinator; on a loaded machine 30 s was once not enough (the full suite at -j2).
  const auto gone = std::chrono::steady_clock::now() + 90s;
  while (!processes_mentioning(run("owned").string()).empty() && std::chrono::steady_clock::now() < gone) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_NO_THROW(RunLock::acquire(run("owned"), "test", "the test")) << "a killed holder left its lock held";
  EXPECT_NE(read_file(RunFolder(run("owned")).lock(), "test").find("the test, since"), std::string::npos);
}

TEST_F(LaunchTest, PortsAndAddressesGetClearErrors) {
  const int port = free_port();
  Child first({testing_util::loco_binary(), "coordinator", "--config", config().string(), "--run.dir=" + run("port").string(), "--port",
               std::to_string(port), "--cluster.join_timeout_s=20"},
              log("first"));
  std::this_thread::sleep_for(1s);
  auto second = run_command({testing_util::loco_binary(), "coordinator", "--config", config().string(), "--run.dir=" + run("port2").string(),
                             "--port", std::to_string(port)}, log("second"), 30s);
  EXPECT_EQ(second.status, 1);
  EXPECT_NE(second.output.find(fmt::format("cannot listen on 127.0.0.1:{}", port)), std::string::npos) << second.output;
  first.signal(SIGINT);
  EXPECT_EQ(first.wait(30s), 130);

  // Nobody listens: the worker retries with backoff, then says so.
  const auto start = std::chrono::steady_clock::now();
  auto unreachable = run_command({testing_util::loco_binary(), "worker", "--coordinator", fmt::format("127.0.0.1:{}", free_port()), "--config",
                                  config().string(), "--data.dir=" + data().string(), "--run.dir=" + run("nowhere").string(),
                                  "--cluster.connect_timeout_s=2"},
                                 log("unreachable"), 60s);
  EXPECT_EQ(unreachable.status, 2);
  EXPECT_NE(unreachable.output.find("cannot reach the coordinator at 127.0.0.1:"), std::string::npos) << unreachable.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);

  auto malformed = run_command({testing_util::loco_binary(), "worker", "--coordinator", "nohostport", "--config", config().string(),
                                "--data.dir=" + data().string()}, log("malformed"), 30s);
  EXPECT_EQ(malformed.status, 1);
  EXPECT_NE(malformed.output.find("'nohostport' is not HOST:PORT"), std::string::npos) << malformed.output;

  // A fresh launch never writes into a used run folder; `loco train` is one process.
  fs::create_directories(run("used"));
  std::ofstream(run("used") / "metrics.jsonl") << "{}\n";
  auto used = run_command(launch_args("used"), log("used"), 30s);
  EXPECT_EQ(used.status, 1);
  EXPECT_NE(used.output.find("already holds a run; pass --resume"), std::string::npos) << used.output;
  auto train = run_command({testing_util::loco_binary(), "train", "--config", config().string(), "--data.dir=" + data().string(),
                            "--run.dir=" + run("train-many").string()}, log("train-many"), 30s);
  EXPECT_EQ(train.status, 1);
  EXPECT_NE(train.output.find("use `loco launch`"), std::string::npos) << train.output;
}

}  // namespace
}  // namespace loco
