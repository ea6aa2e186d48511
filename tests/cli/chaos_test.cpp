// Chaos: an elastic `loco launch` of 4 workers (tiny model) while this test kills workers with
// SIGKILL at random moments (one of them inside a round's collective), freezes one with SIGSTOP
// past cluster.dead_after_s and lets it go on, and starts replacement workers. The run must
// complete, every round must end with one θ on all its participants, the final validation loss
// must be within 5% of the same seed's run without failures, and no process may be left behind.
#include <gtest/gtest.h>
#include <openssl/ssl.h>

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "loco/core/files.h"
#include "loco/runtime/store/checkpoint.h"
#include "loco/runtime/net/auth.h"
#include "loco/runtime/coordinator/coordinator_client.h"
#include "process_util.h"
#include "test_util.h"
#include "cli_util.h"

namespace loco {
namespace {

// The tests' own reader of a run's state on loopback: it holds no token, and believes the unsigned
// answers a coordinator gives to reads (a worker without a token would not: ClientSecurity::insecure).
const runtime::ClientSecurity kObserver{.insecure = true};

using testing_util::Child;
using testing_util::TempDir;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class ChaosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testing_util::prepare_tiny_dataset(dir_.path(), data()));
    std::ofstream(config()) << R"([model]
context = 32
layers = 2
width = 32
heads = 2
[optim]
lr = 0.0005
warmup_steps = 20
[train]
steps = 400
batch_size = 4
device = "cpu"
threads = 1
log_every = 50
[eval]
every = 200
windows = 128
[sync]
algorithm = "diloco"
inner_steps = 5
[cluster]
workers = 4
elastic = true
heartbeat_s = 0.5
dead_after_s = 3
timeout_s = 30
join_timeout_s = 60
connect_timeout_s = 20
)";
  }
  void TearDown() override {
    EXPECT_TRUE(testing_util::processes_mentioning(dir_.path().string()).empty()) << "a loco process outlived the test";
  }

  fs::path data() const { return dir_.path() / "data"; }
  fs::path config() const { return dir_.path() / "chaos.toml"; }
  fs::path run(const std::string& name) const { return dir_.path() / name; }
  std::string log(const std::string& name) const { return (dir_.path() / (name + ".log")).string(); }
  std::vector<std::string> common(const std::string& name) const {
    return {"--config", config().string(), "--data.dir=" + data().string(), "--run.dir=" + run(name).string()};
  }
  std::vector<nlohmann::json> events(const std::string& name, const std::string& kind) const {
    std::vector<nlohmann::json> out;
    std::ifstream in(run(name) / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.at("event") == kind) out.push_back(j);
    }
    return out;
  }
  double final_val_loss(const std::string& name) const {
    for (const auto& e : events(name, "eval")) {
      if (e["step"] == 400) return e["val_loss"].get<double>();
    }
    return NAN;
  }

  // Elastic runs of either algorithm, end to end (the TEST_Fs below name the algorithm).
  void full_stop_resume(const std::vector<std::string>& algorithm);
  void restart_a_dead_worker(const std::vector<std::string>& algorithm);
  void retry_a_round_that_lost_a_worker(const std::vector<std::string>& algorithm);

  TempDir dir_;
};

// Streaming DiLoCo on the tiny model: 2 fragments, H = 10, τ = 1 (one fragment on the wire at a time).
const std::vector<std::string> kStreaming = {"--sync.algorithm=streaming", "--sync.inner_steps=10", "--sync.fragments=2",
                                             "--sync.overlap_steps=1"};

// The seed of a test's random moments: a committed one, so that the suite's verdict depends on the
// code alone (issue #68), or LOCO_CHAOS_SEED's (0 draws one) to explore others by hand.
unsigned chaos_seed(unsigned committed) {
  const char* v = std::getenv("LOCO_CHAOS_SEED");
  if (v == nullptr || *v == '\0') return committed;
  const auto given = static_cast<unsigned>(std::stoul(v));
  return given != 0 ? given : std::random_device()();
}

pid_t pid_of(const nlohmann::json& member) {
  const auto name = member["name"].get<std::string>();
  return static_cast<pid_t>(std::stol(name.substr(name.rfind(':') + 1)));
}

// The coordinator's elastic state ("members", "rounds_completed", "convened", ...), or {} when it
// does not answer (not started yet, or gone).
nlohmann::json elastic_state(runtime::CoordinatorClient& client) {
  try {
    auto [status, body] = client.request("GET", "/v1/state", "", 5s);
    if (status == 200) return nlohmann::json::parse(body)["elastic"];
  } catch (const std::exception&) {
  }
  return nlohmann::json::object();
}

