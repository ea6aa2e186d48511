// DiPaCo's training as tasks, end to end: real `loco launch` and `loco path-worker` processes on a
// tiny corpus, 4 paths (levels 1:2,1:2) through 5 modules, 4 phases. Training is deterministic on
// one thread, so every way of running the same run (one worker; two; a worker killed mid-task; a
// stop and a resume; the registry in PostgreSQL with the server crashed and restarted mid-run)
// must end on the same modules, bit for bit: the reference run with one worker says what they are.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cli_util.h"
#include "loco/core/files.h"
#include "loco/core/run_folder.h"
#include "loco/data/dataset.h"
#include "loco/model/paths.h"
#include "loco/model/transformer.h"
#include "loco/runtime/store/modules.h"
#include "loco/runtime/dipaco/evaluation.h"
#include "loco/runtime/dipaco/inference.h"
#include "loco/runtime/dipaco/run.h"
#include "loco/runtime/dipaco/worker.h"
#include "loco/runtime/worker/hugging_face.h"
#include "loco/runtime/worker/weights.h"
#include "process_util.h"
#include "runtime/dipaco/postgres_server.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

constexpr uint64_t kAnySize = uint64_t{1} << 32;  // module files' size bound (DipacoRun::max_file_bytes)

namespace fs = std::filesystem;
using testing_util::Child;
using testing_util::run_command;
using testing_util::TempDir;

using Modules = std::map<std::string, NamedTensors>;

