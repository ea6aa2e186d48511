// The chaos soak (issue #48; docs/failure-model.md, "The chaos soak"): one elastic DiLoCo run of
// `loco coordinator` and 4 `loco worker`s, each process on an emulated island of its own (a real
// network namespace, runtime/launch/islands.h), while faults drawn at random hit it one after another:
//   kill-worker         SIGKILL of a random member
//   freeze-worker       SIGSTOP of a member for 1-6 s (past cluster.dead_after_s about half the time)
//   kill-coordinator    SIGKILL of the coordinator, restarted 1-3 s later with the same command
//   freeze-coordinator  SIGSTOP of the coordinator for 0.5-2.5 s
//   cut-link            a worker's island link cut for 1-8 s (every frame to or from it dropped)
//   fill-disk           a slot's folder (RUN/slots/<k>, a tmpfs of its own) filled for 3-10 s
// A supervisor keeps 4 worker processes: one that exits (killed, evicted, failed on the full disk)
// is replaced by a new `loco worker` on its island, which joins the run. At the end: the run
// completed, every round completed once with one θ on all its participants, every metrics line
// parses and no round, sync or checkpoint is recorded twice, the global checkpoints load, and the
// final validation loss is within 0.05 nat of the same run without faults.
//
// The suite runs a short version once for each committed seed (kSeeds: those that found defects),
// never a random one; bench/chaos-soak.sh draws new seeds (1600 steps: about 25-30 s without faults here, and faults slow
// it further, room for LOCO_SOAK_MIN_FAULTS = 3 faults of up to 10 s each and their pauses; 600
// steps, about 9 s since the step got faster, once ended after one 9 s fault); bench/chaos-soak.sh runs it for 20 minutes and
// more with these variables: LOCO_SOAK_STEPS (the run's steps), LOCO_SOAK_GAP_S (the mean pause
// between faults), LOCO_SOAK_MIN_FAULTS, LOCO_SOAK_MIN_S (the least duration of the faulted run),
// LOCO_SOAK_DEADLINE_S (the most), LOCO_SOAK_DATA (a prepared dataset instead of the tiny
// corpus), LOCO_SOAK_SEED (the faults' seed instead of the committed one), LOCO_SOAK_KEEP (a failed
// soak's metrics.jsonl and logs are copied there), LOCO_SOAK_SUMMARY (a JSON summary is written there), LOCO_SOAK_LOG
// (the fault log is copied there) and LOCO_SOAK_CALM (a file keeping the run without faults, run
// once for every soak of the same build, steps and data).
#include <gtest/gtest.h>

#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <tuple>

#include "cli_util.h"
#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/runtime/coordinator/coordinator_client.h"
#include "loco/runtime/launch/islands.h"
#include "loco/runtime/store/checkpoint.h"
#include "process_util.h"
#include "test_util.h"

