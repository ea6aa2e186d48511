#include "loco/runtime/launch/dipaco_launch.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "loco/core/files.h"
#include "loco/core/run_folder.h"
#include "loco/metrics/events.h"
#include "loco/data/tokenizer.h"
#include "loco/model/precision.h"
#include "loco/model/sampling.h"
#include "loco/runtime/config/secrets.h"
#include "loco/runtime/dipaco/inference.h"
#include "loco/runtime/launch/islands.h"
#include "loco/runtime/status/status_routes.h"
#include "loco/runtime/launch/supervisor.h"
#include "loco/runtime/worker/worker.h"

namespace loco::runtime {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

void check_dipaco_run_dir(const RunConfig& config, bool resume) {
  const fs::path run(config.run.dir);
  if (resume) {
    if (!open_run_registry(config)->layout()) {
      throw ConfigError("launch", fmt::format("--resume: {} holds no started DiPaCo run (its registry has no layout)", run.string()));
    }
    return;
  }
  RunFolder(run).check_new_run("launch");
  if (!config.dipaco.database.empty() && open_run_registry(config)->layout()) {
    throw ConfigError("launch", "dipaco.database already holds a started run; pass --resume to continue it, or give an empty "
                                "database (nothing was overwritten)");
  }
}

// The status page of a DiPaCo launch (docs/status-page.md), which has no coordinator: the worker
// processes the launcher started and saw exit, the events every worker writes to RUN/metrics.jsonl
// (read as it grows, metrics/events.h; a worker started by hand shows as well), and the registry's
// task queue and module versions, refreshed every second.
class DipacoStatus {
 public:
  DipacoStatus(const RunConfig& config, const LaunchOptions& options)
      : config_(config), tail_(RunFolder(config.run.dir).metrics()),
        server_("127.0.0.1", options.port, "", [this] { return run_state(); }, [this] { return text(); }) {
    server_.start();
  }
  std::string url() const { return server_.url(); }
  void started(int64_t rank, pid_t pid) {
    server_.dashboard().process_started(rank, host_name(), pid, wall_now());
    running_[pid] = rank;
  }
  void exited(pid_t pid, int code, bool failed) {
    server_.dashboard().process_exited(host_name(), pid, code, failed, wall_now());
    running_.erase(pid);
  }
  void stopping(const std::string& why) {
    std::lock_guard lock(mutex_);
    stopping_ = why;
  }
  // At most once a second (or now, when `force`): the registry's snapshot, then every live worker's report.
  void refresh(bool force = false) {
    if (!force && Clock::now() < next_refresh_) return;
    next_refresh_ = Clock::now() + std::chrono::seconds(1);
    std::map<std::string, std::string> activity;  // by worker name
    try {
      read_registry(activity);
    } catch (const std::exception&) {
      // The registry is busy or away for a moment: the page keeps its last snapshot.
    }
    // Every worker that wrote to the run's metrics.jsonl shows, those started by hand included.
    std::map<std::string, nlohmann::json> events;
    for (const auto& e : tail_.read_new()) {
      const auto name = metrics::worker_of(e.event).name;
      if (name.empty()) continue;
      auto json = metrics::to_json(e.event);
      json["time"] = e.time;
      events[name].push_back(std::move(json));
      if (const auto* task = std::get_if<metrics::PathTaskEvent>(&e.event)) steps_[name] += task->steps;
      if (std::holds_alternative<metrics::WorkerSummaryEvent>(e.event)) ended_.insert(name);
    }
    std::map<std::string, int64_t> ranks;  // the launcher's workers by name, then the others
    for (const auto& [pid, rank] : running_) ranks[fmt::format("{}:{}", host_name(), pid)] = rank;
    for (const auto& [name, list] : events) ranks.try_emplace(name, -1);
    for (const auto& [name, doing] : activity) ranks.try_emplace(name, -1);  // holding a task now
    for (const auto& [name, rank] : ranks) {
      const auto colon = name.rfind(':');
      int64_t pid = 0;
      if (colon != std::string::npos) pid = std::strtoll(name.c_str() + colon + 1, nullptr, 10);
      const auto doing = activity.find(name);
      const auto reported = events.find(name);
      nlohmann::json body = {{"rank", rank >= 0 ? rank : others_.try_emplace(name, config_.cluster.workers +
                                                                            static_cast<int64_t>(others_.size())).first->second},
                             {"name", name}, {"host", colon != std::string::npos ? name.substr(0, colon) : name}, {"pid", pid},
                             {"activity", ended_.count(name) ? "finished" : doing != activity.end() ? doing->second : "waiting"},
                             {"step", steps_[name]},
                             {"events", reported != events.end() ? std::move(reported->second) : nlohmann::json::array()}};
      try {
        server_.dashboard().report(body, wall_now());
      } catch (const std::exception&) {
        // A report the dashboard refuses (a worker's name too long) is left off the page.
      }
    }
  }