// Stops `child` and waits until it is stopped: kill() returns before the signal takes effect, and a
// worker that runs on for that moment may finish the very task the test then looks at.
void freeze(Child& child) {
  child.signal(SIGSTOP);
  const auto stat = fmt::format("/proc/{}/stat", child.pid());
  for (int i = 0; i < 5000; ++i) {
    std::ifstream in(stat);
    std::string line;
    std::getline(in, line);
    const auto close = line.rfind(')');
    if (close == std::string::npos || close + 2 >= line.size() || line[close + 2] == 'T' || line[close + 2] == 't') return;
    if (line[close + 2] == 'Z') {
      ADD_FAILURE() << "process " << child.pid() << " exited before it could be stopped";
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ADD_FAILURE() << "process " << child.pid() << " did not stop";
}

class DipacoRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_NO_FATAL_FAILURE(testing_util::prepare_tiny_dataset(dir_->path(), data()));
    std::ofstream(config_file()) << R"([model]
context = 32
layers = 2
width = 32
heads = 2
[optim]
lr = 0.003
warmup_steps = 5
[train]
steps = 40
batch_size = 4
threads = 1
device = "cpu"
[sync]
inner_steps = 10
[eval]
windows = 8
[cluster]
workers = 2
coordinator_timeout_s = 60
[dipaco]
levels = "1:2,1:2"
lease_s = 2
)";
  }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
    delete dir_;
  }

  static fs::path data() { return dir_->path() / "data"; }
  static fs::path config_file() { return dir_->path() / "dipaco.toml"; }
  static std::string log(const std::string& name) { return (dir_->path() / (name + ".log")).string(); }
  static std::vector<std::string> overrides(const std::string& run, const std::vector<std::string>& more = {}) {
    std::vector<std::string> out = {"data.dir=" + data().string(), "run.dir=" + (dir_->path() / run).string()};
    out.insert(out.end(), more.begin(), more.end());
    return out;
  }
  static RunConfig config(const std::string& run, const std::vector<std::string>& more = {}) {
    return load_config(config_file(), overrides(run, more));
  }
  static std::vector<std::string> command(const std::string& verb, const std::string& run,
                                          const std::vector<std::string>& more = {}) {
    std::vector<std::string> argv = {testing_util::loco_binary(), verb, "--config", config_file().string()};
    for (const auto& o : overrides(run, more)) argv.push_back("--" + o);
    return argv;
  }

  // Every module's last version, as the run's registry names it.
  static Modules final_modules(const RunConfig& c) {
    auto registry = open_run_registry(c);
    const auto layout = registry->layout();
    EXPECT_TRUE(layout.has_value());
    EXPECT_TRUE(registry->finished());
    Modules out;
    for (const auto& modules : layout->path_modules) {
      for (const auto& m : modules) {
        if (out.count(m) == 0) out[m] = load_module(c.run.dir, m, layout->phases, layout->plan, kAnySize).parameters;
      }
    }
    return out;
  }

  static void expect_same_modules(const Modules& got, const Modules& want) {
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, tensors] : want) {
      const auto& other = got.at(name);
      ASSERT_EQ(other.size(), tensors.size()) << name;
      for (size_t i = 0; i < tensors.size(); ++i) {
        EXPECT_TRUE(torch::equal(other[i].second, tensors[i].second)) << name << " " << tensors[i].first << " differs";
      }
    }
  }

  // The run with one worker, start to end, uninterrupted.
  static const Modules& reference() {
    if (reference_ == nullptr) {
      const auto c = config("reference");
      prepare_dipaco_run(c, stderr);
      auto worker = run_command(command("path-worker", "reference"), log("reference"));
      EXPECT_EQ(worker.status, 0) << worker.output;
      reference_ = new Modules(final_modules(c));
    }
    return *reference_;
  }

  // The path_task events of a run's metrics.jsonl.
  static std::vector<nlohmann::json> path_tasks(const std::string& run) {
    std::vector<nlohmann::json> out;
    std::ifstream in(dir_->path() / run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto event = nlohmann::json::parse(line);
      if (event["event"] == "path_task") out.push_back(event);
    }
    return out;
  }

  // Waits until `done` tasks of the run are done (or 60 s passed).
  static void wait_for_done(const RunConfig& c, int64_t done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      int64_t n = 0;
      // Not before the launcher made the registry: opening it would create it, in a folder the
      // launcher may not have checked yet ("already holds a run": seen under load in CI).
      if (c.dipaco.database.empty() && !std::filesystem::exists(RunFolder(c.run.dir).dipaco_registry())) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      try {
        for (const auto& t : open_run_registry(c)->tasks()) n += t.state == TaskState::kDone;
      } catch (const DataError&) {  // the launcher has not made the run folder yet
      }
      if (n >= done) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "fewer than " << done << " tasks were done after 60 s";
  }

  // A worker killed in the middle of a path task: its task goes to the other worker when its lease
  // runs out, and the run ends on the same modules as the uninterrupted one. `database` picks
  // the registry's.
  static void kill_a_worker_mid_task(const std::string& run, const std::vector<std::string>& database) {
    const auto c = config(run, database);
    auto args = [&](const std::string& name) {
      auto argv = command("path-worker", run, database);
      argv.insert(argv.end(), {"--name", name});
      return argv;
    };
    prepare_dipaco_run(c, stderr);
    // A alone first (with both at once, B could finish the tiny run before A has started up).
    Child a(args("A"), log(run + "-a"));
    // Freeze A, and kill it if it holds a path task it has not finished; else let it go on and look again.
    std::optional<TaskKey> killed;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    auto registry = open_run_registry(c);
    while (!killed && std::chrono::steady_clock::now() < deadline) {
      freeze(a);
      for (const auto& t : registry->tasks()) {
        if (t.key.scope == TaskScope::kPath && t.state == TaskState::kLeased && t.holder == "A") killed = t.key;
      }
      a.signal(killed ? SIGKILL : SIGCONT);
      if (!killed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(killed.has_value()) << "worker A never held a path task; its output:\n" << read_file(log(run + "-a"), "test");
    EXPECT_EQ(a.wait(std::chrono::seconds(10)), 128 + SIGKILL);
    Child b(args("B"), log(run + "-b"));
    ASSERT_EQ(b.wait(std::chrono::seconds(240)), 0) << read_file(log(run + "-b"), "test");
    expect_same_modules(final_modules(c), reference());
    const auto modules = registry->layout();
    for (const auto& t : registry->tasks()) {
      if (t.key != *killed) continue;
      EXPECT_EQ(t.state, TaskState::kDone);
      EXPECT_GE(t.leases, 2) << describe(t.key) << " was not issued again";
      EXPECT_EQ(t.holder, "B");
    }
    // Nothing was trained twice into a module: one report per path through it, every phase.
    for (int64_t phase = 0; phase < modules->phases; ++phase) {
      EXPECT_EQ(registry->reports("embed", phase).size(), 4u) << "phase " << phase;
      EXPECT_EQ(registry->reports("L1.M0", phase).size(), 2u) << "phase " << phase;
    }
  }

  static TempDir* dir_;
  static Modules* reference_;
};
TempDir* DipacoRunTest::dir_ = nullptr;
Modules* DipacoRunTest::reference_ = nullptr;

// Scores as `loco eval --json` writes them: every validation document once, each scored on all its
// tokens less the router's; the path and run losses are the documents' summed; every pair of the
// DiPaCo run and its `baselines` baselines compared, the difference inside its interval.
void expect_every_document_scored_whole(const RunConfig& c, const nlohmann::json& scores, size_t baselines) {
  const auto dataset = data::Dataset::open(c.data.dir);
  const auto& val = dataset.val().documents;
  std::set<int64_t> seen;
  std::map<int64_t, std::pair<double, int64_t>> by_path;
  std::vector<double> sums(baselines + 1, 0.0);
  int64_t tokens = 0;
  for (const auto& d : scores.at("documents")) {
    const auto index = d.at("document").get<int64_t>();
    EXPECT_TRUE(seen.insert(index).second) << "document " << index << " scored twice";
    const int64_t length = val.at(static_cast<size_t>(index)).length;
    const int64_t routed = std::min<int64_t>(c.data.route_tokens, length);
    EXPECT_EQ(d.at("tokens").get<int64_t>(), length - std::max<int64_t>(routed, 1)) << "document " << index;
    const auto losses = d.at("loss_sums").get<std::vector<double>>();
    ASSERT_EQ(losses.size(), baselines + 1);
    for (size_t m = 0; m < losses.size(); ++m) sums[m] += losses[m];
    auto& path = by_path[d.at("path").get<int64_t>()];
    path.first += losses[0];
    path.second += d.at("tokens").get<int64_t>();
    tokens += d.at("tokens").get<int64_t>();
  }
  int64_t scorable = 0;
  for (const auto& doc : val) scorable += doc.length > std::max<int64_t>(c.data.route_tokens, 1);
  EXPECT_EQ(static_cast<int64_t>(seen.size()), scorable) << "every document with a token past the router's is scored";
  EXPECT_EQ(scores.at("tokens").get<int64_t>(), tokens);
  EXPECT_NEAR(scores.at("val_loss").get<double>(), sums[0] / static_cast<double>(tokens), 1e-9);
  for (const auto& p : scores.at("paths")) {
    const auto& [sum, count] = by_path[p.at("path").get<int64_t>()];
    EXPECT_EQ(p.at("tokens").get<int64_t>(), count);
    if (count > 0) EXPECT_NEAR(p.at("val_loss").get<double>(), sum / static_cast<double>(count), 1e-9);
  }
  const auto& comparisons = scores.at("comparisons");
  ASSERT_EQ(comparisons.size(), (baselines + 1) * baselines / 2) << "every pair of models";
  for (size_t b = 0; b < baselines; ++b) {
    const auto& dense = comparisons.at(b);  // DiPaCo's against each baseline come first
    EXPECT_EQ(dense.at("a"), "dipaco");
    EXPECT_NEAR(dense.at("difference").get<double>(), (sums[0] - sums[b + 1]) / static_cast<double>(tokens), 1e-9);
    EXPECT_LE(dense.at("low").get<double>(), dense.at("difference").get<double>());
    EXPECT_GE(dense.at("high").get<double>(), dense.at("difference").get<double>());
    EXPECT_LT(dense.at("low").get<double>(), dense.at("high").get<double>()) << "two models that differ somewhere";
  }
}

// `loco launch`: routes, prepares, runs two workers to the end and scores every path on the
// validation documents routed to it. Each path task loads only its own path's modules.
TEST_F(DipacoRunTest, LaunchTrainsEveryPathAsTasksAndScoresThem) {
  // A long lease: under a loaded machine a 2 s one can run out between renewals, and the task is
  // then (correctly) issued again, which this test counts as not happening.
  auto launch = run_command(command("launch", "launched", {"dipaco.lease_s=60"}), log("launched"));
  ASSERT_EQ(launch.status, 0) << launch.output;
  EXPECT_NE(launch.output.find("| path | validation documents | tokens scored | val_loss |"), std::string::npos) << launch.output;
  EXPECT_NE(launch.output.find("0 task(s) issued again"), std::string::npos) << launch.output;
  const auto c = config("launched");
  expect_same_modules(final_modules(c), reference());

  const auto eval = nlohmann::json::parse(read_file(dir_->path() / "launched" / "dipaco-eval.json", "test"));
  EXPECT_TRUE(std::isfinite(eval["val_loss"].get<double>()));
  EXPECT_EQ(eval["paths"].size(), 4u);
  EXPECT_LT(eval["val_loss"].get<double>(), std::log(320.0));  // it learned: below a uniform guess

  RunConfig resolved = c;
  resolved.model.vocab_size = 320;
  const model::PathPlan plan(resolved.model, path_options(resolved));
  const auto tasks = path_tasks("launched");
  EXPECT_EQ(tasks.size(), 16u);  // 4 paths x 4 phases, none twice
  std::set<std::pair<int64_t, int64_t>> seen;
  for (const auto& t : tasks) {
    const int64_t path = t["path"];
    seen.emplace(path, t["phase"].get<int64_t>());
    std::set<std::string> loaded, expected;
    for (const auto& [name, bytes] : t["module_bytes_read"].items()) loaded.insert(name);
    for (auto index : plan.modules_of(path)) expected.insert(plan.module(index).name);
    EXPECT_EQ(loaded, expected) << "path " << path << " loaded modules that are not on it";
  }
  EXPECT_EQ(seen.size(), 16u);

  // `loco eval --config`: the same scores again, next to a dense baseline's on the same windows.
  auto dense = command("train", "dense", {"dipaco.levels=", "cluster.workers=1"});
  auto trained = run_command(dense, log("dense"));
  ASSERT_EQ(trained.status, 0) << trained.output;
  auto eval_args = command("eval", "launched");
  const auto scores_file = dir_->path() / "eval-against-dense.json";
  eval_args.insert(eval_args.end(), {"--against", (dir_->path() / "dense").string(), "--json", scores_file.string()});
  auto scored = run_command(eval_args, log("eval"));
  ASSERT_EQ(scored.status, 0) << scored.output;
  EXPECT_NE(scored.output.find(fmt::format("**{:.4f}**", eval["val_loss"].get<double>())), std::string::npos) << scored.output;
  EXPECT_NE(scored.output.find((dir_->path() / "dense").string() + " |"), std::string::npos) << scored.output;
  expect_every_document_scored_whole(c, nlohmann::json::parse(read_file(scores_file, "test")), 1);

  // The same run read with another plan: its router is refused, named, and nothing is written.
  auto misread = run_command(command("eval", "launched", {"dipaco.levels=2:2"}), log("eval-other-plan"));
  EXPECT_EQ(misread.status, 1) << misread.output;
  EXPECT_NE(misread.output.find("routes for another plan"), std::string::npos) << misread.output;
  EXPECT_EQ(nlohmann::json::parse(read_file(dir_->path() / "launched" / "dipaco-eval.json", "test")), eval);
  // ... and with another model's features (the routing read the random initialization's).
  auto other_features = run_command(command("eval", "launched", {"train.init_from=" + (dir_->path() / "dense").string()}),
                                    log("eval-other-features"));
  EXPECT_EQ(other_features.status, 1) << other_features.output;
  EXPECT_NE(other_features.output.find("routes by the features of the random initialization of seed 1234, but this config's "
                                       "are the model in " + fs::weakly_canonical(dir_->path() / "dense").string()),
            std::string::npos) << other_features.output;

  // `loco report`: the run's row, and what the router learned.
  auto report = run_command({testing_util::loco_binary(), "report", (dir_->path() / "launched").string()}, log("report"));
  ASSERT_EQ(report.status, 0) << report.output;
  // Its workers are those that did tasks: on a loaded machine one of the two may have done them all.
  const auto row = report.output.find("| launched | dipaco 1:2,1:2 | ");
  ASSERT_NE(row, std::string::npos) << report.output;
  const char workers = report.output[row + std::string_view("| launched | dipaco 1:2,1:2 | ").size()];
  EXPECT_TRUE(workers == '1' || workers == '2') << report.output;
  EXPECT_NE(report.output.find(fmt::format("{:.4f}", eval["val_loss"].get<double>())), std::string::npos) << report.output;
  EXPECT_NE(report.output.find("DiPaCo's paths against the corpus's labels"), std::string::npos) << report.output;

  // `loco generate --config`: one path, chosen by the router, generates.
  auto generate = command("generate", "launched");
  generate.insert(generate.end(), {"--prompt", "The", "--max-new-tokens", "8"});
  auto generated = run_command(generate, log("generate"));
  ASSERT_EQ(generated.status, 0) << generated.output;
  EXPECT_NE(generated.output.find("the router sends the prompt to path"), std::string::npos) << generated.output;
  // Re-routing every 3 tokens: the same first path, more text, and no error whichever paths it takes.
  generate.insert(generate.end(), {"--reroute-every", "3"});
  auto rerouted = run_command(generate, log("generate-rerouted"));
  ASSERT_EQ(rerouted.status, 0) << rerouted.output;
  const auto first_path = generated.output.substr(generated.output.find("to path"), 10);
  EXPECT_NE(rerouted.output.find(first_path), std::string::npos) << rerouted.output;
}

// Discriminative re-routing before phase 2: the held-out router documents train no path, every path
// scores them, a linear router re-shards the training documents, and the later phases train on
// the new shards; evaluation routes with the new router.
TEST_F(DipacoRunTest, ReroutingReshardsTheTrainingDocuments) {
  auto launch = run_command(command("launch", "rerouted", {"dipaco.reroute_phase=2", "dipaco.router_fraction=0.25"}),
                            log("rerouted"));
  ASSERT_EQ(launch.status, 0) << launch.output;
  EXPECT_NE(launch.output.find("re-routed before phase 3"), std::string::npos) << launch.output;
  const auto run = dir_->path() / "rerouted";
  const auto first = nlohmann::json::parse(read_file(run / "routing" / "paths.json", "test"));
  const auto second = nlohmann::json::parse(read_file(run / "routing" / "phase2" / "paths.json", "test"));
  const auto held = first["held_out"].get<std::vector<int64_t>>();
  ASSERT_FALSE(held.empty());
  std::set<int64_t> trained_before, trained_after;
  for (const auto& p : first["paths"]) for (auto d : p["documents"].get<std::vector<int64_t>>()) trained_before.insert(d);
  for (const auto& p : second["paths"]) {
    const auto docs = p["documents"].get<std::vector<int64_t>>();
    EXPECT_FALSE(docs.empty()) << "re-routing left path " << p["path"] << " empty";
    trained_after.insert(docs.begin(), docs.end());
  }
  EXPECT_EQ(trained_before, trained_after) << "re-routing must place every training document, and only those";
  for (auto d : held) EXPECT_EQ(trained_before.count(d), 0u) << "held-out document " << d << " was trained on";
  EXPECT_EQ(second["router_labels"].size(), second["router_documents"].size());
  // Each held-out document is labelled by the path whose loss on it is lowest.
  ASSERT_EQ(second["router_losses"].size(), second["router_labels"].size());
  for (size_t i = 0; i < second["router_labels"].size(); ++i) {
    const auto losses = second["router_losses"][i].get<std::vector<double>>();
    ASSERT_EQ(losses.size(), 4u);
    const auto best = std::min_element(losses.begin(), losses.end()) - losses.begin();
    EXPECT_EQ(second["router_labels"][i].get<int64_t>(), best) << "router document " << second["router_documents"][i];
  }
  EXPECT_EQ(second["router_documents"].size(), held.size()) << "every held-out document was long enough to score";

  std::set<std::pair<int64_t, int64_t>> seen;
  for (const auto& t : path_tasks("rerouted")) seen.emplace(t["path"].get<int64_t>(), t["phase"].get<int64_t>());
  EXPECT_EQ(seen.size(), 16u);
  const auto eval = nlohmann::json::parse(read_file(run / "dipaco-eval.json", "test"));
  EXPECT_TRUE(std::isfinite(eval["val_loss"].get<double>()));

  // A run routed without held-out documents cannot re-route later.
  auto route = run_command(command("route", "routed-plainly"), log("routed-plainly"));
  ASSERT_EQ(route.status, 0) << route.output;
  testing_util::expect_error<DataError>([&] { prepare_dipaco_run(config("routed-plainly", {"dipaco.reroute_phase=2"}), stderr); },
                                        "without held-out router documents");
}

TEST_F(DipacoRunTest, AKilledWorkersTaskIsIssuedAgainAndNothingIsLost) { kill_a_worker_mid_task("killed", {}); }

TEST_F(DipacoRunTest, AKilledWorkersTaskIsIssuedAgainOnPostgres) {
  testing_util::PostgresServer server;
  ASSERT_TRUE(server.ok()) << "the throwaway PostgreSQL server did not start";
  kill_a_worker_mid_task("killed-pg", {"dipaco.database=" + server.fresh_database()});
}

// A straggler with a phase deadline: worker A freezes in a path task (its lease is long, so it is not
// given away); the modules it shares step without it at the deadline, its path goes on from the
// new versions with B, and when A thaws its late work is refused and it carries on.
TEST_F(DipacoRunTest, APhaseDeadlineLeavesAStragglerBehind) {
  const std::vector<std::string> policy = {"dipaco.phase_deadline_s=1", "dipaco.lease_s=600"};
  const auto c = config("straggler", policy);
  prepare_dipaco_run(c, stderr);
  auto a_args = command("path-worker", "straggler", policy);
  a_args.insert(a_args.end(), {"--name", "A"});
  auto b_args = command("path-worker", "straggler", policy);
  b_args.insert(b_args.end(), {"--name", "B"});
  Child a(a_args, log("straggler-a"));  // alone first: B could finish the tiny run before A started up
  std::optional<TaskKey> frozen;
  auto registry = open_run_registry(c);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!frozen && std::chrono::steady_clock::now() < deadline) {
    freeze(a);
    for (const auto& t : registry->tasks()) {
      if (t.key.scope == TaskScope::kPath && t.state == TaskState::kLeased && t.holder == "A" && t.key.phase < 3) frozen = t.key;
    }
    if (!frozen) a.signal(SIGCONT), std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(frozen.has_value()) << "worker A never held a path task";
  Child b(b_args, log("straggler-b"));
  ASSERT_EQ(b.wait(std::chrono::seconds(240)), 0) << read_file(log("straggler-b"), "test");
  EXPECT_TRUE(registry->finished()) << "the run waited for the frozen worker";
  a.signal(SIGCONT);
  ASSERT_EQ(a.wait(std::chrono::seconds(60)), 0) << read_file(log("straggler-a"), "test");
  for (const auto& t : registry->tasks()) {
    if (t.key == *frozen) EXPECT_EQ(t.state, TaskState::kCancelled) << describe(t.key);
  }
  EXPECT_NE(read_file(log("straggler-a"), "test").find("dropped " + describe(*frozen)), std::string::npos)
      << read_file(log("straggler-a"), "test");
  // The modules of the frozen path's phase stepped with the other paths' reports only.
  EXPECT_EQ(registry->reports("embed", frozen->phase).size(), 3u);
}

// A DiPaCo worker is a function of the runtime, not only a process: one path task run in this
// test's process records its reports (one per module of its path, weighted by the path's tokens)
// and its typed event; two more workers in this process, one after the other, finish the run on
// the same modules, bit for bit, as the `loco path-worker` process did.
TEST_F(DipacoRunTest, TasksRunInProcessAsInAWorkerProcess) {
  const auto c = config("in-process");
  prepare_dipaco_run(c, stderr);
  DipacoWorkerOptions one;
  one.name = "first";
  one.max_tasks = 1;
  const auto summary = run_dipaco_worker(c, one);
  EXPECT_EQ(summary.path_tasks, 1);
  EXPECT_EQ(summary.step_tasks, 0);
  auto registry = open_run_registry(c);
  const auto layout = registry->layout();
  ASSERT_TRUE(layout.has_value());
  std::optional<TaskRow> done;
  for (const auto& t : registry->tasks()) {
    if (t.state == TaskState::kDone) done = t;
  }
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->holder, "first");
  ASSERT_EQ(done->key.scope, TaskScope::kPath);
  const auto& modules = layout->path_modules.at(static_cast<size_t>(done->key.path));
  for (const auto& m : modules) {
    const auto reports = registry->reports(m, 0);
    ASSERT_EQ(reports.size(), 1u) << m;
    EXPECT_EQ(reports[0].path, done->key.path);
    EXPECT_GT(reports[0].weight, 0);
    EXPECT_TRUE(fs::exists(dir_->path() / "in-process" / reports[0].file)) << reports[0].file;
  }
  const auto events = path_tasks("in-process");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["worker"], "first");
  EXPECT_EQ(events[0]["steps"], c.sync.inner_steps);
  DipacoWorkerOptions rest;
  rest.name = "second";
  run_dipaco_worker(c, rest);
  rest.name = "third";  // nothing left: it returns at once
  EXPECT_EQ(run_dipaco_worker(c, rest).path_tasks, 0);
  expect_same_modules(final_modules(c), reference());
  // A worker keeps the last path it trained: it takes that path's next phase first and continues
  // from the inner state in its memory, reading only the modules (and, above, still ending on the
  // reference's modules). Alone, it keeps one of the 4 paths per phase; the others' states it reads.
  int kept = 0, read_back = 0;
  for (const auto& event : path_tasks("in-process")) {
    if (event["worker"] != "second" || event["phase"] == 0) continue;
    int64_t modules = 0;
    for (const auto& [name, bytes] : event["module_bytes_read"].items()) modules += bytes.get<int64_t>();
    ++(event["bytes_read"].get<int64_t>() == modules ? kept : read_back);
  }
  EXPECT_EQ(kept, 3) << "one path in each of phases 1, 2 and 3";
  EXPECT_EQ(read_back, 9);
}