// Polls until the run has completed `rounds` rounds; false at the deadline.
bool wait_for_rounds(runtime::CoordinatorClient& client, int64_t rounds, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    if (elastic_state(client).value("rounds_completed", int64_t{0}) >= rounds) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

TEST_F(ChaosTest, KillsFreezesAndReplacementsLoseNothing) {
  // The same seed without failures: the reference loss.
  auto calm = testing_util::run_command([&] {
    std::vector<std::string> args = {testing_util::loco_binary(), "launch"};
    for (auto& a : common("calm")) args.push_back(a);
    return args;
  }(), log("calm"), 300s);
  ASSERT_EQ(calm.status, 0) << calm.output;
  const double calm_loss = final_val_loss("calm");
  ASSERT_TRUE(std::isfinite(calm_loss));

  const int port = testing_util::free_port();
  std::vector<std::string> args = {testing_util::loco_binary(), "launch", "--port", std::to_string(port)};
  for (auto& a : common("chaos")) args.push_back(a);
  Child launcher(args, log("chaos"));
  runtime::CoordinatorClient client(fmt::format("127.0.0.1:{}", port), 20s, kObserver);
  const unsigned seed = chaos_seed(1202420224);  // it found the kill inside a collective whose round completed (5d4034f)
  std::mt19937 random(seed);
  SCOPED_TRACE(fmt::format("chaos seed {}", seed));
  const auto deadline = Clock::now() + 240s;

  auto state = [&] { return elastic_state(client); };
  auto wait_for_round = [&](int64_t round) {
    while (Clock::now() < deadline) {
      auto s = state();
      if (s.value("rounds_completed", int64_t{0}) >= round) return s;
      std::this_thread::sleep_for(20ms);
    }
    ADD_FAILURE() << "round " << round << " never completed";
    return nlohmann::json::object();
  };
  auto active = [&](const nlohmann::json& s) {
    std::vector<nlohmann::json> out;
    for (const auto& m : s.value("members", nlohmann::json::array())) {
      if (m["state"] == "active") out.push_back(m);
    }
    return out;
  };
  std::vector<std::unique_ptr<Child>> replacements;
  auto start_replacement = [&] {
    std::vector<std::string> worker = {testing_util::loco_binary(), "worker", "--coordinator", fmt::format("127.0.0.1:{}", port)};
    for (auto& a : common("chaos")) worker.push_back(a);
    replacements.push_back(std::make_unique<Child>(worker, log(fmt::format("replacement-{}", replacements.size()))));
  };
  std::set<pid_t> killed;
  // Kills `pid`, waits until the coordinator has declared it failed (so that its slot is free),
  // and starts a replacement.
  auto kill_and_replace = [&](pid_t pid, int64_t member) {
    ASSERT_EQ(::kill(pid, SIGKILL), 0) << "member " << member << " (pid " << pid << ") was alive";
    killed.insert(pid);
    while (Clock::now() < deadline) {
      bool gone = true;
      const auto s = state();
      for (const auto& m : s.value("members", nlohmann::json::array())) {
        if (m["member"] == member && m["state"] != "gone") gone = false;
      }
      if (gone) break;
      std::this_thread::sleep_for(20ms);
    }
    start_replacement();
  };
  auto kill_random_member = [&](int64_t after_round) {
    wait_for_round(after_round);
    std::this_thread::sleep_for(std::chrono::milliseconds(random() % 300));
    auto members = active(state());
    ASSERT_FALSE(members.empty());
    const auto& victim = members[random() % members.size()];
    kill_and_replace(pid_of(victim), victim["member"].get<int64_t>());
  };

  // 1. A worker killed at a random moment (most likely among its inner steps).
  kill_random_member(3);
  // 2. A worker killed inside a round's collective: frozen after the round was convened with it
  //    and before it reported the round done, then killed.
  bool killed_in_collective = false;
  while (!killed_in_collective && Clock::now() < deadline) {
    auto s = state();
    if (!s.contains("convened")) continue;
    const auto& c = s["convened"];
    if (c["round"].get<int64_t>() != s["rounds_completed"].get<int64_t>() + 1 || c["participants"].size() < 2) continue;
    const int64_t victim = c["participants"][random() % c["participants"].size()].get<int64_t>();
    pid_t pid = -1;
    for (const auto& m : s["members"]) {
      if (m["member"] == victim && m["state"] == "active") pid = pid_of(m);
    }
    if (pid < 0) continue;
    ::kill(pid, SIGSTOP);
    // Frozen inside the collective, it holds the others in it: the round must not complete while
    // it stands still. Frozen after its part of the collective (its sends done, its report not yet
    // made), the others complete the round without it, and no retry is owed.
    std::this_thread::sleep_for(500ms);
    auto after = state();
    const auto& done = after["convened"]["done"];
    const bool finished_round = after["convened"]["round"] != c["round"] ||
                                after.value("rounds_completed", int64_t{0}) >= c["round"].get<int64_t>() ||
                                std::find(done.begin(), done.end(), nlohmann::json(victim)) != done.end();
    if (finished_round) {
      ::kill(pid, SIGCONT);  // too late: its part of that round was done; try the next one
      continue;
    }
    kill_and_replace(pid, victim);
    killed_in_collective = true;
  }
  ASSERT_TRUE(killed_in_collective);
  // 3. Another random kill, once the replacements have had time to join.
  kill_random_member(state().value("rounds_completed", int64_t{0}) + 10);
  // 4. A worker frozen past cluster.dead_after_s, then let go on: it must rejoin as a new member.
  {
    auto s = wait_for_round(state().value("rounds_completed", int64_t{0}) + 10);
    auto members = active(s);
    ASSERT_FALSE(members.empty());
    const pid_t frozen = pid_of(members[random() % members.size()]);
    ::kill(frozen, SIGSTOP);
    std::this_thread::sleep_for(4500ms);
    ::kill(frozen, SIGCONT);
  }

  const int status = launcher.wait(240s);
  const auto output = read_file(log("chaos"), "test");
  ASSERT_EQ(status, 0) << output;
  // Only the workers the test killed died: a survivor writing to a killed peer's connection gets
  // EPIPE (a failed collective), not SIGPIPE (status 141), which once killed one.
  EXPECT_EQ(output.find("exited with status 141"), std::string::npos) << output;
  for (size_t i = 0; i < replacements.size(); ++i) {
    // A replacement may find the run full (a dropped worker rejoined first): it says so and waits
    // for a slot, until the run is over.
    const int code = replacements[i]->wait(60s);
    const auto text = read_file(log(fmt::format("replacement-{}", i)), "test");
    const bool full = text.find("already has its 4 workers") != std::string::npos;
    if (!killed.count(replacements[i]->pid()) && !full) EXPECT_EQ(code, 0) << text;
  }

  // Failures were noticed, rounds ran short-handed, and everyone who ended a round agreed on θ.
  EXPECT_EQ(killed.size(), 3u);
  EXPECT_GE(events("chaos", "failure").size(), 4u) << output;
  EXPECT_FALSE(events("chaos", "round_retried").empty()) << "the kill inside a collective made its round run again";
  int64_t short_handed = 0;
  for (const auto& e : events("chaos", "round_complete")) short_handed += e["short_handed"].get<bool>() ? 1 : 0;
  EXPECT_GT(short_handed, 0);
  // While a slot stood vacant, another member read its shard (docs/failure-model.md, "Data").
  int64_t adopting = 0;
  for (const auto& e : events("chaos", "round_complete")) adopting += e["adopted"].empty() ? 0 : 1;
  EXPECT_GT(adopting, 0) << "no round had a vacant slot's shard read by another member";
  bool worker_adopted = false;
  for (const auto& e : events("chaos", "shards")) worker_adopted = worker_adopted || !e["adopted"].empty();
  EXPECT_TRUE(worker_adopted) << "no worker said it reads another slot's shard";
  // The task table (RUN/coordinator.json) issued again the work the failed workers held.
  const auto saved = nlohmann::json::parse(read_file(run("chaos") / "coordinator.json", "test"));
  const auto& totals = saved["table"]["tasks"]["totals"];  // issued, reissued, done
  ASSERT_EQ(totals.size(), 3u) << saved.dump();
  EXPECT_GT(totals[1].get<int64_t>(), 0) << "no task was issued again after a failure";
  EXPECT_GE(totals[2].get<int64_t>(), 80 * 3) << "80 rounds of at least 3 shards' tasks were done";
  std::map<int64_t, std::set<std::string>> hashes;
  for (const auto& e : events("chaos", "sync")) hashes[e["round"].get<int64_t>()].insert(e["params_hash"].get<std::string>());
  EXPECT_EQ(hashes.size(), 80u) << "every round completed once";
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round << " ended with different θ";
  EXPECT_NE(output.find("joined as member"), std::string::npos);

  if (const char* keep = std::getenv("LOCO_CHAOS_LOG")) fs::copy_file(log("chaos"), keep, fs::copy_options::overwrite_existing);
  const double chaos_loss = final_val_loss("chaos");
  // The killed workers' inner steps since their last round are lost (docs/failure-model.md), and
  // the kills land at random: over 14 runs on a 2-core machine the chaos run ended 2% below to
  // 5.7% above the calm one, and a 15th (a fresh clone's full suite, seed 4217492359) 8.4% above,
  // so 12% is the bound (a run that lost whole rounds would be far above).
  EXPECT_NEAR(chaos_loss, calm_loss, 0.12 * calm_loss) << "calm " << calm_loss << ", chaos " << chaos_loss;
  std::printf("final val_loss: without failures %.4f, with chaos %.4f; %ld round(s) read a vacant slot's shard\n", calm_loss,
              chaos_loss, static_cast<long>(adopting));
}

// Every process of an elastic run killed at once (SIGKILL: workers, coordinator, launcher), then
// `loco launch --resume`: the run continues from the global checkpoint and each slot's inner state
// of the same round, and every round's θ is bit-identical to the uninterrupted run's.
void ChaosTest::full_stop_resume(const std::vector<std::string>& algorithm) {
  std::vector<std::string> shorter = {"--cluster.workers=3", "--train.steps=150"};  // about 30 rounds
  shorter.insert(shorter.end(), algorithm.begin(), algorithm.end());
  auto launch_args = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args = {testing_util::loco_binary(), "launch"};
    for (auto& a : common(name)) args.push_back(a);
    for (auto& a : shorter) args.push_back(a);
    for (auto& a : extra) args.push_back(a);
    return args;
  };
  auto round_hashes = [&](const std::string& name) {
    std::map<int64_t, std::set<std::string>> out;
    for (const auto& e : events(name, "round_complete")) out[e["round"].get<int64_t>()].insert(e["params_hash"].get<std::string>());
    return out;
  };
  auto whole = testing_util::run_command(launch_args("whole", {}), log("whole"), 300s);
  ASSERT_EQ(whole.status, 0) << whole.output;
  const auto reference = round_hashes("whole");
  ASSERT_GE(reference.size(), 28u);

  const int port = testing_util::free_port();
  Child launcher(launch_args("stopped", {"--port", std::to_string(port)}), log("stopped"));
  runtime::CoordinatorClient client(fmt::format("127.0.0.1:{}", port), 20s, kObserver);
  const auto deadline = Clock::now() + 240s;
  const unsigned seed = chaos_seed(4217492359);
  std::mt19937 random(seed);
  SCOPED_TRACE(fmt::format("chaos seed {}", seed));
  ASSERT_TRUE(wait_for_rounds(client, 12, deadline));
  std::this_thread::sleep_for(std::chrono::milliseconds(random() % 400));
  // The workers first (so that none sees its launcher go and stops cleanly), then the launcher.
  auto everyone = testing_util::processes_mentioning(run("stopped").string());
  std::stable_partition(everyone.begin(), everyone.end(), [&](pid_t p) { return p != launcher.pid(); });
  ASSERT_GE(everyone.size(), 4u);
  for (pid_t p : everyone) ::kill(p, SIGKILL);
  EXPECT_EQ(launcher.wait(30s), 128 + SIGKILL);
  const auto before = round_hashes("stopped");
  ASSERT_GE(before.size(), 12u);
  ASSERT_LT(before.size(), reference.size()) << "the run ended before it was killed";

  auto resumed = testing_util::run_command(launch_args("stopped", {"--resume"}), log("resumed"), 300s);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const auto resumes = events("stopped", "run_resumed");
  ASSERT_EQ(resumes.size(), 1u);
  EXPECT_TRUE(resumes[0]["slots_without_inner_state"].empty()) << resumes[0];
  EXPECT_GE(resumes[0]["round"].get<int64_t>(), 11);
  const auto after = round_hashes("stopped");
  EXPECT_EQ(after.size(), reference.size());
  // The global checkpoint's run section (the runtime's, not the strategy's) holds the rounds and
  // where each slot's shard stands; every slot's shard was read.
  const auto final_state = runtime::load_checkpoint(run("stopped") / "checkpoints");
  ASSERT_TRUE(final_state.state.run.has_value());
  EXPECT_EQ(final_state.state.run->rounds, static_cast<int64_t>(reference.size()));
  ASSERT_EQ(final_state.state.run->shards.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    const auto& p = final_state.state.run->shards[s];
    EXPECT_TRUE(p.epoch > 0 || p.cursor > 0) << "slot " << s << "'s shard never advanced";
  }
  for (const auto& [name, tensor] : final_state.sync) EXPECT_FALSE(name.starts_with("elastic.")) << name;
  for (const auto& [round, set] : after) {
    ASSERT_TRUE(reference.count(round));
    EXPECT_EQ(set, reference.at(round)) << "round " << round << ": θ differs from the uninterrupted run's";
  }
}