namespace loco::soak_test {  // its own namespace: unity builds compile it with chaos_test.cpp
namespace {

namespace fs = std::filesystem;
using testing_util::Child;
using testing_util::TempDir;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kWorkers = 4;

// What a run's metrics.jsonl says of its rounds, checked: every round 1..rounds completed once
// with one θ, and every worker's sync of it ended on that θ and is recorded once. A restart from
// an older global checkpoint (every holder of the newer θ gone: restored_from_checkpoint, with the
// rounds it `undone` and its `epoch`) undoes the rounds completed past it, which are completed
// again: their first completions and syncs, in epochs up to the restart's, are set aside (a
// worker's line may come after the coordinator's restart; its epoch tells which it was).
struct RoundsChecked {
  std::vector<std::string> violations;
  int64_t undone = 0;  // rounds completed, then undone by a restart
};

RoundsChecked check_rounds(const std::vector<nlohmann::json>& all, int64_t rounds) {
  RoundsChecked out;
  std::map<int64_t, std::string> completed;            // round -> θ, of the completions standing
  std::vector<std::pair<int64_t, int64_t>> restarts;   // (round restored, epoch at the restart)
  for (const auto& e : all) {
    const auto kind = e.value("event", "");
    if (kind == "round_complete") {
      const auto round = e["round"].get<int64_t>();
      if (!completed.emplace(round, e["params_hash"].get<std::string>()).second) {
        out.violations.push_back(fmt::format("round {} completed again (epoch {}) with no restart undoing it", round,
                                             e.value("epoch", -1)));
      }
    } else if (kind == "restored_from_checkpoint") {
      const auto round = e["round"].get<int64_t>();
      const auto said = e.value("undone", int64_t{0});
      int64_t undone = 0;
      for (auto it = completed.upper_bound(round); it != completed.end(); it = completed.erase(it)) ++undone;
      if (undone != said) {
        out.violations.push_back(fmt::format("the restart from round {} undid {} completed round(s) but records {}", round,
                                             undone, said));
      }
      out.undone += undone;
      restarts.emplace_back(round, e.value("epoch", int64_t{0}));
    }
  }
  const auto undone = [&](int64_t round, int64_t epoch) {
    return epoch >= 0 && std::any_of(restarts.begin(), restarts.end(),
                                     [&](const auto& r) { return r.first < round && epoch <= r.second; });
  };
  std::set<std::tuple<int64_t, int64_t, std::string>> syncs;  // (round, epoch or -1 when it stands, worker)
  for (const auto& e : all) {
    if (e.value("event", "") != "sync") continue;
    const auto round = e["round"].get<int64_t>();
    const auto epoch = e.value("epoch", int64_t{-1});
    const bool stands = !undone(round, epoch);
    if (!syncs.insert({round, stands ? -1 : epoch, e["worker"].dump()}).second) {
      out.violations.push_back("a sync recorded twice: " + e.dump());
    }
    const auto it = completed.find(round);
    if (stands && it != completed.end() && it->second != e["params_hash"].get<std::string>()) {
      out.violations.push_back(fmt::format("round {} ended with θ {} on a worker and {} in its completion: {}", round,
                                           e["params_hash"].get<std::string>(), it->second, e.dump()));
    }
  }
  for (int64_t r = 1; r <= rounds; ++r) {
    if (!completed.count(r)) out.violations.push_back(fmt::format("round {} never completed", r));
  }
  if (static_cast<int64_t>(completed.size()) != rounds) {
    out.violations.push_back(fmt::format("{} rounds completed, not {}", completed.size(), rounds));
  }
  return out;
}

nlohmann::json line(const std::string& text) { return nlohmann::json::parse(text); }

// The checker itself: it must still catch a round completed twice, and let a restart's undoing
// through (what seed 1746780261's soak recorded, 2026-12-01).
TEST(SoakChecks, ARoundCompletedTwiceIsCaughtUnlessARestartUndidIt) {
  const auto complete = [](int round, int epoch, const char* hash) {
    return line(fmt::format(R"({{"event":"round_complete","round":{},"epoch":{},"params_hash":"{}"}})", round, epoch, hash));
  };
  const auto sync = [](int round, int epoch, int worker, const char* hash) {
    return line(fmt::format(R"({{"event":"sync","round":{},"epoch":{},"worker":{},"params_hash":"{}"}})", round, epoch,
                            worker, hash));
  };
  const std::vector<nlohmann::json> plain = {complete(1, 1, "a"), sync(1, 1, 0, "a"), sync(1, 1, 1, "a"),
                                             complete(2, 1, "b"), sync(2, 1, 0, "b"), sync(2, 1, 1, "b")};
  EXPECT_TRUE(check_rounds(plain, 2).violations.empty());
  EXPECT_FALSE(check_rounds(plain, 3).violations.empty()) << "round 3 never completed";

  auto doubled = plain;
  doubled.push_back(complete(2, 2, "c"));
  doubled.push_back(sync(2, 2, 0, "c"));
  EXPECT_EQ(check_rounds(doubled, 2).violations.size(), 3u) << "completed again, synced twice, on another θ";

  auto restarted = plain;  // worker 1's sync of the undone round comes after the restart, as a late line may
  restarted.erase(restarted.end() - 1);
  restarted.push_back(line(R"({"event":"restored_from_checkpoint","round":1,"step":10,"members":[5],"undone":1,"epoch":1})"));
  restarted.push_back(sync(2, 1, 1, "b"));
  restarted.push_back(complete(2, 3, "c"));
  restarted.push_back(sync(2, 3, 1, "c"));
  restarted.push_back(sync(2, 3, 5, "c"));
  const auto checked = check_rounds(restarted, 2);
  EXPECT_TRUE(checked.violations.empty()) << fmt::format("{}", fmt::join(checked.violations, "; "));
  EXPECT_EQ(checked.undone, 1);

  auto miscounted = restarted;
  for (auto& e : miscounted) {
    if (e["event"] == "restored_from_checkpoint") e["undone"] = 0;
  }
  EXPECT_FALSE(check_rounds(miscounted, 2).violations.empty()) << "a restart must record what it undid";
  auto diverged = restarted;
  diverged.push_back(sync(2, 3, 6, "d"));
  EXPECT_FALSE(check_rounds(diverged, 2).violations.empty()) << "a sync of the standing round on another θ";
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::stoll(v) : fallback;
}
double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::stod(v) : fallback;
}

bool privileged() {
  try {
    runtime::check_network_privileges();
    return true;
  } catch (const Error&) {
    return false;
  }
}

// A small tmpfs mounted at `dir` (created), unmounted when this goes.
class SmallDisk {
 public:
  SmallDisk(fs::path dir, int64_t megabytes) : dir_(std::move(dir)) {
    fs::create_directories(dir_);
    const auto options = fmt::format("size={}m,mode=0755", megabytes);
    if (::mount("loco-soak", dir_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0) {
      throw std::runtime_error(fmt::format("mount tmpfs at {}: {}", dir_.string(), std::strerror(errno)));
    }
  }
  ~SmallDisk() { ::umount2(dir_.c_str(), MNT_DETACH); }
  // Fills what is free with one file; returns the bytes written.
  int64_t fill() {
    std::FILE* f = std::fopen((dir_ / ".soak-fill").c_str(), "wb");
    if (f == nullptr) return 0;
    std::vector<char> block(1 << 20, 0);
    int64_t written = 0;
    for (;;) {
      const size_t n = std::fwrite(block.data(), 1, block.size(), f);
      written += static_cast<int64_t>(n);
      if (n < block.size() || std::fflush(f) != 0) break;
    }
    std::fclose(f);
    return written;
  }
  void free() { fs::remove(dir_ / ".soak-fill"); }

 private:
  fs::path dir_;
};

// The suite's soaks: every seed whose faults once found a defect, each a regression case, so that
// the suite's verdict rests on no random draw (issue #68; a seed fixes the faults and their pauses,
// not the run's pace between them); bench/chaos-soak.sh draws new ones.
struct Seed {
  unsigned seed;
  const char* found;
};
const Seed kSeeds[] = {
    {3197102869, "a worker back after the run finished was refused (745d5ef)"},
    {3337817687, "a worker stopped by a full disk at the end was taken as lost (181f73e)"},
    {3385470866, "a global checkpoint pruned before a restarting member loaded it (829b183)"},
    {3835706187, "the run ended after one fault, short of the 3 required (371dbaf)"},
    {1653663434, "a coordinator restarted as the run finished refused the finished run (issue #68)"},
    {1318186611, "a round completed again after a coordinator restart was recorded twice (issue #68)"},
    {1746780261, "a restart from an older checkpoint did not record the round it undid (issue #68)"},
};

void PrintTo(const Seed& s, std::ostream* os) { *os << s.seed << " (" << s.found << ")"; }

// The soak's seed: LOCO_SOAK_SEED when set (bench/chaos-soak.sh; 0 draws one), else the committed one.
unsigned soak_seed(unsigned committed) {
  const char* v = std::getenv("LOCO_SOAK_SEED");
  if (v == nullptr || *v == '\0') return committed;
  const auto given = static_cast<unsigned>(std::stoul(v));
  return given != 0 ? given : std::random_device()();
}

class ChaosSoak : public ::testing::TestWithParam<Seed> {
 protected:
  void SetUp() override {
    if (const char* data = std::getenv("LOCO_SOAK_DATA"); data != nullptr && *data != '\0') {
      data_ = fs::absolute(data);
    } else {
      data_ = dir_.path() / "data";
      ASSERT_NO_FATAL_FAILURE(testing_util::prepare_tiny_dataset(dir_.path(), data_));
    }
    seed_ = soak_seed(GetParam().seed);
    steps_ = env_int("LOCO_SOAK_STEPS", 1600);
    ASSERT_EQ(steps_ % 40, 0) << "LOCO_SOAK_STEPS: a multiple of 40 (H = 10, evaluated every quarter)";
    std::ofstream(config()) << fmt::format(R"([model]
context = 32
layers = 2
width = 32
heads = 2
[optim]
lr = 0.0005
warmup_steps = 20
[train]
steps = {}
batch_size = 4
device = "cpu"
threads = 1
log_every = 50
seed = {}  # one model and data order: the faults' seed varies (as where each committed seed was found)
[eval]
every = {}
windows = 128
[checkpoint]
keep = 2
[sync]
algorithm = "diloco"
inner_steps = 10
[cluster]
workers = {}
elastic = true
heartbeat_s = 0.5
dead_after_s = 3
timeout_s = 30
join_timeout_s = 120
connect_timeout_s = 30
coordinator_timeout_s = 30
)",
                                           steps_, 1, steps_ / 4, kWorkers);
  }
  void TearDown() override {
    EXPECT_TRUE(testing_util::processes_mentioning(dir_.path().string()).empty()) << "a loco process outlived the soak";
  }