// The Llama architecture's options train as paths too: grouped-query attention, q/k/v biases, an
// untied head (which travels in the shared embed module with the token embedding), SwiGLU.
TEST_F(DipacoRunTest, TheLlamaArchitectureTrainsAsPaths) {
  const std::vector<std::string> llama = {"model.mlp=swiglu", "model.mlp_hidden=48", "model.kv_heads=1",
                                          "model.attention_bias=true", "model.tie_embeddings=false"};
  const auto c = config("llama", llama);
  prepare_dipaco_run(c, stderr);
  DipacoWorkerOptions only;
  only.name = "only";
  const auto summary = run_dipaco_worker(c, only);
  EXPECT_EQ(summary.path_tasks, 4 * 4) << "4 paths, 4 phases";
  const auto modules = final_modules(c);
  ASSERT_EQ(modules.size(), 5u);
  bool head = false;
  for (const auto& [name, tensors] : modules) {
    for (const auto& [tensor_name, tensor] : tensors) {
      EXPECT_TRUE(torch::isfinite(tensor).all().item<bool>()) << name << " " << tensor_name;
      if (tensor_name == "lm_head.weight") head = name == "embed";
    }
  }
  EXPECT_TRUE(head) << "the untied head is in the embed module";
  std::map<int64_t, double> loss_by_phase;
  for (const auto& event : path_tasks("llama")) loss_by_phase[event["phase"].get<int64_t>()] += event["loss"].get<double>() / 4;
  ASSERT_EQ(loss_by_phase.size(), 4u);
  EXPECT_LT(loss_by_phase.rbegin()->second, loss_by_phase.begin()->second) << "the paths learn";

  // One path, exported as a Hugging Face folder (loco export --config --path), computes what the
  // path computes at evaluation, and carries the dataset's tokenizer.
  auto exported = command("export", "llama", llama);
  for (const char* more : {"--path", "2", "--hf"}) exported.push_back(more);
  exported.push_back((dir_->path() / "llama-path-2").string());
  const auto written = run_command(exported, log("llama-export"));
  ASSERT_EQ(written.status, 0) << written.output;
  EXPECT_TRUE(fs::exists(dir_->path() / "llama-path-2" / "tokenizer.model"));
  const auto options = read_hugging_face_config(dir_->path() / "llama-path-2", c.model);
  model::Transformer back(options, 1);
  load_model_weights(back, load_hugging_face_parameters(dir_->path() / "llama-path-2", options), "export");
  {
    PathInference inference(c);
    const auto tokens = torch::randint(0, options.vocab_size, {2, 16}, torch::kInt64);
    torch::NoGradGuard no_grad;
    back->eval();
    EXPECT_TRUE(torch::equal(back->forward(tokens), inference.model(2, torch::kCPU)->forward(tokens)));
  }
  exported.back() = (dir_->path() / "llama-path-9").string();
  exported[exported.size() - 3] = "9";
  const auto refused = run_command(exported, log("llama-export-9"));
  EXPECT_EQ(refused.status, 1);
  EXPECT_NE(refused.output.find("--path 9: the DiPaCo run"), std::string::npos) << refused.output;

  // DiPaCo forked from a Hugging Face folder (the exported path): routed by its features, every
  // path starts from it, so the first phase's losses start where the trained path left off. The
  // folder's positions (made 4,096 here, beyond the context) are what its paths' exports say.
  const auto folder_config = dir_->path() / "llama-path-2" / "config.json";
  auto described = nlohmann::json::parse(read_file(folder_config, "test"));
  EXPECT_EQ(described["max_position_embeddings"], c.model.context) << "a run from scratch: its context";
  described["max_position_embeddings"] = 4096;
  std::ofstream(folder_config) << described.dump(2);
  auto from_folder = llama;
  from_folder.push_back("train.init_from=" + (dir_->path() / "llama-path-2").string());
  const auto forked = config("llama-forked", from_folder);
  prepare_dipaco_run(forked, stderr);
  run_dipaco_worker(forked, only);
  double forked_first = 0;
  for (const auto& event : path_tasks("llama-forked")) {
    if (event["phase"] == 0) forked_first += event["loss"].get<double>() / 4;
  }
  EXPECT_LT(forked_first, loss_by_phase.begin()->second - 0.2);
  auto forked_export = command("export", "llama-forked", from_folder);
  for (const char* more : {"--path", "1", "--hf"}) forked_export.push_back(more);
  forked_export.push_back((dir_->path() / "llama-forked-path-1").string());
  const auto forked_written = run_command(forked_export, log("llama-forked-export"));
  ASSERT_EQ(forked_written.status, 0) << forked_written.output;
  EXPECT_EQ(nlohmann::json::parse(read_file(dir_->path() / "llama-forked-path-1" / "config.json", "test"))["max_position_embeddings"],
            4096);
}