 private:
  nlohmann::json run_state() const {
    std::lock_guard lock(mutex_);
    nlohmann::json state = {{"phase", finished_ ? "finished" : "running"}, {"stopping", !stopping_.empty()},
                            {"reason", stopping_}, {"epoch", 0}, {"workers", config_.cluster.workers}, {"run_id", ""},
                            {"run_dir", config_.run.dir}, {"algorithm", "dipaco " + config_.dipaco.levels},
                            {"steps", nullptr}, {"members", nlohmann::json::array()}};  // (a worker steps through many paths)
    if (!dipaco_.is_null()) state["dipaco"] = dipaco_;
    return state;
  }

  std::string text() const {
    const auto state = run_state();
    return fmt::format("loco DiPaCo launch, run {}\n{}\n", config_.run.dir, state.contains("dipaco") ? state["dipaco"].dump() : "");
  }

  // The task queue (counts, and who holds what) and each module's latest version; who is doing what.
  void read_registry(std::map<std::string, std::string>& activity) {
    if (!registry_) registry_ = open_run_registry(config_);
    std::map<std::string, int64_t> counts;
    for (auto state : {TaskState::kOpen, TaskState::kWaiting, TaskState::kLeased, TaskState::kDone, TaskState::kCancelled}) {
      counts[std::string(to_string(state))] = 0;
    }
    int64_t reissued = 0;
    nlohmann::json leased = nlohmann::json::array();
    for (const auto& task : registry_->tasks()) {
      ++counts[std::string(to_string(task.state))];
      reissued += task.leases > 1;
      if (task.state != TaskState::kLeased) continue;
      leased.push_back({{"task", describe(task.key)}, {"holder", task.holder}});
      activity[task.holder] = task.key.scope == TaskScope::kModuleStep ? "syncing" : "training";
    }
    nlohmann::json modules = nlohmann::json::array();
    if (auto layout = registry_->layout()) {
      std::set<std::string> names;
      for (const auto& path : layout->path_modules) names.insert(path.begin(), path.end());
      for (const auto& name : names) {
        const auto version = registry_->latest_version(name);
        modules.push_back({{"module", name}, {"version", version ? nlohmann::json(*version) : nlohmann::json()},
                           {"of", layout->phases}});
      }
    }
    const bool finished = registry_->finished();
    std::lock_guard lock(mutex_);
    dipaco_ = {{"tasks", counts}, {"reissued", reissued}, {"leased", leased}, {"modules", modules}};
    finished_ = finished;
  }

  const RunConfig& config_;
  metrics::EventTail tail_;
  StatusServer server_;
  std::unique_ptr<Registry> registry_;  // the launcher's own connection, opened at the first refresh
  Clock::time_point next_refresh_ = Clock::now();
  std::map<std::string, int64_t> steps_;   // by worker name: the inner steps of its path tasks
  std::set<std::string> ended_;            // workers whose summary came
  std::map<std::string, int64_t> others_;  // workers this launcher did not start: the rank the page shows them as
  std::map<pid_t, int64_t> running_;    // the launcher's worker processes now: pid -> rank
  mutable std::mutex mutex_;            // the snapshot below, read by the server's threads
  nlohmann::json dipaco_;
  bool finished_ = false;
  std::string stopping_;
};

// Starts cluster.workers `loco path-worker` processes and relays their lines until every one has
// exited: Ctrl-C stops them (again: kills them), one that dies is started again while --restarts
// allow, and one that does not stop within the grace is killed. Returns each process's exit
// status, in start order; `interrupted` whether a Ctrl-C came.
std::vector<int> run_workers(const RunConfig& config, const LaunchOptions& options, DipacoStatus& status, bool& interrupted) {
  const int64_t m = config.cluster.workers;
  std::vector<std::string> argv = {options.executable.string(), "path-worker", "--config", options.config_file.string()};
  auto overrides = options.overrides;
  Placement placement;
  placement.environment = take_secret_overrides(overrides);  // `ps` shows argv to every local user
  for (const auto& o : overrides) argv.push_back("--" + o);
  // A worker asked to stop gives its task back at its next step: a lease's time is ample.
  Supervisor workers(m, std::chrono::duration_cast<Supervisor::Clock::duration>(
                            std::chrono::duration<double>(std::max(config.dipaco.lease_s, 30.0))));
  for (int64_t r = 0; r < m; ++r) status.started(r, workers.start(r, argv, placement));
  fmt::print(options.out, "launch: {} workers lease DiPaCo's tasks from {}; a worker that dies loses its task to another "
                          "within dipaco.lease_s = {:g} s\n", m,
             config.dipaco.database.empty() ? RunFolder(config.run.dir).dipaco_registry().string() : "the PostgreSQL registry",
             config.dipaco.lease_s);
  std::fflush(options.out);
  auto print = [&](const ChildLine& line) { fmt::print(options.out, "[w{}] {}\n", line.rank, line.text); };

  int64_t restarts_left = options.restarts;
  while (workers.alive() > 0) {
    status.refresh();
    for (const auto& line : workers.read(std::chrono::milliseconds(200))) print(line);
    std::fflush(options.out);
    const int count = options.interrupts != nullptr ? options.interrupts->load() : 0;
    if (workers.interrupt(count)) {
      status.stopping("interrupted (Ctrl-C)");
      fmt::print(options.out, "{}\n", count == 1 ? "launch: stopping: each worker gives its task back (Ctrl-C again to kill "
                                                   "them)" : "launch: killing the workers");
    }
    for (const auto& exit : workers.reap()) {
      const bool clean = exit.code == 0 || workers.interrupts() > 0;
      status.exited(exit.pid, exit.code, /*failed=*/!clean);
      if (clean) continue;
      fmt::print(options.out, "launch: worker {} exited with {}; its task goes to another worker when its lease runs "
                              "out{}\n", exit.rank, describe_exit(exit.code), restarts_left > 0 ? "; starting it again" : "");
      if (restarts_left > 0) {
        --restarts_left;
        status.started(exit.rank, workers.start(exit.rank, argv, placement));
      }
    }
    if (workers.kill_when_overdue()) fmt::print(options.out, "launch: workers did not stop in time; killing them\n");
  }
  status.refresh(/*force=*/true);  // the registry as the run ends: the page shows it while the paths are scored
  for (const auto& line : workers.drain()) print(line);  // what they wrote last (an error, often)
  std::fflush(options.out);
  interrupted = workers.interrupts() > 0;
  std::vector<int> exit_codes;
  for (const auto& code : workers.exit_codes()) exit_codes.push_back(code.value_or(-1));
  return exit_codes;
}

}  // namespace