  fs::path config() const { return dir_.path() / "soak.toml"; }
  fs::path run(const std::string& name) const { return dir_.path() / name; }
  std::string log(const std::string& name) const { return (dir_.path() / (name + ".log")).string(); }
  std::vector<std::string> common(const std::string& name) const {
    return {"--config", config().string(), "--data.dir=" + data_.string(), "--run.dir=" + run(name).string()};
  }
  // Every line of the run's metrics.jsonl, each of which must parse.
  std::vector<nlohmann::json> lines(const std::string& name) const {
    std::vector<nlohmann::json> out;
    std::ifstream in(run(name) / "metrics.jsonl");
    int64_t number = 0;
    for (std::string line; std::getline(in, line);) {
      ++number;
      try {
        out.push_back(nlohmann::json::parse(line));
      } catch (const nlohmann::json::exception& e) {
        ADD_FAILURE() << "metrics.jsonl line " << number << " does not parse: " << line.substr(0, 200);
      }
    }
    return out;
  }
  static std::vector<nlohmann::json> of_kind(const std::vector<nlohmann::json>& all, const std::string& kind) {
    std::vector<nlohmann::json> out;
    for (const auto& e : all) {
      if (e.value("event", "") == kind) out.push_back(e);
    }
    return out;
  }
  double final_val_loss(const std::vector<nlohmann::json>& all) const {
    double loss = NAN;
    for (const auto& e : of_kind(all, "eval")) {
      if (e["step"] == steps_ && e["val_loss"].is_number()) loss = e["val_loss"].get<double>();
    }
    return loss;
  }