// Early stopping (dipaco.keep_every = 2, dipaco.early_stopping): the modules keep versions 0, 2
// and 4 (the last), and the one before the last; scoring picks each path's version by its loss on half of its
// validation documents and scores the other half. With L1.M1's last version spoiled (noise added),
// the paths through it (2 and 3) pick an earlier version and the others the last; `loco generate`'s
// model is the picked version's.
TEST_F(DipacoRunTest, EarlyStoppingScoresEachPathAtTheVersionItsHeldOutLossPicks) {
  // Twice the documents, half of them for validation: each path gets enough to pick and to score.
  const auto data = dir_->path() / "data-early";
  testing_util::write_tiny_corpus(dir_->path() / "corpus-early", 80);
  auto prepared = run_command({testing_util::loco_binary(), "prepare", "--corpus", (dir_->path() / "corpus-early").string(), "--out",
                               data.string(), "--vocab-size", "320", "--val-fraction", "0.5", "--cache",
                               (dir_->path() / "cache").string()}, log("prepare-early"));
  ASSERT_EQ(prepared.status, 0) << prepared.output;
  const std::vector<std::string> early = {"data.dir=" + data.string(), "dipaco.keep_every=2", "eval.windows=16"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), early.begin(), early.end());
    return config("early", more);
  };
  const auto c = with({"dipaco.early_stopping=true"});
  prepare_dipaco_run(c, stderr);
  DipacoWorkerOptions worker;
  worker.name = "only";
  run_dipaco_worker(c, worker);
  auto registry = open_run_registry(c);
  const auto layout = registry->layout();
  ASSERT_TRUE(layout.has_value());
  ASSERT_EQ(layout->phases, 4);
  // Kept: 0, 2 and 4; and 3, the version before the last, which no step came after to remove.
  for (const std::string module : {"embed", "L1.M0", "L1.M1", "L2.M0", "L2.M1"}) {
    for (int64_t v = 0; v <= 4; ++v) {
      EXPECT_EQ(fs::exists(module_file(c.run.dir, module, v)), v != 1) << module << " v" << v;
    }
  }
  auto spoiled = load_module(c.run.dir, "L1.M1", 4, layout->plan, kAnySize);
  torch::manual_seed(5);
  for (auto& [name, tensor] : spoiled.parameters) tensor = tensor + torch::randn_like(tensor) * 2.0;
  save_module(c.run.dir, spoiled);

  const auto scored = evaluate_dipaco(c);
  ASSERT_TRUE(scored.early_stopping);
  for (const auto& p : scored.paths) {
    ASSERT_EQ(p.picking.size(), 3u) << "path " << p.path << ": versions 0, 2 and 4 are its candidates";
    int64_t best = -1;
    for (const auto& [version, loss] : p.picking) {
      if (best < 0 || loss < p.picking.at(best)) best = version;
    }
    EXPECT_EQ(p.version, best) << "path " << p.path;
    EXPECT_EQ(p.version == 4, p.path < 2) << "path " << p.path << " picked v" << p.version;
    EXPECT_LT(p.picking.at(best), p.picking.at(0)) << "trained versions model the path's documents better than the start";
  }
  // The scored documents are those that did not pick: together they are the path's routed ones.
  const auto plain = evaluate_dipaco(with({}));
  for (size_t p = 0; p < plain.paths.size(); ++p) {
    EXPECT_LT(scored.paths[p].documents, plain.paths[p].documents) << "path " << p;
    EXPECT_EQ(plain.paths[p].version, 4);
  }
  EXPECT_NE(describe(scored).find("| path | version |"), std::string::npos);

  // What scoring picked is what inference runs (RUN/dipaco-eval.json, as `loco launch` writes it).
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& p : scored.paths) rows.push_back({{"path", p.path}, {"version", p.version}});
  write_file_atomic(fs::path(c.run.dir) / "dipaco-eval.json", nlohmann::json{{"paths", rows}}.dump(), "test");
  const auto run = DipacoRun::open(c);
  EXPECT_EQ(scored_versions(run, *registry, 2).at("L1.M1"), scored.paths[2].version);
  EXPECT_EQ(scored_versions(run, *registry, 0).at("L1.M0"), 4);
  PathInference inference(c);
  const auto& model = inference.model(2, torch::kCPU);
  const auto picked = load_module(c.run.dir, "L1.M1", scored.paths[2].version, layout->plan, kAnySize, /*with_outer_state=*/false);
  const auto in_model = model::module_parameters(model, run.plan().module(run.plan().find("L1.M1")));
  ASSERT_FALSE(in_model.names.empty());
  for (const auto& [name, tensor] : picked.parameters) {
    if (name == in_model.names.front()) EXPECT_TRUE(torch::equal(in_model.parameters.front(), tensor)) << name;
  }
  testing_util::expect_error<ConfigError>([&] { with({"dipaco.keep_every=0", "dipaco.early_stopping=true"}); },
                                          "set dipaco.keep_every");
}

