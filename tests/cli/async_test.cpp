// Asynchronous DiLoCo end to end (docs/async.md): `loco launch` with sync.async, real worker
// processes that talk only to the coordinator, one of them sending a NaN once.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <cmath>
#include <limits>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "cli_util.h"
#include "loco/runtime/coordinator/coordinator_client.h"
#include "loco/core/files.h"
#include "process_util.h"

namespace loco {
namespace {

using namespace std::chrono_literals;
using testing_util::run_command;
namespace fs = std::filesystem;

std::vector<nlohmann::json> run_events(const fs::path& run, const std::string& kind) {
  std::ifstream in(run / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    const auto e = nlohmann::json::parse(line, nullptr, false);
    if (!e.is_discarded() && e.value("event", "") == kind) out.push_back(e);
  }
  return out;
}

// The run's summaries: the inner steps its workers took in all, and the θ hashes they ended on.
std::pair<int64_t, std::set<std::string>> steps_and_final_hashes(const std::vector<nlohmann::json>& summaries) {
  int64_t steps = 0;
  std::set<std::string> hashes;
  for (const auto& s : summaries) {
    steps += s["steps"].get<int64_t>();
    hashes.insert(s["global_hash"].get<std::string>());
  }
  return {steps, hashes};
}

class AsyncLaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testing_util::prepare_tiny_dataset(dir_.path(), dir_.path() / "data"));
    std::ofstream(dir_.path() / "tiny.toml") << testing_util::tiny_launch_config(3);
  }
  std::vector<std::string> launch(const std::string& name, std::vector<std::string> extra) const {
    std::vector<std::string> args = {testing_util::loco_binary(), "launch", "--config", (dir_.path() / "tiny.toml").string(),
                                     "--data.dir=" + (dir_.path() / "data").string(), "--run.dir=" + run(name).string(),
                                     "--sync.async=true"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  fs::path run(const std::string& name) const { return dir_.path() / name; }
  std::string log(const std::string& name) const { return (dir_.path() / (name + ".log")).string(); }
  // With `checkpoints` false the run saves none before its end: the replacement starts afresh.
  void replace_a_killed_worker(const std::vector<std::string>& algorithm, bool checkpoints = true);

  testing_util::TempDir dir_;
};

// Streaming DiLoCo's fragments, asynchronous: 2 of them, one exchanged at a time.
const std::vector<std::string> kStreaming = {"--sync.algorithm=streaming", "--sync.fragments=2", "--sync.overlap_steps=0",
                                             "--sync.inner_steps=10"};

// The workers share the run's 3 x 40 inner steps, each outer gradient is applied at the
// coordinator as it comes (its staleness in the sync event), worker 1's NaN at its 2nd exchange is
// left out and counted, and every worker ends on the same final θ, which worker 0 scores.
TEST_F(AsyncLaunchTest, WorkersShareTheStepsAndEndOnOneTheta) {
  auto result = run_command(launch("async", {"--sync.poison=1:nan@2"}), log("async"), 240s);
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find("trained diloco with 3 workers: steps "), std::string::npos) << "each worker's own" << result.output;
  EXPECT_NE(result.output.find("worker 1's outer gradient left out: a value that is not finite"), std::string::npos) << result.output;
  const auto summaries = run_events(run("async"), "summary");
  ASSERT_EQ(summaries.size(), 3u);
  int64_t steps = 0;
  std::set<std::string> hashes;
  for (const auto& s : summaries) {
    steps += s["steps"].get<int64_t>();
    hashes.insert(s["global_hash"].get<std::string>());
    EXPECT_FALSE(s["interrupted"].get<bool>());
    EXPECT_GT(s["rounds"].get<int64_t>(), 1);
  }
  EXPECT_EQ(steps, 3 * 40) << "the run's inner steps, shared";
  EXPECT_EQ(hashes.size(), 1u) << "every worker ends on the run's final θ";
  int64_t rejected = 0;
  for (const auto& e : run_events(run("async"), "sync")) {
    ASSERT_TRUE(e.contains("staleness")) << e.dump();
    EXPECT_GE(e["staleness"].get<int64_t>(), 0);
    EXPECT_EQ(e["world_size"], 1);
    if (e.value("rejected", 0) > 0) {
      ++rejected;
      EXPECT_EQ(e["worker"], 1);
      EXPECT_EQ(e["round"], 2);
      EXPECT_NE(e["screening"].get<std::string>().find("not finite"), std::string::npos);
    }
  }
  EXPECT_EQ(rejected, 1);
  const auto evals = run_events(run("async"), "eval");
  ASSERT_FALSE(evals.empty());
  for (const auto& e : evals) EXPECT_EQ(e["worker"], 0);
  EXPECT_TRUE(std::isfinite(evals.back()["val_loss"].get<double>()));
}