  struct Calm {
    double loss = NAN, seconds = 0;
    bool kept = false;  // from this process's or LOCO_SOAK_CALM's earlier run
  };
  // The run without faults: run once per process, or read from LOCO_SOAK_CALM when it was run
  // there by the same build for the same steps and data.
  Calm calm_reference() {
    const auto binary = fs::path(testing_util::loco_binary());
    std::string tokens;  // the data, by its tokens (a prepared corpus' folder differs each time)
    for (const char* name : {"train-00000.tok", "val-00000.tok"}) {
      if (fs::exists(data_ / name)) tokens += read_file(data_ / name, "test");
    }
    auto manifest = nlohmann::json::parse(read_file(data_ / "manifest.json", "test"));
    manifest.erase("corpus");
    const nlohmann::json key = {{"config", read_file(config(), "test")},
                                {"manifest", manifest},
                                {"data", fmt::format("{:016x}", std::hash<std::string>{}(tokens))},
                                {"binary", binary.string()},
                                {"binary_size", static_cast<int64_t>(fs::file_size(binary))},
                                {"binary_time", static_cast<int64_t>(fs::last_write_time(binary).time_since_epoch().count())}};
    static std::map<std::string, Calm> ran;  // this process's, by key
    if (auto it = ran.find(key.dump()); it != ran.end()) return {it->second.loss, it->second.seconds, true};
    const char* keep = std::getenv("LOCO_SOAK_CALM");
    if (keep != nullptr && *keep != '\0' && fs::exists(keep)) {
      try {
        const auto kept = nlohmann::json::parse(read_file(keep, "test"));
        if (kept.at("key") == key) return {kept.at("val_loss").get<double>(), kept.at("seconds").get<double>(), true};
      } catch (const std::exception& e) {
        std::printf("soak: %s does not hold the run without faults (%s): running it\n", keep, e.what());
      }
    }
    const auto start = Clock::now();
    auto calm = testing_util::run_command([&] {
      std::vector<std::string> args = {testing_util::loco_binary(), "launch"};
      for (auto& a : common("calm")) args.push_back(a);
      return args;
    }(), log("calm"), std::chrono::seconds(120 + steps_));
    EXPECT_EQ(calm.status, 0) << calm.output;
    Calm out{final_val_loss(lines("calm")), std::chrono::duration<double>(Clock::now() - start).count(), false};
    if (calm.status != 0 || !std::isfinite(out.loss)) {
      ADD_FAILURE() << "the run without faults gave no final loss";
      return out;
    }
    ran[key.dump()] = out;
    if (keep != nullptr && *keep != '\0') {
      std::ofstream(keep) << nlohmann::json{{"key", key}, {"val_loss", out.loss}, {"seconds", out.seconds}}.dump(1) << "\n";
    }
    return out;
  }