DipacoLaunchResult launch_dipaco(const RunConfig& config, const LaunchOptions& options) {
  const auto started = Clock::now();
  if (LinkPlan::from_config(config.link, options.links, config.cluster.workers).enabled) {
    throw ConfigError("launch", "emulated links (--link, [link]) are not supported for DiPaCo runs: its workers meet in "
                                "a database and share modules through the run folder, not over a network the islands "
                                "could shape; leave them out");
  }
  check_dipaco_run_dir(config, options.resume);
  // The page is served from the start: routing and preparing a run take a while.
  DipacoStatus status(config, options);
  fmt::print(options.out, "launch: status page: {}\n", status.url());
  std::fflush(options.out);
  prepare_dipaco_run(config, options.out);

  DipacoLaunchResult result;
  bool interrupted = false;
  result.exit_codes = run_workers(config, options, status, interrupted);
  auto registry = open_run_registry(config);
  for (const auto& task : registry->tasks()) result.reissued += task.leases > 1 ? 1 : 0;
  if (!registry->finished()) {
    int64_t left = 0;
    for (const auto& task : registry->tasks()) left += task.state != TaskState::kDone && task.state != TaskState::kCancelled;
    result.outcome = interrupted ? RunOutcome::kStopped : RunOutcome::kFailed;
    result.message = interrupted ? "interrupted (Ctrl-C)"
                                         : fmt::format("every worker exited before the run finished ({} task(s) not done)", left);
  } else {
    fmt::print(options.out, "launch: every module took its last outer step; scoring each path on its validation documents\n");
    result.evaluation = evaluate_dipaco(config);
    write_file_atomic(RunFolder(config.run.dir).dipaco_evaluation(), to_json(result.evaluation).dump(1) + "\n", "launch");
    // A sample from the one path the router picks for a prompt: inference runs a single path.
    const auto tokenizer = data::Dataset::open_tokenizer(config.data.dir);
    auto ids = tokenizer.encode_prompt(options.sample_prompt);
    PathInference inference(config);
    result.sample_path = inference.route(ids);
    model::SampleOptions sample;
    sample.max_new_tokens = 40;
    sample.temperature = 0.8;
    sample.top_k = 40;
    sample.seed = static_cast<uint64_t>(config.train.seed);
    sample.stop_token = tokenizer.eos_id();
    auto out = model::generate(inference.model(result.sample_path, model::resolve_device(config.train.device)), ids, sample);
    if (!out.empty() && out.back() == tokenizer.eos_id()) out.pop_back();
    ids.insert(ids.end(), out.begin(), out.end());
    result.sample = tokenizer.decode_text(ids);
  }
  result.wall_s = std::chrono::duration<double>(Clock::now() - started).count();
  return result;
}

}  // namespace loco::runtime