// Ctrl-C at `loco launch`: the workers give their tasks back and exit; --resume finishes the run on
// the same modules as the uninterrupted one.
TEST_F(DipacoRunTest, AStoppedLaunchResumesExactly) {
  const auto c = config("stopped");
  {
    Child launch(command("launch", "stopped", {"cluster.workers=1"}), log("stopped-1"));
    wait_for_done(c, 3);
    launch.signal(SIGINT);
    EXPECT_EQ(launch.wait(std::chrono::seconds(60)), 130);
  }
  const auto first = read_file(log("stopped-1"), "test");
  const auto hint = testing_util::printed_command(first, "continue with: ");
  EXPECT_EQ(hint, (std::vector<std::string>{testing_util::loco_binary(), "launch", "--resume", "--run.dir=" + c.run.dir}))
      << first;
  EXPECT_FALSE(open_run_registry(c)->finished());
  for (const auto& t : open_run_registry(c)->tasks()) EXPECT_NE(t.state, TaskState::kLeased) << describe(t.key) << " was not given back";

  auto again = run_command(command("launch", "stopped", {"cluster.workers=1"}), log("stopped-again"));
  EXPECT_EQ(again.status, 1) << again.output;  // a fresh launch into the used folder refuses
  EXPECT_NE(again.output.find("pass --resume"), std::string::npos) << again.output;

  auto resumed = run_command(hint, log("stopped-2"));  // as printed: the run folder holds its config
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  expect_same_modules(final_modules(c), reference());
}