TEST_F(ChaosTest, FullStopResumeReproducesTheUninterruptedRun) { full_stop_resume({}); }

TEST_F(ChaosTest, FullStopResumeReproducesTheUninterruptedRunOfStreamingDiLoCo) {
  full_stop_resume(kStreaming);
}

// The coordinator of an elastic run (`loco coordinator` with `loco worker`s) is killed with SIGKILL
// and started again: the workers wait for it (cluster.coordinator_timeout_s) and the run goes on
// from its state file. Killed again and not restarted, the workers exit with status 2 saying what
// to do; `loco coordinator --resume` and `loco worker --resume` then finish the run. Every round
// completes once, with one θ. Run again after the end, the coordinator and a worker say the run
// finished and exit 0.
TEST_F(ChaosTest, WorkersOutliveTheCoordinator) {
  const int port = testing_util::free_port();
  const std::string address = fmt::format("127.0.0.1:{}", port);
  auto args = [&](std::vector<std::string> head) {
    for (auto& a : common("live")) head.push_back(a);
    for (const char* a : {"--cluster.workers=3", "--train.steps=150", "--cluster.coordinator_timeout_s=8"}) head.push_back(a);
    return head;
  };
  auto start_coordinator = [&](const std::string& name, bool resume) {
    auto a = args({testing_util::loco_binary(), "coordinator", "--port", std::to_string(port)});
    if (resume) a.push_back("--resume");
    return std::make_unique<Child>(a, log(name));
  };
  auto start_workers = [&](const std::string& name, bool resume) {
    std::vector<std::unique_ptr<Child>> out;
    for (int r = 0; r < 3; ++r) {
      auto a = args({testing_util::loco_binary(), "worker", "--coordinator", address, "--rank", std::to_string(r)});
      if (resume) a.push_back("--resume");
      out.push_back(std::make_unique<Child>(a, log(fmt::format("{}-{}", name, r))));
    }
    return out;
  };
  runtime::CoordinatorClient client(address, 20s, kObserver);
  const auto deadline = Clock::now() + 240s;
  auto wait_for_round = [&](int64_t round) { ASSERT_TRUE(wait_for_rounds(client, round, deadline)) << "round " << round; };

  auto coordinator = start_coordinator("coordinator-1", false);
  auto workers = start_workers("worker", false);
  wait_for_round(5);
  coordinator->signal(SIGKILL);
  EXPECT_EQ(coordinator->wait(10s), 128 + SIGKILL);
  std::this_thread::sleep_for(2s);  // the workers reach their round's end and keep asking
  coordinator = start_coordinator("coordinator-2", false);
  wait_for_round(15);
  coordinator->signal(SIGKILL);
  EXPECT_EQ(coordinator->wait(10s), 128 + SIGKILL);
  for (size_t r = 0; r < workers.size(); ++r) {
    EXPECT_EQ(workers[r]->wait(60s), 2) << "worker " << r << " exits when the coordinator does not come back";
    const auto text = read_file(log(fmt::format("worker-{}", r)), "test");
    EXPECT_NE(text.find("did not answer"), std::string::npos) << text;
    EXPECT_NE(text.find("loco coordinator --resume"), std::string::npos) << text;
  }
  const auto restored = events("live", "coordinator_restored");
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_GE(restored[0]["round"].get<int64_t>(), 5);

  coordinator = start_coordinator("coordinator-3", true);
  workers = start_workers("resumed", true);
  for (size_t r = 0; r < workers.size(); ++r) {
    EXPECT_EQ(workers[r]->wait(120s), 0) << read_file(log(fmt::format("resumed-{}", r)), "test");
  }
  EXPECT_EQ(coordinator->wait(30s), 0) << read_file(log("coordinator-3"), "test");
  EXPECT_EQ(events("live", "run_resumed").size(), 1u);
  const auto lines_at_the_end = read_file(run("live") / "metrics.jsonl", "test");

  // Started again with their original commands once the run finished (the chaos soak's race: its
  // coordinator killed right after it recorded the run finished, which is the last thing it does,
  // and restarted; seed 1653663434), each says where the finished run's report and checkpoints
  // are and exits 0, and nothing in the run folder changes.
  coordinator = start_coordinator("coordinator-4", false);
  EXPECT_EQ(coordinator->wait(30s), 0) << read_file(log("coordinator-4"), "test");
  auto late = args({testing_util::loco_binary(), "worker", "--coordinator", address, "--rank", "0"});
  late.push_back("--cluster.connect_timeout_s=2");  // nobody answers: the coordinator ended with the run
  Child late_worker(late, log("late-worker"));
  EXPECT_EQ(late_worker.wait(60s), 0) << read_file(log("late-worker"), "test");
  for (const char* name : {"coordinator-4", "late-worker"}) {
    const auto text = read_file(log(name), "test");
    EXPECT_NE(text.find("finished already"), std::string::npos) << name << ": " << text;
    EXPECT_NE(text.find("loco report " + run("live").string()), std::string::npos) << name << ": " << text;
    EXPECT_NE(text.find((run("live") / "checkpoints").string()), std::string::npos) << name << ": " << text;
  }
  EXPECT_EQ(read_file(run("live") / "metrics.jsonl", "test"), lines_at_the_end);
  std::map<int64_t, std::set<std::string>> hashes;
  for (const auto& e : events("live", "round_complete")) hashes[e["round"].get<int64_t>()].insert(e["params_hash"].get<std::string>());
  EXPECT_EQ(hashes.size(), 30u);
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round << " ended with different θ";
}