  TempDir dir_;
  fs::path data_;
  unsigned seed_ = 0;
  int64_t steps_ = 0;
};

nlohmann::json elastic_state(runtime::CoordinatorClient& client) {
  try {
    auto [status, body] = client.request("GET", "/v1/state", "", 2s);
    if (status == 200) return nlohmann::json::parse(body)["elastic"];
  } catch (const std::exception&) {
  }
  return nlohmann::json::object();
}

pid_t pid_of(const nlohmann::json& member) {
  const auto name = member["name"].get<std::string>();
  return static_cast<pid_t>(std::stol(name.substr(name.rfind(':') + 1)));
}

TEST_P(ChaosSoak, RandomFaultsLoseNothing) {
  if (!privileged()) GTEST_SKIP() << "needs root (network namespaces for the islands, tmpfs for the full disks)";
  static constexpr const char* kToken = "5f0c3e8a1b7d24969e0a4c6b2f1d8e37";  // the islands' run is not on loopback
  struct Token {
    Token() { ::setenv("LOCO_JOIN_TOKEN", kToken, 1); }
    ~Token() { ::unsetenv("LOCO_JOIN_TOKEN"); }
  } token;

  // The same run without faults (one machine, `loco launch`): the reference loss. It is
  // deterministic (46 soaks' at c19df54 all ended on 0.330826), so one process runs it once for
  // all its seeds, and bench/chaos-soak.sh once for all its soaks (LOCO_SOAK_CALM: a file that
  // keeps it, for this build, these steps and this data).
  const auto [calm_loss, calm_s, calm_kept] = calm_reference();
  if (HasFatalFailure()) return;
  std::printf("soak: the run without faults took %.0f s, final val_loss %.4f%s\n", calm_s, calm_loss,
              calm_kept ? " (kept from an earlier soak)" : "");

  // Islands: 0 the coordinator, 1..4 the workers' places, 5 this test's own (it polls the coordinator).
  std::vector<runtime::LinkSpec> links(kWorkers + 2, runtime::LinkSpec::parse("delay=2ms"));
  runtime::Islands islands(links);
  const size_t observer = kWorkers + 1;
  islands.enter(observer);
  struct Leave {
    runtime::Islands& islands;
    ~Leave() { islands.leave(); }
  } leave{islands};
  const int port = testing_util::free_port();
  const std::string address = fmt::format("{}:{}", islands.address(0), port);

  const unsigned seed = seed_;
  std::mt19937 random(seed);
  SCOPED_TRACE(seed == GetParam().seed ? fmt::format("soak seed {} (committed for: {})", seed, GetParam().found)
                                        : fmt::format("soak seed {} (LOCO_SOAK_SEED)", seed));
  auto uniform = [&](double low, double high) { return std::uniform_real_distribution<double>(low, high)(random); };
  const double gap_s = env_double("LOCO_SOAK_GAP_S", 1.0);
  const auto start = Clock::now();
  // CTest gives a test 300 s: the suite's version must end well within them.
  const auto deadline = start + std::chrono::seconds(env_int("LOCO_SOAK_DEADLINE_S", 200));
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };

  std::ofstream fault_log(log("faults"));
  auto note = [&](const std::string& text) {
    fault_log << fmt::format("{:8.1f} s  {}\n", elapsed(), text) << std::flush;
  };

  int coordinators = 0;
  auto start_coordinator = [&] {
    std::vector<std::string> a = {testing_util::loco_binary(), "coordinator", "--port", std::to_string(port), "--bind",
                                  islands.address(0)};
    for (auto& c : common("chaos")) a.push_back(c);
    return std::make_unique<Child>(a, log(fmt::format("coordinator-{}", coordinators++)), islands.netns_fd(0));
  };
  auto coordinator = start_coordinator();
  runtime::CoordinatorClient client(address, 5s, runtime::ClientSecurity{kToken});
  for (const auto up = Clock::now() + 60s; elastic_state(client).empty() && Clock::now() < up;) std::this_thread::sleep_for(100ms);
  ASSERT_FALSE(elastic_state(client).empty()) << read_file(log("coordinator-0"), "test");