// The registry in PostgreSQL: two workers, the database server crashed and restarted mid-run; the
// workers wait for it, continue, and the run ends on the same modules.
TEST_F(DipacoRunTest, PostgresRegistrySurvivesADatabaseCrash) {
  testing_util::PostgresServer server;
  ASSERT_TRUE(server.ok()) << "the throwaway PostgreSQL server did not start";
  const std::vector<std::string> database = {"dipaco.database=" + server.fresh_database()};
  const auto c = config("postgres", database);
  prepare_dipaco_run(c, stderr);
  EXPECT_FALSE(fs::exists(dir_->path() / "postgres" / "dipaco.sqlite"));
  Child a(command("path-worker", "postgres", database), log("postgres-a"));
  Child b(command("path-worker", "postgres", database), log("postgres-b"));
  wait_for_done(c, 3);
  ASSERT_TRUE(server.crash_and_restart());
  ASSERT_EQ(a.wait(std::chrono::seconds(240)), 0) << read_file(log("postgres-a"), "test");
  ASSERT_EQ(b.wait(std::chrono::seconds(240)), 0) << read_file(log("postgres-b"), "test");
  const auto logs = read_file(log("postgres-a"), "test") + read_file(log("postgres-b"), "test");
  EXPECT_NE(logs.find("the registry is unavailable"), std::string::npos) << logs;
  EXPECT_EQ(logs.find(testing_util::PostgresServer::kPassword), std::string::npos) << "the password leaked: " << logs;
  expect_same_modules(final_modules(c), reference());
}

}  // namespace
}  // namespace loco::runtime