// Across hosts: `loco coordinator` and `loco worker` as on three machines. Each "host" has its own
// loopback address (peers reach a worker at its --cluster.host), its own run folder and its own
// copy of the dataset; the join token comes from the environment. A worker on beta is killed and
// a new one on gamma takes its slot: it receives the state from its peers, finds no slot state on
// its own disk (and says so), and every file lands on the host that wrote it.
TEST_F(ChaosTest, AnElasticRunSpansHostsWithTheirOwnAddressesAndDisks) {
  static constexpr const char* kCrossHostToken = "1c8e2f7a94d3b6e05a7f19c2d48b3e6f";  // 128 bits, as `openssl rand -hex 16`
  struct Token {
    Token() { ::setenv("LOCO_JOIN_TOKEN", kCrossHostToken, 1); }
    ~Token() { ::unsetenv("LOCO_JOIN_TOKEN"); }
  } token;
  const int port = testing_util::free_port();
  const std::string address = fmt::format("127.0.0.1:{}", port);
  for (const char* host : {"beta", "gamma"}) fs::copy(data(), dir_.path() / fmt::format("{}-data", host), fs::copy_options::recursive);
  auto args = [&](std::vector<std::string> head, const std::string& host) {
    // A long re-warmup, so that every step the joiner logs still shows it.
    head.insert(head.end(), {"--config", config().string(), "--run.dir=" + run(host).string(), "--cluster.workers=3",
                             "--train.steps=200", "--optim.rewarmup_steps=1000"});
    head.push_back("--data.dir=" + (host == "alpha" ? data() : dir_.path() / (host + "-data")).string());
    return head;
  };
  auto worker = [&](const std::string& host, const std::string& ip, std::vector<std::string> extra, const std::string& name) {
    auto a = args({testing_util::loco_binary(), "worker", "--coordinator", address, "--cluster.host=" + ip}, host);
    a.insert(a.end(), extra.begin(), extra.end());
    return std::make_unique<Child>(a, log(name));
  };
  Child coordinator(args({testing_util::loco_binary(), "coordinator", "--port", std::to_string(port)}, "alpha"), log("coordinator"));
  auto alpha0 = worker("alpha", "127.0.0.1", {"--rank", "0"}, "alpha-0");
  auto alpha1 = worker("alpha", "127.0.0.1", {"--rank", "1"}, "alpha-1");
  auto beta = worker("beta", "127.0.0.2", {"--rank", "2"}, "beta");

  runtime::CoordinatorClient client(address, 20s, kObserver);
  const auto deadline = Clock::now() + 180s;
  ASSERT_TRUE(wait_for_rounds(client, 5, deadline));
  beta->signal(SIGKILL);
  EXPECT_EQ(beta->wait(10s), 128 + SIGKILL);

  // Without the token a worker is refused, and says why once the unsigned refusal was repeated for
  // its cluster.connect_timeout_s (it cannot tell the coordinator's from a forger's).
  ::unsetenv("LOCO_JOIN_TOKEN");
  auto intruder = worker("gamma", "127.0.0.3", {"--cluster.connect_timeout_s=2"}, "intruder");
  EXPECT_EQ(intruder->wait(60s), 1);
  EXPECT_NE(read_file(log("intruder"), "test").find("join token"), std::string::npos) << read_file(log("intruder"), "test");
  EXPECT_NE(read_file(log("intruder"), "test").find("unsigned"), std::string::npos) << read_file(log("intruder"), "test");
  ::setenv("LOCO_JOIN_TOKEN", kCrossHostToken, 1);

  auto gamma = worker("gamma", "127.0.0.3", {}, "gamma");
  EXPECT_EQ(alpha0->wait(180s), 0) << read_file(log("alpha-0"), "test");
  EXPECT_EQ(alpha1->wait(60s), 0) << read_file(log("alpha-1"), "test");
  EXPECT_EQ(gamma->wait(60s), 0) << read_file(log("gamma"), "test");
  EXPECT_EQ(coordinator.wait(30s), 0) << read_file(log("coordinator"), "test");

  // One θ per round, all 40 of them; the last membership has alpha's two workers and gamma's.
  std::map<int64_t, std::set<std::string>> hashes;
  for (const auto& e : events("alpha", "round_complete")) hashes[e["round"].get<int64_t>()].insert(e["params_hash"].get<std::string>());
  EXPECT_EQ(hashes.size(), 40u);
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round << " ended with different θ";
  const auto memberships = events("alpha", "membership");
  ASSERT_FALSE(memberships.empty());
  std::vector<std::string> last;
  for (const auto& m : memberships.back()["members"]) last.push_back(m["name"].get<std::string>());
  ASSERT_EQ(last.size(), 3u) << memberships.back().dump();
  EXPECT_NE(last[0].find("[127.0.0.1]"), std::string::npos) << last[0];
  EXPECT_NE(last[2].find("[127.0.0.3]"), std::string::npos) << last[2];
  ASSERT_EQ(events("alpha", "failure").size(), 1u);
  EXPECT_NE(events("alpha", "failure")[0]["name"].get<std::string>().find("[127.0.0.2]"), std::string::npos);

  // Files stay on the host that wrote them: the leader's global checkpoints on alpha, each slot's
  // inner state on its own worker's host; the joiner on gamma had none of slot 2's to read.
  const auto gamma_log = read_file(log("gamma"), "test");
  EXPECT_NE(gamma_log.find("joined the run at step"), std::string::npos) << gamma_log;
  EXPECT_NE(gamma_log.find("finds no saved inner state of slot 2"), std::string::npos) << gamma_log;
  ASSERT_EQ(events("gamma", "joined").size(), 1u);
  // With its AdamW moments at zero, the joiner re-warms: its learning rate is the schedule's (alpha's
  // at the same step) times (steps since it joined) / optim.rewarmup_steps.
  const int64_t joined_at = events("gamma", "joined")[0]["step"].get<int64_t>();
  std::map<int64_t, double> alpha_lr;
  for (const auto& e : events("alpha", "train")) alpha_lr[e["step"].get<int64_t>()] = e["lr"].get<double>();
  int compared = 0;
  for (const auto& e : events("gamma", "train")) {
    const int64_t step = e["step"].get<int64_t>();  // its lr is that of the step from step - 1
    if (!alpha_lr.contains(step)) continue;
    EXPECT_NEAR(e["lr"].get<double>(), alpha_lr[step] * static_cast<double>(step - joined_at) / 1000, 1e-12) << "step " << step;
    ++compared;
  }
  EXPECT_GT(compared, 0) << "the joiner logged no step that alpha logged too";
  EXPECT_NE(gamma_log.find("warms up again over 1000 steps"), std::string::npos) << gamma_log;
  EXPECT_TRUE(fs::exists(run("alpha") / "checkpoints"));
  EXPECT_FALSE(fs::exists(run("gamma") / "checkpoints"));
  for (const auto& [host, slot] : std::vector<std::pair<std::string, int>>{{"alpha", 0}, {"alpha", 1}, {"beta", 2}, {"gamma", 2}}) {
    EXPECT_FALSE(runtime::CheckpointStore(run(host) / "slots" / std::to_string(slot), 2).steps().empty()) << host << " slot " << slot;
  }
}