  // Each slot's inner state on a disk of its own, small enough to fill; mounted in a mount
  // namespace of this thread's (and the processes it starts), so that nothing outlives the test.
  if (::unshare(CLONE_NEWNS) == 0) ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr);
  std::vector<std::unique_ptr<SmallDisk>> disks;
  for (int k = 0; k < kWorkers; ++k) disks.push_back(std::make_unique<SmallDisk>(run("chaos") / "slots" / std::to_string(k), 64));

  // The supervisor: a worker process per place; one that exits is replaced.
  struct Place {
    std::unique_ptr<Child> child;
    std::string name;
    double started_s = 0;
  };
  std::vector<Place> places(kWorkers);
  std::map<std::string, int> exits;  // "status N" -> how many
  int started = 0;
  bool run_over = false;
  auto start_worker = [&](size_t place) {
    std::vector<std::string> a = {testing_util::loco_binary(), "worker", "--coordinator", address};
    for (auto& c : common("chaos")) a.push_back(c);
    places[place].name = fmt::format("worker-{}", started++);
    places[place].child = std::make_unique<Child>(a, log(places[place].name), islands.netns_fd(place + 1));
    places[place].started_s = elapsed();
  };
  for (size_t p = 0; p < places.size(); ++p) start_worker(p);
  nlohmann::json exit_reasons = nlohmann::json::array();
  auto supervise = [&] {
    for (size_t p = 0; p < places.size(); ++p) {
      if (!places[p].child) continue;
      const int status = places[p].child->wait(0s);
      if (status < 0) continue;
      ++exits[fmt::format("status {}", status)];
      std::string why;
      if (status != 0 && status != 128 + SIGKILL) {  // what it said last
        const auto text = read_file(log(places[p].name), "test");
        const auto error = text.rfind("error:");
        why = error == std::string::npos ? text.substr(text.size() - std::min<size_t>(text.size(), 300))
                                         : text.substr(error, text.find('\n', error) - error);
        exit_reasons.push_back({{"worker", places[p].name}, {"status", status}, {"said", why}});
      }
      note(fmt::format("{} (island {}) exited with status {}{}", places[p].name, p + 1, status, why.empty() ? "" : ": " + why));
      places[p].child.reset();
      if (!run_over && status != 0) {  // status 0: it finished the run
        start_worker(p);
        note(fmt::format("{} started on island {}", places[p].name, p + 1));
      }
    }
  };
  // Waits `seconds`, supervising; false once the run is over (the coordinator exited: 0 when the
  // run completed; anything else is a failure of the run, which the soak does not mend).
  int coordinator_status = -1;
  auto pause = [&](double seconds) {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    while (Clock::now() < until) {
      supervise();
      if (coordinator && (coordinator_status = coordinator->wait(0s)) >= 0) {
        note(fmt::format("the coordinator exited with status {}", coordinator_status));
        run_over = true;
      }
      if (run_over) return false;
      std::this_thread::sleep_for(50ms);
    }
    return true;
  };
  auto member_pid = [&]() -> std::pair<pid_t, size_t> {  // a random active member and its place
    const auto s = elastic_state(client);
    std::vector<std::pair<pid_t, size_t>> active;
    for (const auto& m : s.value("members", nlohmann::json::array())) {
      if (m["state"] != "active") continue;
      const pid_t pid = pid_of(m);
      for (size_t p = 0; p < places.size(); ++p) {
        if (places[p].child && places[p].child->pid() == pid) active.emplace_back(pid, p);
      }
    }
    if (active.empty()) return {-1, 0};
    return active[random() % active.size()];
  };

  std::map<std::string, int> faults;
  while (elastic_state(client).value("rounds_completed", int64_t{0}) < 3 && Clock::now() < deadline && pause(0.2)) {
  }
  const std::vector<std::string> kinds = {"kill-worker", "freeze-worker", "kill-coordinator", "freeze-coordinator", "cut-link",
                                          "fill-disk"};
  while (!run_over && Clock::now() < deadline) {
    if (!pause(uniform(0.3, 2 * gap_s))) break;
    const auto kind = kinds[random() % kinds.size()];
    if (kind == "kill-worker" || kind == "freeze-worker") {
      const auto [pid, place] = member_pid();
      if (pid < 0) continue;
      if (kind == "kill-worker") {
        ::kill(pid, SIGKILL);
        note(fmt::format("kill-worker: SIGKILL {} (island {})", places[place].name, place + 1));
      } else {
        const double d = uniform(1, 6);
        ::kill(pid, SIGSTOP);
        note(fmt::format("freeze-worker: SIGSTOP {} (island {}) for {:.1f} s", places[place].name, place + 1, d));
        pause(d);
        ::kill(pid, SIGCONT);
      }
    } else if (kind == "kill-coordinator") {
      if (!coordinator) continue;
      coordinator->signal(SIGKILL);
      const int status = coordinator->wait(10s);
      if (status != 128 + SIGKILL) {  // it had exited already
        coordinator_status = status;
        run_over = true;
        break;
      }
      const double d = uniform(1, 3);
      note(fmt::format("kill-coordinator: SIGKILL (status {}), restarted after {:.1f} s", status, d));
      coordinator.reset();
      pause(d);
      coordinator = start_coordinator();
    } else if (kind == "freeze-coordinator") {
      if (!coordinator) continue;
      const double d = uniform(0.5, 2.5);
      coordinator->signal(SIGSTOP);
      note(fmt::format("freeze-coordinator: SIGSTOP for {:.1f} s", d));
      pause(d);
      coordinator->signal(SIGCONT);
    } else if (kind == "cut-link") {
      const size_t place = random() % places.size();
      const double d = uniform(1, 8);
      islands.set_cut(place + 1, true);
      note(fmt::format("cut-link: island {} ({}) cut for {:.1f} s", place + 1, places[place].name, d));
      pause(d);
      islands.set_cut(place + 1, false);
    } else if (kind == "fill-disk") {
      const size_t k = random() % disks.size();
      const double d = uniform(3, 10);
      const int64_t filled = disks[k]->fill();
      note(fmt::format("fill-disk: slots/{} filled ({} MB) for {:.1f} s", k, filled >> 20, d));
      pause(d);
      disks[k]->free();
    }
    ++faults[kind];
  }
  for (size_t p = 0; p < places.size(); ++p) {
    if (places[p].child) ::kill(places[p].child->pid(), SIGCONT);
  }
  for (size_t i = 0; i + 1 < islands.size(); ++i) islands.set_cut(i, false);
  for (auto& d : disks) d->free();
  ASSERT_TRUE(run_over) << "the run did not complete within the soak's deadline";
  ASSERT_EQ(coordinator_status, 0) << read_file(log(fmt::format("coordinator-{}", coordinators - 1)), "test");
  const double soak_s = elapsed();
  note(fmt::format("the run completed after {:.1f} s", soak_s));
  // The survivors end with the run.
  int late = 0;
  for (auto& place : places) {
    if (!place.child) continue;
    const int status = place.child->wait(60s);
    const auto text = read_file(log(place.name), "test");
    note(fmt::format("{} exited with status {}", place.name, status));
    // The coordinator ends the run once every member has left: a worker still running then was no
    // member (declared failed while frozen or cut off, and asking to rejoin; or a replacement
    // started in the run's last seconds). It cannot tell a coordinator gone with its run from one
    // that died, and says it cannot reach it (status 2, after cluster.connect_timeout_s or
    // cluster.coordinator_timeout_s).
    if (status == 2 && (text.find("cannot reach the coordinator") != std::string::npos ||
                        text.find("stopped answering while this worker waited for a slot") != std::string::npos ||
                        text.find("did not answer") != std::string::npos)) {
      ++late;
      continue;
    }
    // A fill-disk fault still on when the run ended may have caught this worker's last write: it
    // stops on it as any worker does (status 1, naming the full disk), checked with the others below.
    if (status == 1) {
      const auto error = text.rfind("error:");
      const auto said = error == std::string::npos ? text : text.substr(error, text.find('\n', error) - error);
      exit_reasons.push_back({{"worker", place.name}, {"status", status}, {"said", said}});
      ++exits["status 1"];
      continue;
    }
    EXPECT_EQ(status, 0) << place.name << ": " << text;
  }
  coordinator.reset();
  disks.clear();

  int total = 0;
  for (const auto& [kind, n] : faults) total += n;
  const auto all = lines("chaos");
  const double chaos_loss = final_val_loss(all);

  // Every round completed once, with one θ on all who took part in it (a restart from an older
  // checkpoint's undoing set aside: check_rounds).
  const auto rounds_checked = check_rounds(all, steps_ / 10);
  for (const auto& v : rounds_checked.violations) ADD_FAILURE() << v;
  const int64_t rounds = steps_ / 10;
  // Every global checkpoint recorded once; the kept ones load, the last at the final step.
  std::set<int64_t> saved;
  for (const auto& e : of_kind(all, "checkpoint")) {
    EXPECT_TRUE(saved.insert(e["step"].get<int64_t>()).second) << "a checkpoint recorded twice: " << e.dump();
  }
  runtime::CheckpointStore store(run("chaos") / "checkpoints", 2);
  ASSERT_FALSE(store.steps().empty());
  EXPECT_EQ(store.steps().back(), steps_);
  for (const auto step : store.steps()) {
    EXPECT_TRUE(saved.count(step)) << "checkpoint of step " << step << " on disk but not in metrics.jsonl";
    EXPECT_NO_THROW(runtime::load_checkpoint(store.at(step))) << "step " << step;
  }
  // A worker exits on its own only when its slot's disk is full (status 1, naming the file); every
  // other fault is met inside the run.
  for (const auto& r : exit_reasons) {
    const auto said = r["said"].get<std::string>();
    EXPECT_TRUE(r["status"] == 1 && said.find("the disk is full") != std::string::npos) << r.dump();
  }
  EXPECT_GE(total, env_int("LOCO_SOAK_MIN_FAULTS", 3));
  EXPECT_GE(soak_s, static_cast<double>(env_int("LOCO_SOAK_MIN_S", 0))) << "the run ended before the soak's least duration";
  EXPECT_NEAR(chaos_loss, calm_loss, 0.05) << "calm " << calm_loss << ", chaos " << chaos_loss;

  nlohmann::json summary = {{"seed", seed},
                            {"steps", steps_},
                            {"rounds", rounds},
                            {"soak_s", soak_s},
                            {"calm_s", calm_s},
                            {"calm_kept", calm_kept},
                            {"faults", faults},
                            {"faults_total", total},
                            {"worker_exits", exits},
                            {"worker_exit_reasons", exit_reasons},
                            {"workers_outside_the_run_at_its_end", late},
                            {"workers_started", started},
                            {"coordinators_started", coordinators},
                            {"failures", of_kind(all, "failure").size()},
                            {"rounds_retried", of_kind(all, "round_retried").size()},
                            {"rejoins", of_kind(all, "rejoin").size()},
                            {"coordinator_restored", of_kind(all, "coordinator_restored").size()},
                            {"restored_from_checkpoint", of_kind(all, "restored_from_checkpoint").size()},
                            {"rounds_undone", rounds_checked.undone},
                            {"short_handed_rounds", 0},
                            {"frames_cut", islands.frames_cut()},
                            {"metrics_lines", all.size()},
                            {"checkpoints_recorded", saved.size()},
                            {"calm_val_loss", calm_loss},
                            {"chaos_val_loss", chaos_loss}};
  int64_t short_handed = 0;
  for (const auto& e : of_kind(all, "round_complete")) short_handed += e.value("short_handed", false) ? 1 : 0;
  summary["short_handed_rounds"] = short_handed;
  fault_log.close();
  if (const char* path = std::getenv("LOCO_SOAK_SUMMARY"); path != nullptr && *path != '\0') {
    std::ofstream(path) << summary.dump(1) << "\n";
  }
  if (const char* path = std::getenv("LOCO_SOAK_LOG"); path != nullptr && *path != '\0') {
    fs::copy_file(log("faults"), path, fs::copy_options::overwrite_existing);
  }
  if (HasFailure()) std::printf("the soak's faults:\n%s\n", read_file(log("faults"), "test").c_str());
  // What a failed soak leaves for its diagnosis (bench/chaos-soak.sh): the run's metrics.jsonl and
  // every process's log, copied to LOCO_SOAK_KEEP.
  if (const char* keep = std::getenv("LOCO_SOAK_KEEP"); HasFailure() && keep != nullptr && *keep != '\0') {
    fs::create_directories(keep);
    fs::copy_file(run("chaos") / "metrics.jsonl", fs::path(keep) / "metrics.jsonl", fs::copy_options::overwrite_existing);
    for (const auto& entry : fs::directory_iterator(dir_.path())) {
      if (entry.path().extension() == ".log") fs::copy_file(entry.path(), fs::path(keep) / entry.path().filename(), fs::copy_options::overwrite_existing);
    }
  }
  std::printf("soak: %d faults in %.0f s, final val_loss %.4f (without faults %.4f)\n%s\n", total, soak_s, chaos_loss, calm_loss,
              summary.dump().c_str());
}

INSTANTIATE_TEST_SUITE_P(Seeds, ChaosSoak, ::testing::ValuesIn(kSeeds),
                         [](const ::testing::TestParamInfo<Seed>& info) { return std::to_string(info.param.seed); });

}  // namespace
}  // namespace loco::soak_test