// Stopped with Ctrl-C, an asynchronous run keeps its outer state (RUN/outer.safetensors) and each
// worker its own checkpoint; `loco launch --resume` continues from them and completes the run's
// steps, every worker ending on one θ.
TEST_F(AsyncLaunchTest, AStoppedRunResumesFromItsOuterState) {
  testing_util::Child launcher(launch("stopped", {"--train.steps=200", "--checkpoint.every=20"}), log("stopped"));
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (run_events(run("stopped"), "sync").size() < 12 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  launcher.signal(SIGINT);
  ASSERT_EQ(launcher.wait(120s), 130) << read_file(log("stopped"), "test");
  ASSERT_TRUE(fs::exists(run("stopped") / "outer.safetensors"));
  int64_t before = 0;
  for (const auto& s : run_events(run("stopped"), "summary")) before = std::max(before, s["steps"].get<int64_t>());

  auto resumed = run_command({testing_util::loco_binary(), "launch", "--resume", "--run.dir=" + run("stopped").string()},
                             log("resumed"), 240s);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming the asynchronous outer state"), std::string::npos) << resumed.output;
  const auto summaries = run_events(run("stopped"), "summary");
  ASSERT_EQ(summaries.size(), 6u) << "three stopped, three finished";
  std::set<std::string> hashes;
  int64_t steps = 0;
  for (size_t i = 3; i < summaries.size(); ++i) {
    EXPECT_FALSE(summaries[i]["interrupted"].get<bool>());
    hashes.insert(summaries[i]["global_hash"].get<std::string>());
    steps += summaries[i]["steps"].get<int64_t>();
  }
  EXPECT_EQ(hashes.size(), 1u);
  EXPECT_GE(steps, 3 * 200) << "the run's steps, and those trained again since each worker's last exchange";
  EXPECT_GT(before, 0);
}

// Asynchronous DiLoCo with elastic membership (async_elastic_run.h): worker 1, killed with SIGKILL
// mid-run, is started again by the launcher; the new process takes its slot, continues its shard
// from its predecessor's newest checkpoint (without one, from the start of its shard, its AdamW
// moments from zero and its learning rate warming up again) and the current θ, and the run
// completes its steps, every worker ending on one θ.
void AsyncLaunchTest::replace_a_killed_worker(const std::vector<std::string>& algorithm, bool checkpoints) {
  const int port = testing_util::free_port();
  std::vector<std::string> args = {"--port", std::to_string(port), "--restarts", "1", "--cluster.elastic=true", "--train.steps=400",
                                   checkpoints ? "--checkpoint.every=10" : "--checkpoint.every=0"};
  args.insert(args.end(), algorithm.begin(), algorithm.end());
  testing_util::Child launcher(launch("elastic", args), log("elastic"));
  runtime::CoordinatorClient client(fmt::format("127.0.0.1:{}", port), 20s, runtime::ClientSecurity{.insecure = true});
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  pid_t victim = -1;
  while (victim < 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    // Once it saved a checkpoint (its replacement continues from it) and a few cycles passed.
    const bool saved = fs::exists(run("elastic") / "workers" / "1" / "checkpoints" / "latest");
    if (saved != checkpoints || run_events(run("elastic"), "sync").size() < 30) continue;
    try {
      const auto state = nlohmann::json::parse(client.request("GET", "/v1/state", "", 5s).second);
      for (const auto& m : state["members"]) {
        const auto name = m["name"].get<std::string>();
        if (m["rank"] == 1 && m["status"] == "training") victim = static_cast<pid_t>(std::stol(name.substr(name.rfind(':') + 1)));
      }
    } catch (const std::exception&) {  // not answering yet
    }
  }
  ASSERT_GT(victim, 0) << read_file(log("elastic"), "test");
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_EQ(launcher.wait(240s), 0) << read_file(log("elastic"), "test");
  const auto output = read_file(log("elastic"), "test");
  EXPECT_NE(output.find("started worker 1 again"), std::string::npos) << output;
  EXPECT_NE(output.find("of slot 1 is gone: its process exited"), std::string::npos) << output;
  const auto events = run_events(run("elastic"), "train");
  if (checkpoints) {
    EXPECT_NE(output.find("joined as member 3 (slot 1, from its checkpoint of step"), std::string::npos) << output;
  } else {
    EXPECT_NE(output.find("joined as member 3 (slot 1)"), std::string::npos) << output;
    EXPECT_NE(output.find("joined the run under way, its schedule at step"), std::string::npos) << output;
    EXPECT_NE(output.find("warms up again over 20 steps"), std::string::npos) << output;
    // Slot 1's rate, logged every 5 steps: the replacement's first (its 5th step, about 5 of the 20)
    // under half its predecessor's last, then rising (the schedule itself only decays by then).
    std::vector<double> rates;
    for (const auto& e : events) {
      if (e["worker"] == 1) rates.push_back(e["lr"].get<double>());
    }
    const auto restart = std::adjacent_find(rates.begin(), rates.end(), [](double a, double b) { return b < 0.5 * a; });
    ASSERT_NE(restart, rates.end()) << "the replacement's rate starts again below the schedule's";
    ASSERT_GE(rates.end() - restart, 4) << "three of the replacement's steps logged";
    EXPECT_LT(restart[1], restart[2]);
    EXPECT_LT(restart[2], restart[3]);
  }
  std::vector<nlohmann::json> joiners;
  for (const auto& e : run_events(run("elastic"), "join")) {
    if (e.value("joiner", false)) joiners.push_back(e);
  }
  ASSERT_EQ(joiners.size(), 1u);
  EXPECT_EQ(joiners[0]["slot"], 1);
  int64_t resumed = 0;
  for (const auto& e : run_events(run("elastic"), "resume")) resumed += e["worker"] == 1 && e["step"].get<int64_t>() >= 10 ? 1 : 0;
  EXPECT_EQ(resumed, checkpoints ? 1 : 0) << "the replacement continued its slot from a checkpoint";
  const auto summaries = run_events(run("elastic"), "summary");
  ASSERT_EQ(summaries.size(), 3u) << "the killed worker wrote none";
  std::set<std::string> hashes;
  for (const auto& s : summaries) {
    EXPECT_FALSE(s["interrupted"].get<bool>());
    hashes.insert(s["global_hash"].get<std::string>());
  }
  EXPECT_EQ(hashes.size(), 1u) << "every worker ends on the run's final θ";
  EXPECT_NE(output.find("with 3 workers"), std::string::npos) << output;
}

TEST_F(AsyncLaunchTest, ElasticMembershipTakesAKilledWorkersReplacement) { replace_a_killed_worker({}); }

TEST_F(AsyncLaunchTest, ElasticStreamingDiLoCoTakesAKilledWorkersReplacement) { replace_a_killed_worker(kStreaming); }

TEST_F(AsyncLaunchTest, AReplacementWithoutACheckpointWarmsItsLearningRateUpAgain) {
  replace_a_killed_worker({}, /*checkpoints=*/false);
}

// Asynchronous Streaming DiLoCo: each exchange carries one fragment's outer gradient, in turn, and
// brings that fragment's θ back; the run's steps are shared and every worker ends on one θ (the
// fragments a worker had not sent when its share was done were flushed first).
TEST_F(AsyncLaunchTest, StreamingDiLoCoSendsOneFragmentAtATime) {
  auto result = run_command(launch("streaming", kStreaming), log("streaming"), 240s);
  ASSERT_EQ(result.status, 0) << result.output;
  const auto summaries = run_events(run("streaming"), "summary");
  ASSERT_EQ(summaries.size(), 3u);
  const auto [steps, hashes] = steps_and_final_hashes(summaries);
  EXPECT_EQ(steps, 3 * 40);
  EXPECT_EQ(hashes.size(), 1u) << "every worker ends on the run's final θ";
  std::set<int64_t> fragments;
  int64_t smallest = std::numeric_limits<int64_t>::max(), largest = 0;
  for (const auto& e : run_events(run("streaming"), "sync")) {
    fragments.insert(e["fragment"].get<int64_t>());
    smallest = std::min(smallest, e["bytes_sent"].get<int64_t>());
    largest = std::max(largest, e["bytes_sent"].get<int64_t>());
  }
  EXPECT_EQ(fragments, (std::set<int64_t>{0, 1}));
  EXPECT_LT(smallest * 3, largest * 2) << "a fragment's exchange carries about half the model; a last one with its flush, all of it";
  EXPECT_FALSE(run_events(run("streaming"), "eval").empty());
}

}  // namespace
}  // namespace loco