// Time-budgeted rounds (sync.round_seconds) with a worker slowed down by the test (stopped half of
// every 200 ms) and, once, frozen for longer than sync.round_grace_s: the others do not wait for
// it beyond the grace (it is left out of that round and rejoins), it trains fewer tokens than they
// do, and the run completes with one θ per round.
TEST_F(ChaosTest, TimeBudgetedRoundsDoNotWaitForASlowWorker) {
  const int port = testing_util::free_port();
  std::vector<std::string> args = {testing_util::loco_binary(), "launch", "--port", std::to_string(port)};
  for (auto& a : common("budget")) args.push_back(a);
  for (const char* a : {"--cluster.workers=3", "--train.steps=3000", "--sync.round_seconds=0.3", "--sync.round_grace_s=1"}) {
    args.push_back(a);
  }
  Child launcher(args, log("budget"));
  runtime::CoordinatorClient client(fmt::format("127.0.0.1:{}", port), 20s, kObserver);
  auto state = [&] { return elastic_state(client); };
  // The worker of slot 2, once training has started.
  pid_t slow = -1;
  const auto deadline = Clock::now() + 240s;
  while (slow < 0 && Clock::now() < deadline) {
    auto s = state();
    if (s.value("rounds_completed", int64_t{0}) >= 1) {
      for (const auto& m : s["members"]) {
        if (m["slot"] == 2 && m["state"] == "active") slow = pid_of(m);
      }
    }
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GT(slow, 0);
  bool frozen_once = false;
  int status = -1;
  while (Clock::now() < deadline) {
    if (!frozen_once && state().value("rounds_completed", int64_t{0}) >= 5) {
      ::kill(slow, SIGSTOP);  // past the grace, within dead_after_s
      std::this_thread::sleep_for(2000ms);
      ::kill(slow, SIGCONT);
      frozen_once = true;
    }
    ::kill(slow, SIGSTOP);
    std::this_thread::sleep_for(100ms);
    ::kill(slow, SIGCONT);
    std::this_thread::sleep_for(100ms);
    if ((status = launcher.wait(0s)) >= 0) break;
  }
  if (status < 0) status = launcher.wait(60s);
  const auto output = read_file(log("budget"), "test");
  ASSERT_EQ(status, 0) << output;
  EXPECT_TRUE(frozen_once);
  EXPECT_FALSE(events("budget", "left_out").empty()) << output;
  EXPECT_FALSE(events("budget", "rejoin").empty()) << output;
  std::map<int64_t, std::set<std::string>> hashes;
  std::map<std::string, nlohmann::json> completed;  // by the θ the round ended with
  for (const auto& e : events("budget", "round_complete")) {
    hashes[e["round"].get<int64_t>()].insert(e["params_hash"].get<std::string>());
    completed[e["params_hash"].get<std::string>()] = e;
  }
  EXPECT_GT(hashes.size(), 10u);
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round << " ended with different θ";
  std::set<int64_t> rejoined_at;  // rounds that completed without a member whose collective failed
  for (const auto& e : events("budget", "rejoin")) rejoined_at.insert(e["round"].get<int64_t>());
  // Tokens each slot contributed to the rounds, and its weights in them (by tokens): within a round
  // (named by the θ it ended with) the weights of the contributors that logged it sum to one. A
  // contributor whose collective failed after others' had completed logs no sync for the round (it
  // is told to rejoin; its work is in θ nonetheless): then they sum to less. A round may have had
  // one contributor (the others left out, or joining) on a loaded machine; most had more.
  std::map<int64_t, int64_t> tokens;
  std::map<std::string, std::vector<double>> weights;
  for (const auto& e : events("budget", "sync")) {
    if (!e.contains("tokens")) continue;  // a joiner's first round: it adds nothing
    tokens[e["worker"].get<int64_t>()] += e["tokens"].get<int64_t>();
    EXPECT_GT(e["weight"].get<double>(), 0.0);
    weights[e["params_hash"].get<std::string>()].push_back(e["weight"].get<double>());
  }
  ASSERT_EQ(tokens.size(), 3u);
  size_t shared = 0;
  for (const auto& [hash, round] : weights) {
    ASSERT_TRUE(completed.count(hash)) << "a sync ended with " << hash << ", which no round_complete names";
    const auto& done = completed[hash];
    const double sum = std::accumulate(round.begin(), round.end(), 0.0);
    if (static_cast<int64_t>(round.size()) == done["contributors"].get<int64_t>()) {
      EXPECT_NEAR(sum, 1.0, 1e-9) << "the weights of round " << done["round"] << ", which ended with " << hash;
    } else {
      EXPECT_LT(sum, 1.0) << "the weights of round " << done["round"] << ", which ended with " << hash;
      EXPECT_TRUE(rejoined_at.count(done["round"].get<int64_t>()))
          << "round " << done["round"] << " had " << done["contributors"] << " contributors, " << round.size()
          << " logged a sync, and none was told to rejoin";
    }
    if (round.size() > 1) ++shared;
  }
  EXPECT_GT(shared, weights.size() / 2) << "rounds with more than one contributor";
  EXPECT_LT(static_cast<double>(tokens[2]), 0.85 * static_cast<double>(std::min(tokens[0], tokens[1])))
      << "the slowed worker trains less, and the others did not wait for it: tokens " << tokens[0] << ", " << tokens[1]
      << ", " << tokens[2];
  std::printf("time-budgeted rounds: %zu rounds; tokens contributed by slot: %ld, %ld, %ld (slot 2 slowed)\n", hashes.size(),
              static_cast<long>(tokens[0]), static_cast<long>(tokens[1]), static_cast<long>(tokens[2]));
}

// Both workers of an elastic run fail while a replacement waits for the run's state (one frozen,
// the other killed, then the frozen one killed): nobody alive holds θ, so the replacement continues
// from the global checkpoint, a second replacement joins it, and the run completes.
TEST_F(ChaosTest, AReplacementContinuesFromTheCheckpointWhenNoMemberIsLeft) {
  const int port = testing_util::free_port();
  const std::string address = fmt::format("127.0.0.1:{}", port);
  const std::vector<std::string> extra = {"--cluster.workers=2", "--train.steps=800"};
  std::vector<std::string> args = {testing_util::loco_binary(), "launch", "--port", std::to_string(port)};
  for (auto& a : common("orphans")) args.push_back(a);
  for (auto& a : extra) args.push_back(a);
  Child launcher(args, log("orphans"));
  runtime::CoordinatorClient client(address, 20s, kObserver);
  const auto deadline = Clock::now() + 240s;
  auto state = [&] { return elastic_state(client); };
  auto members_in = [&](const char* wanted) {
    std::vector<nlohmann::json> out;
    const auto s = state();  // (iterating state()["members"] would outlive the temporary)
    for (const auto& m : s.value("members", nlohmann::json::array())) {
      if (m["state"] == wanted) out.push_back(m);
    }
    return out;
  };
  auto replacement = [&](const std::string& name) {
    std::vector<std::string> worker = {testing_util::loco_binary(), "worker", "--coordinator", address};
    for (auto& a : common("orphans")) worker.push_back(a);
    for (auto& a : extra) worker.push_back(a);
    return std::make_unique<Child>(worker, log(name));
  };
  while (state().value("rounds_completed", int64_t{0}) < 5 && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  auto active = members_in("active");
  ASSERT_EQ(active.size(), 2u) << state().dump();
  ::kill(pid_of(active[1]), SIGSTOP);  // it holds θ but will never send it
  ::kill(pid_of(active[0]), SIGKILL);
  while (members_in("active").size() != 1 && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  auto first = replacement("replacement-0");
  while (members_in("joining").empty() && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  std::this_thread::sleep_for(500ms);  // it reaches its first round and waits there
  ::kill(pid_of(active[1]), SIGKILL);
  while (members_in("active").empty() && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  auto second = replacement("replacement-1");

  ASSERT_EQ(launcher.wait(240s), 0) << read_file(log("orphans"), "test");
  EXPECT_EQ(first->wait(60s), 0) << read_file(log("replacement-0"), "test");
  EXPECT_EQ(second->wait(60s), 0) << read_file(log("replacement-1"), "test");
  const auto restored = events("orphans", "restored_from_checkpoint");
  ASSERT_EQ(restored.size(), 1u) << read_file(log("orphans"), "test");
  // Killed after round 5 completed, the leader had saved round 4 at least (it may have died writing 5).
  EXPECT_GE(restored[0]["round"].get<int64_t>(), 4);
  EXPECT_FALSE(events("orphans", "eval").empty());
  const auto completed = events("orphans", "round_complete");
  ASSERT_FALSE(completed.empty());
  EXPECT_EQ(completed.back()["step"], 800);
  // A round completed past that checkpoint is undone, and the restart says how many: those
  // completed in its epoch or before. Every round stands completed once, and every sync names the
  // epoch its round completed in (what tells an undone one from the one that stands).
  const auto from = restored[0]["round"].get<int64_t>(), at_epoch = restored[0]["epoch"].get<int64_t>();
  int64_t undone = 0;
  std::map<int64_t, int> standing;
  for (const auto& e : completed) {
    const auto round = e["round"].get<int64_t>();
    if (round > from && e["epoch"].get<int64_t>() <= at_epoch) ++undone;
    else ++standing[round];
  }
  EXPECT_EQ(restored[0]["undone"].get<int64_t>(), undone);
  EXPECT_EQ(standing.size(), 160u) << "800 steps of 5";
  for (const auto& [round, n] : standing) EXPECT_EQ(n, 1) << "round " << round;
  for (const auto& e : events("orphans", "sync")) EXPECT_GE(e.value("epoch", int64_t{-1}), 1) << e.dump();
}

// A worker killed where no launcher sees it exit (the coordinator and the workers started by hand, as
// on several machines): its peers' data-plane connections to it close at once, their heartbeats say
// so, and the coordinator declares it failed within a few heartbeats instead of after
// cluster.dead_after_s (30 s here); the others complete the run without it.
TEST_F(ChaosTest, AKilledWorkerIsDeclaredFailedWhenItsConnectionsCloseNotAfterItsTimeout) {
  const int port = testing_util::free_port();
  const std::string address = fmt::format("127.0.0.1:{}", port);
  const std::vector<std::string> extra = {"--cluster.workers=3", "--train.steps=800", "--cluster.dead_after_s=30"};
  auto args = [&](std::vector<std::string> a) {
    for (auto& c : common("closed")) a.push_back(c);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  Child coordinator(args({testing_util::loco_binary(), "coordinator", "--port", std::to_string(port), "--bind", "127.0.0.1"}),
                    log("closed-coordinator"));
  std::vector<std::unique_ptr<Child>> workers;
  for (int w = 0; w < 3; ++w) {
    workers.push_back(std::make_unique<Child>(args({testing_util::loco_binary(), "worker", "--coordinator", address}),
                                              log(fmt::format("closed-worker-{}", w))));
  }
  runtime::CoordinatorClient client(address, 20s, kObserver);
  const auto deadline = Clock::now() + 240s;
  while (elastic_state(client).value("rounds_completed", int64_t{0}) < 5 && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  pid_t victim = -1;
  int64_t member = -1;
  for (const auto& m : elastic_state(client).value("members", nlohmann::json::array())) {
    if (m["state"] == "active" && victim < 0) victim = pid_of(m), member = m["member"].get<int64_t>();
  }
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  EXPECT_EQ(coordinator.wait(240s), 0) << read_file(log("closed-coordinator"), "test");
  for (auto& w : workers) w->wait(60s);
  const auto failures = events("closed", "failure");
  ASSERT_EQ(failures.size(), 1u) << read_file(log("closed-coordinator"), "test");
  EXPECT_EQ(failures[0]["member"], member);
  EXPECT_NE(failures[0]["how"].get<std::string>().find("its connections to its group closed"), std::string::npos) << failures[0].dump();
  EXPECT_LT(failures[0]["noticed_after_s"].get<double>(), 10.0) << "well within cluster.dead_after_s = 30 s";
  EXPECT_EQ(events("closed", "round_complete").back()["step"], 800);
}

// `loco launch --restarts`: a worker killed in an elastic run is started again by the launcher,
// joins as a replacement for its slot, and the run completes with it.
void ChaosTest::restart_a_dead_worker(const std::vector<std::string>& algorithm) {
  const int port = testing_util::free_port();
  std::vector<std::string> args = {testing_util::loco_binary(), "launch", "--port", std::to_string(port), "--restarts", "1"};
  for (auto& a : common("restarts")) args.push_back(a);
  for (const char* a : {"--cluster.workers=3", "--train.steps=800"}) args.push_back(a);
  args.insert(args.end(), algorithm.begin(), algorithm.end());
  Child launcher(args, log("restarts"));
  runtime::CoordinatorClient client(fmt::format("127.0.0.1:{}", port), 20s, kObserver);
  const auto deadline = Clock::now() + 240s;
  pid_t victim = -1;
  while (victim < 0 && Clock::now() < deadline) {
    const auto s = elastic_state(client);
    if (s.value("rounds_completed", int64_t{0}) >= 5) {
      for (const auto& m : s.value("members", nlohmann::json::array())) {
        if (m["slot"] == 1 && m["state"] == "active") victim = pid_of(m);
      }
    }
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_EQ(launcher.wait(240s), 0) << read_file(log("restarts"), "test");
  const auto output = read_file(log("restarts"), "test");
  EXPECT_NE(output.find("started worker 1 again"), std::string::npos) << output;
  bool replacement_joined = false;
  for (const auto& e : events("restarts", "slot_taken")) replacement_joined = replacement_joined || e.value("slot", -1) == 1;
  EXPECT_TRUE(replacement_joined) << "the new process took slot 1 and received the run's state";
  const auto completed = events("restarts", "round_complete");
  ASSERT_FALSE(completed.empty());
  EXPECT_EQ(completed.back()["contributors"], 3) << "the run ended with all three slots trained";
  std::map<int64_t, std::set<std::string>> hashes;
  for (const auto& e : events("restarts", "sync")) hashes[e["round"].get<int64_t>()].insert(e["params_hash"].get<std::string>());
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round << " ended with different θ";
}

TEST_F(ChaosTest, TheLauncherStartsADeadWorkerAgain) { restart_a_dead_worker({}); }

// The same with Streaming DiLoCo: the replacement joins in the middle of the fragments' schedule.
TEST_F(ChaosTest, TheLauncherStartsADeadWorkerAgainWithStreamingDiLoCo) { restart_a_dead_worker(kStreaming); }

// The same with emulated compute (the goodput-under-failures benchmark's runs): the rounds' state is
// saved for the replacement as with real compute.
TEST_F(ChaosTest, TheLauncherStartsADeadWorkerAgainWithEmulatedCompute) {
  restart_a_dead_worker({"--train.emulated_step_s=0.02"});
  EXPECT_FALSE(events("restarts", "checkpoint").empty()) << "an elastic emulated run saves its rounds";
}

// Eager updates with elastic membership (DiLoCo, then Streaming DiLoCo): the killed worker's exchange
// is most often in flight on the survivors' background thread (it overlaps the next H steps), so
// its round is convened again without it; the restarted worker joins and takes rank 0's eager
// state, and every round's sum (the hash eager members report) is one on all its participants.
TEST_F(ChaosTest, TheLauncherStartsADeadWorkerAgainWithEagerUpdates) { restart_a_dead_worker({"--sync.eager=true"}); }

TEST_F(ChaosTest, TheLauncherStartsADeadWorkerAgainWithEagerStreamingDiLoCo) {
  restart_a_dead_worker(
      {"--sync.algorithm=streaming", "--sync.inner_steps=10", "--sync.fragments=2", "--sync.overlap_steps=0", "--sync.eager=true"});
}

// Elastic Streaming DiLoCo: a worker killed inside a fragment's collective (frozen once the round
// was convened with it, before it reported the round done). The survivors' background reduction
// fails; the round is convened again without it and the same contributions sent again
// (round_retried); the launcher starts the worker again, and the run completes with one θ per round.
void ChaosTest::retry_a_round_that_lost_a_worker(const std::vector<std::string>& algorithm) {
  const int port = testing_util::free_port();
  std::vector<std::string> args = {testing_util::loco_binary(), "launch", "--port", std::to_string(port), "--restarts", "1"};
  for (auto& a : common("streaming")) args.push_back(a);
  for (const char* a : {"--cluster.workers=3", "--train.steps=800"}) args.push_back(a);
  args.insert(args.end(), algorithm.begin(), algorithm.end());
  Child launcher(args, log("streaming"));
  runtime::CoordinatorClient client(fmt::format("127.0.0.1:{}", port), 20s, kObserver);
  const auto deadline = Clock::now() + 240s;
  const unsigned seed = chaos_seed(4217492359);
  std::mt19937 random(seed);
  SCOPED_TRACE(fmt::format("chaos seed {}", seed));
  // The victim is frozen while it waits for round r to be convened and another member still
  // trains, so the round is convened with it but it never takes part in the collective; once it
  // is, the victim is killed. (Killing it after the round was convened raced with Streaming
  // DiLoCo's collective, which runs in the background and may finish before anyone reports done.)
  bool killed = false;
  while (!killed && Clock::now() < deadline) {
    const auto s = elastic_state(client);
    const int64_t next = s.value("rounds_completed", int64_t{0}) + 1;
    if (next < 6 || (s.contains("convened") && s["convened"]["round"] == next)) continue;
    std::vector<nlohmann::json> waiting, training;
    for (const auto& m : s.value("members", nlohmann::json::array())) {
      if (m["state"] != "active") continue;
      (m.value("arrived", int64_t{-1}) == next ? waiting : training).push_back(m);
    }
    if (waiting.empty() || training.empty()) continue;
    const auto victim = waiting[random() % waiting.size()];
    const pid_t pid = pid_of(victim);
    ::kill(pid, SIGSTOP);
    bool convened_with_it = false, missed = false;
    const auto wait_until = Clock::now() + 10s;
    while (!convened_with_it && !missed && Clock::now() < wait_until) {
      const auto t = elastic_state(client);
      if (t.value("rounds_completed", int64_t{0}) >= next) missed = true;
      if (!t.contains("convened") || t["convened"]["round"] != next) continue;
      const auto& c = t["convened"];
      const bool in = std::find(c["participants"].begin(), c["participants"].end(), victim["member"]) != c["participants"].end();
      if (in && c["done"].empty()) convened_with_it = true;
      else missed = true;
    }
    if (!convened_with_it) {
      ::kill(pid, SIGCONT);  // the round went another way (it was declared failed first): try again
      continue;
    }
    ::kill(pid, SIGKILL);
    killed = true;
  }
  ASSERT_TRUE(killed);
  const int status = launcher.wait(240s);
  const auto output = read_file(log("streaming"), "test");
  ASSERT_EQ(status, 0) << output;
  EXPECT_FALSE(events("streaming", "round_retried").empty()) << output;
  std::map<int64_t, std::set<std::string>> hashes;
  for (const auto& e : events("streaming", "sync")) hashes[e["round"].get<int64_t>()].insert(e["params_hash"].get<std::string>());
  EXPECT_GE(hashes.size(), 150u);
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round << " ended with different θ";
  const auto completed = events("streaming", "round_complete");
  ASSERT_FALSE(completed.empty());
  EXPECT_EQ(completed.back()["step"], 800);
}

TEST_F(ChaosTest, StreamingDiLoCoRetriesARoundWhoseCollectiveLostAWorker) { retry_a_round_that_lost_a_worker(kStreaming); }

// Eager updates with elastic membership: the frozen worker's round is an exchange the survivors
// run in the background while they train; at their next sync they find it failed, and convene it
// again without the killed worker (sending the same outer gradients).
TEST_F(ChaosTest, EagerUpdatesRetryARoundWhoseCollectiveLostAWorker) {
  retry_a_round_that_lost_a_worker(
      {"--sync.algorithm=streaming", "--sync.inner_steps=10", "--sync.fragments=2", "--sync.overlap_steps=0", "--sync.eager=true"});
}

// Misbehaving clients on the coordinator's port while an elastic run trains: hundreds of idle
// connections, connections that send their headers a byte at a time, and a flood of unsigned and
// wrongly signed requests. No member is declared dead for it, and the run completes.
TEST_F(ChaosTest, MisbehavingClientsDoNotStarveTheMembers) {
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = std::min<rlim_t>(files.rlim_max, 8192);
  ::setrlimit(RLIMIT_NOFILE, &files);
  const int port = testing_util::free_port();
  std::vector<std::string> args = {testing_util::loco_binary(), "launch", "--port", std::to_string(port)};
  for (auto& a : common("abuse")) args.push_back(a);
  for (const char* a : {"--cluster.workers=3", "--train.steps=300"}) args.push_back(a);
  Child launcher(args, log("abuse"));
  runtime::CoordinatorClient client(fmt::format("127.0.0.1:{}", port), 20s, kObserver);
  ASSERT_TRUE(wait_for_rounds(client, 2, Clock::now() + 120s)) << read_file(log("abuse"), "test");

  std::atomic<bool> quit = false;
  std::atomic<int64_t> idle_open = 0, slow_open = 0, flood_answers = 0, flood_401 = 0;
  std::vector<std::thread> abusers;
  // 600 idle connections, each opened again when the server closes it.
  abusers.emplace_back([&] {
    std::vector<int> fds;
    while (!quit) {
      while (!quit && fds.size() < 600) {
        const int fd = testing_util::connect_loopback(port);
        if (fd < 0) break;
        fds.push_back(fd);
      }
      idle_open = std::max<int64_t>(idle_open, static_cast<int64_t>(fds.size()));
      std::this_thread::sleep_for(200ms);
      // Drop those the server closed (they read as end of file) and open others.
      std::erase_if(fds, [](int fd) {
        char byte;
        const auto n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
          ::close(fd);
          return true;
        }
        return false;
      });
    }
    for (int fd : fds) ::close(fd);
  });
  // 100 slow clients: a heartbeat's headers, one byte every 200 ms.
  abusers.emplace_back([&] {
    const std::string request = "POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "Content-Length: 20\r\nX-Padding: " + std::string(400, 'p') + "\r\n\r\n";
    std::vector<std::pair<int, size_t>> slow;  // (fd, bytes sent)
    while (!quit) {
      while (slow.size() < 100) {
        const int fd = testing_util::connect_loopback(port);
        if (fd < 0) break;
        slow.emplace_back(fd, 0);
      }
      slow_open = std::max<int64_t>(slow_open, static_cast<int64_t>(slow.size()));
      for (auto& [fd, sent] : slow) {
        if (::send(fd, request.data() + sent % request.size(), 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
          ++sent;
        } else {
          ::close(fd);
          fd = -1;
        }
      }
      std::erase_if(slow, [](const auto& c) { return c.first < 0; });
      std::this_thread::sleep_for(200ms);
    }
    for (auto& [fd, sent] : slow) ::close(fd);
  });
  // A flood: 4 threads sending unsigned and wrongly signed requests as fast as they are answered.
  for (int t = 0; t < 4; ++t) {
    abusers.emplace_back([&, t] {
      runtime::CoordinatorClient stranger(fmt::format("127.0.0.1:{}", port), 5s,
                                          t % 2 == 0 ? runtime::ClientSecurity{} : runtime::ClientSecurity{"not the token"});
      stranger.set_patience(1s);
      while (!quit) {
        try {
          auto [status, body] = stranger.request("POST", t < 2 ? "/v1/stop" : "/v1/kv/set?key=epoch/0/0", "{}", 5s);
          ++flood_answers;
          if (status == 401) ++flood_401;
        } catch (const std::exception&) {
        }
      }
    });
  }
  const auto output_deadline = Clock::now() + 300s;
  int status = -1;
  while (Clock::now() < output_deadline && (status = launcher.wait(0s)) < 0) std::this_thread::sleep_for(100ms);
  quit = true;
  for (auto& t : abusers) t.join();
  const auto output = read_file(log("abuse"), "test");
  ASSERT_EQ(status, 0) << output;
  std::printf("abuse: up to %ld idle and %ld slow connections held; %ld flood requests answered, %ld of them 401\n",
              static_cast<long>(idle_open.load()), static_cast<long>(slow_open.load()), static_cast<long>(flood_answers.load()),
              static_cast<long>(flood_401.load()));
  EXPECT_GE(idle_open.load(), 500) << "the idle connections were held open";
  EXPECT_GT(flood_answers.load(), 100);
  EXPECT_EQ(flood_401.load(), flood_answers.load()) << "every stranger's request was refused";
  EXPECT_TRUE(events("abuse", "failure").empty()) << "no member was declared dead: " << output;
  EXPECT_EQ(output.find("stopping"), std::string::npos) << output;
  const auto completed = events("abuse", "round_complete");
  ASSERT_FALSE(completed.empty());
  EXPECT_EQ(completed.back()["step"], 300);
}

// The coordinator process's resident memory (VmRSS) in KiB, and its open sockets; 0 when gone.
std::pair<int64_t, int64_t> memory_and_sockets(pid_t pid) {
  int64_t rss_kib = 0, sockets = 0;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss_kib = std::stoll(line.substr(6));
  }
  std::error_code error;
  for (const auto& fd : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", error)) {
    if (fs::read_symlink(fd.path(), error).string().rfind("socket:", 0) == 0) ++sockets;
  }
  return {rss_kib, sockets};
}

// Whether the server closed `fd` (end of file or a reset); what it sent is read and dropped.
bool closed_by_server(int fd) {
  char buffer[16384];
  for (;;) {
    const auto n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n > 0) continue;
    return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
  }
}

// A TLS connection from `from` whose first bytes, once the handshake is done, are `request`;
// -1 when it could not be made. No certificate check: a stranger does not care. The SSL object is
// freed at once: the socket is all a holder needs.
int tls_holding(SSL_CTX* context, int port, const char* from, const std::string& request) {
  const int fd = testing_util::connect_loopback(port, from);
  if (fd < 0) return -1;
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  SSL* ssl = SSL_new(context);
  SSL_set_fd(ssl, fd);
  const bool sent = SSL_connect(ssl) == 1 && SSL_write(ssl, request.data(), static_cast<int>(request.size())) > 0;
  SSL_free(ssl);
  if (!sent) ::close(fd);
  return sent ? fd : -1;
}

// Hundreds more than 4,096 connections held at once by strangers (from 127.0.0.2-9, as from other hosts)
// while an elastic run trains over TLS: TLS handshakes stalled after a record header, request bodies
// announced and not sent (with well-formed signature headers, which only the body's MAC can prove
// wrong), and refused requests lingering. The coordinator's table fills, it makes room, the
// members' connections go last; no member is declared dead, the run completes, and the
// coordinator's memory stays bounded (by its connection table and body budgets, not by the flood).
TEST_F(ChaosTest, ThousandsOfHeldConnectionsLockNoMemberOutOfATlsRun) {
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = std::min<rlim_t>(files.rlim_max, 16384);
  ::setrlimit(RLIMIT_NOFILE, &files);
  ASSERT_GE(files.rlim_cur, 8192u) << "the test needs 8,192 open files";
  const auto cert = (dir_.path() / "coordinator.pem").string(), key = (dir_.path() / "coordinator.key").string();
  ASSERT_EQ(std::system(("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj "
                         "/CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout " + key + " -out " + cert +
                         " 2>/dev/null").c_str()), 0);
  const int port = testing_util::free_port();
  std::vector<std::string> args = {testing_util::loco_binary(), "launch", "--port", std::to_string(port)};
  for (auto& a : common("held")) args.push_back(a);
  // Long enough for the strangers to fill the table while it trains, also when another test loads
  // the machine.
  for (const std::string& a : {std::string("--cluster.workers=3"), std::string("--train.steps=1200"), "--cluster.tls_cert=" + cert, "--cluster.tls_key=" + key}) {
    args.push_back(a);
  }
  Child launcher(args, log("held"));
  runtime::CoordinatorClient client(fmt::format("127.0.0.1:{}", port), 20s, {.tls = true, .tls_ca = cert, .insecure = true});
  ASSERT_TRUE(wait_for_rounds(client, 2, Clock::now() + 120s)) << read_file(log("held"), "test");

  // The instance the coordinator signs for, told with any refusal: a stranger learns it so.
  SSL_CTX* context = SSL_CTX_new(TLS_client_method());
  std::string instance;
  {
    const int fd = testing_util::connect_loopback(port, "127.0.0.2");
    ASSERT_GE(fd, 0);
    SSL* ssl = SSL_new(context);
    SSL_set_fd(ssl, fd);
    const std::string unsigned_post = "POST /v1/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                      "Content-Length: 2\r\nConnection: close\r\n\r\n{}";
    char answer[4096];
    int n = 0;
    if (SSL_connect(ssl) == 1 && SSL_write(ssl, unsigned_post.data(), static_cast<int>(unsigned_post.size())) > 0) {
      n = SSL_read(ssl, answer, sizeof answer);
    }
    SSL_free(ssl);
    ::close(fd);
    const std::string text(answer, static_cast<size_t>(std::max(n, 0)));
    const std::string header = std::string(runtime::auth::kInstanceHeader) + ": ";
    const auto at = text.find(header);
    ASSERT_NE(at, std::string::npos) << text;
    instance = text.substr(at + header.size(), text.find('\r', at) - at - header.size());
  }
  const auto [baseline_kib, baseline_sockets] = memory_and_sockets(launcher.pid());
  auto body_request = [&] {
    static std::atomic<uint64_t> nonce = 0;
    return fmt::format("POST /v1/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       "Content-Length: 20000\r\nX-Loco-Time: {}\r\nX-Loco-Nonce: {:032x}\r\nX-Loco-Mac: {}\r\n"
                       "X-Loco-Instance: {}\r\n\r\n{{", std::time(nullptr), ++nonce, std::string(64, 'a'), instance);
  };
  const std::string lingering = "POST /v1/stop HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://a.page.example\r\n"
                                "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n";
  const std::string stalled_hello("\x16\x03\x01\x02\x00", 5);  // a handshake record of 512 bytes, never sent

  std::atomic<bool> quit = false;
  std::atomic<int64_t> held[3] = {0, 0, 0}, most[3] = {0, 0, 0};
  // Each kind of holder keeps `target` connections open, opening others as the server closes some.
  auto holder = [&](int kind, size_t target, std::function<int(const char*)> open) {
    return std::thread([&, kind, target, open] {
      // SSL_write to a connection the coordinator closed raises SIGPIPE, which would end this test
      // process: held pending in this thread, the write fails with EPIPE instead.
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
      std::vector<int> fds;
      for (uint64_t n = 0; !quit; ++n) {
        while (!quit && fds.size() < target) {
          const std::string from = fmt::format("127.0.0.{}", 2 + (n++ % 8));
          const int fd = open(from.c_str());
          if (fd >= 0) fds.push_back(fd);
        }
        held[kind] = static_cast<int64_t>(fds.size());
        most[kind] = std::max<int64_t>(most[kind], held[kind]);
        std::this_thread::sleep_for(200ms);
        std::erase_if(fds, [](int fd) {
          if (!closed_by_server(fd)) return false;
          ::close(fd);
          return true;
        });
      }
      for (int fd : fds) ::close(fd);
    });
  };
  std::vector<std::thread> abusers;
  // Together 4,700, 600 more than the table holds: the server closes some all the while (handshakes
  // and bodies past their deadlines) and a holder notices only on its next sweep, so with a margin of
  // a few the table was full only now and then (3,958 sockets at most in one run with 4,100 held).
  abusers.push_back(holder(0, 3200, [&](const char* from) {
    const int fd = testing_util::connect_loopback(port, from);
    if (fd >= 0 && ::send(fd, stalled_hello.data(), stalled_hello.size(), MSG_NOSIGNAL) != 5) {
      ::close(fd);
      return -1;
    }
    return fd;
  }));
  abusers.push_back(holder(1, 1000, [&](const char* from) { return tls_holding(context, port, from, body_request()); }));
  abusers.push_back(holder(2, 500, [&](const char* from) { return tls_holding(context, port, from, lingering); }));

  int64_t peak_kib = baseline_kib, peak_sockets = 0, peak_held = 0;
  const auto output_deadline = Clock::now() + 400s;
  int status = -1;
  while (Clock::now() < output_deadline && (status = launcher.wait(0s)) < 0) {
    const auto [kib, sockets] = memory_and_sockets(launcher.pid());
    peak_kib = std::max(peak_kib, kib);
    peak_sockets = std::max(peak_sockets, sockets);
    peak_held = std::max(peak_held, held[0] + held[1] + held[2]);
    std::this_thread::sleep_for(200ms);
  }
  quit = true;
  for (auto& t : abusers) t.join();
  SSL_CTX_free(context);
  const auto output = read_file(log("held"), "test");
  ASSERT_EQ(status, 0) << output;
  std::printf("held: up to %ld connections held by strangers at once (up to %ld stalled handshakes, %ld bodies, %ld "
              "lingering); the coordinator had up to %ld sockets open; its memory %ld MiB before, %ld MiB at most\n",
              static_cast<long>(peak_held), static_cast<long>(most[0].load()), static_cast<long>(most[1].load()),
              static_cast<long>(most[2].load()), static_cast<long>(peak_sockets), static_cast<long>(baseline_kib / 1024),
              static_cast<long>(peak_kib / 1024));
  EXPECT_GE(peak_held, 4096) << "strangers held more connections than the coordinator's table has room for";
  EXPECT_GE(peak_sockets, 4000) << "the coordinator's table was full";
  // Bounded by the table (4,096 connections, each with its TLS state: about 85 KiB measured) and
  // the bodies' budget (256 MiB), not by how many connections the strangers open.
  EXPECT_LT(peak_kib - baseline_kib, 1024 * 1024) << "the coordinator's memory grew by a GiB or more";
  EXPECT_TRUE(events("held", "failure").empty()) << "no member was declared dead: " << output;
  EXPECT_EQ(output.find("stopping"), std::string::npos) << output;
  const auto completed = events("held", "round_complete");
  ASSERT_FALSE(completed.empty());
  EXPECT_EQ(completed.back()["step"], 1200);
}

}  // namespace
}  // namespace loco
