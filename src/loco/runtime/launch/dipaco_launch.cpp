#include "loco/runtime/launch/dipaco_launch.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "loco/core/files.h"
#include "loco/data/tokenizer.h"
#include "loco/model/precision.h"
#include "loco/model/sampling.h"
#include "loco/runtime/launch/islands.h"
#include "loco/runtime/control/status_routes.h"
#include "loco/runtime/launch/processes.h"
#include "loco/runtime/worker/worker.h"

namespace loco::runtime {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

void check_run_dir(const RunConfig& config, bool resume) {
  const fs::path run(config.run.dir);
  std::error_code ec;
  if (resume) {
    if (!open_run_registry(config)->layout()) {
      throw ConfigError("launch", fmt::format("--resume: {} holds no started DiPaCo run (its registry has no layout)", run.string()));
    }
    return;
  }
  if (fs::exists(run, ec) && (!fs::is_directory(run, ec) || !fs::is_empty(run, ec))) {
    throw ConfigError("launch", fmt::format("run.dir {} already holds a run; pass --resume to continue it, or choose another "
                                            "--run.dir (nothing was overwritten)", run.string()));
  }
  if (!config.dipaco.database.empty() && open_run_registry(config)->layout()) {
    throw ConfigError("launch", "dipaco.database already holds a started run; pass --resume to continue it, or give an empty "
                                "database (nothing was overwritten)");
  }
}

// The status page of a DiPaCo launch (docs/status-page.md), which has no coordinator: the worker
// processes the launcher started and saw exit, what they write to RUN/metrics.jsonl (read as it
// grows: a path task is a training-loss point and its bytes written are its phase's traffic), and
// the registry's task queue and module versions, refreshed every second.
class DipacoStatus {
 public:
  DipacoStatus(const RunConfig& config, const LaunchOptions& options)
      : config_(config), metrics_path_(fs::path(config.run.dir) / "metrics.jsonl"),
        server_("127.0.0.1", options.port, "", [this] { return run_state(); }, [this] { return text(); }) {
    server_.start();
  }
  std::string url() const { return server_.url(); }
  void started(const WorkerProcess& w) { server_.dashboard().process_started(w.rank, host_name(), w.pid, wall_now()); }
  void exited(const WorkerProcess& w, bool failed) {
    server_.dashboard().process_exited(host_name(), w.pid, *w.exit_code, failed, wall_now());
  }
  void stopping(const std::string& why) {
    std::lock_guard lock(mutex_);
    stopping_ = why;
  }
  // At most once a second (or now, when `force`): the registry's snapshot, then every live worker's report.
  void refresh(const std::vector<WorkerProcess>& workers, bool force = false) {
    if (!force && Clock::now() < next_refresh_) return;
    next_refresh_ = Clock::now() + std::chrono::seconds(1);
    std::map<std::string, std::string> activity;  // by worker name
    try {
      read_registry(activity);
    } catch (const std::exception&) {
      // The registry is busy or away for a moment: the page keeps its last snapshot.
    }
    auto events = new_events();
    for (const auto& w : workers) {
      if (w.exit_code) continue;
      const std::string name = fmt::format("{}:{}", host_name(), w.pid);
      auto doing = activity.find(name);
      auto reported = events.find(name);
      nlohmann::json body = {{"rank", w.rank}, {"name", name}, {"host", host_name()}, {"pid", w.pid},
                             {"activity", doing != activity.end() ? doing->second : "waiting"}, {"step", totals_[name].first},
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
    std::map<std::string, int64_t> counts = {{"open", 0}, {"leased", 0}, {"waiting", 0}, {"done", 0}, {"cancelled", 0}};
    int64_t reissued = 0;
    nlohmann::json leased = nlohmann::json::array();
    for (const auto& task : registry_->tasks()) {
      ++counts[task.state];
      reissued += task.leases > 1;
      if (task.state != "leased") continue;
      leased.push_back({{"task", describe(task.key)}, {"holder", task.holder}});
      activity[task.holder] = task.key.kind == TaskKey::Kind::kStep ? "syncing" : "training";
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

  // The lines the workers appended to RUN/metrics.jsonl since the last call, by worker name, as the
  // dashboard's events: a path task is a training-loss point (steps and tokens summed over the
  // worker's tasks) and its phase's bytes; an outer step and a re-routing go on the timeline.
  std::map<std::string, nlohmann::json> new_events() {
    std::map<std::string, nlohmann::json> out;
    std::ifstream in(metrics_path_, std::ios::binary);
    if (!in) return out;
    in.seekg(static_cast<std::streamoff>(offset_));
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t end = chunk.rfind('\n');
    if (end == std::string::npos) return out;  // no whole line yet
    offset_ += end + 1;
    size_t start = 0;
    while (start <= end) {
      const size_t newline = chunk.find('\n', start);
      nlohmann::json e;
      try {
        e = nlohmann::json::parse(chunk.substr(start, newline - start));
      } catch (const nlohmann::json::exception&) {
      }
      start = newline + 1;
      if (!e.is_object() || !e.contains("worker") || !e["worker"].is_string()) continue;
      const auto name = e["worker"].get<std::string>();
      auto& list = out[name];
      if (list.is_null()) list = nlohmann::json::array();
      const std::string kind = e.value("event", "");
      const double time = e.value("time", wall_now());
      if (kind == "path_task") {
        auto& [steps, tokens] = totals_[name];
        steps += e.value("steps", int64_t{0});
        tokens += e.value("tokens", int64_t{0});
        const double compute = e.value("compute_s", 0.0);
        list.push_back({{"event", "train"}, {"time", time}, {"step", steps}, {"tokens", tokens}, {"loss", e.value("loss", NAN)},
                        {"tokens_per_s", compute > 0 ? e.value("tokens", 0.0) / compute : 0.0}});
        list.push_back({{"event", "sync"}, {"time", time}, {"round", e.value("phase", int64_t{0})},
                        {"bytes_sent", e.value("bytes_written", int64_t{0})}});
      } else if (kind == "step_task" || kind == "route_task") {
        list.push_back(e);
      } else if (kind == "worker_summary") {
        list.push_back({{"event", "summary"}, {"time", time}, {"steps", totals_[name].first}, {"interrupted", false}});
      }
    }
    return out;
  }

  const RunConfig& config_;
  const fs::path metrics_path_;
  StatusServer server_;
  std::unique_ptr<Registry> registry_;  // the launcher's own connection, opened at the first refresh
  Clock::time_point next_refresh_ = Clock::now();
  size_t offset_ = 0;                   // of metrics.jsonl read so far
  std::map<std::string, std::pair<int64_t, int64_t>> totals_;  // by worker: steps, tokens of its path tasks
  mutable std::mutex mutex_;            // the snapshot below, read by the server's threads
  nlohmann::json dipaco_;
  bool finished_ = false;
  std::string stopping_;
};

// Starts cluster.workers `loco path-worker` processes and relays their lines until every one has
// exited: Ctrl-C stops them (again: kills them), one that dies is started again while --restarts
// allow. Returns each process's exit status, in start order; `interrupts_seen` the Ctrl-Cs.
std::vector<int> run_workers(const RunConfig& config, const LaunchOptions& options, DipacoStatus& status, int& interrupts_seen) {
  const int64_t m = config.cluster.workers;
  std::vector<std::string> argv = {options.executable.string(), "path-worker", "--config", options.config_file.string()};
  for (const auto& o : options.overrides) argv.push_back("--" + o);
  std::vector<WorkerProcess> workers;
  for (int64_t r = 0; r < m; ++r) {
    workers.push_back(spawn(r, argv, m));
    status.started(workers.back());
  }
  fmt::print(options.out, "launch: {} workers lease DiPaCo's tasks from {}; a worker that dies loses its task to another "
                          "within dipaco.lease_s = {:g} s\n", m,
             config.dipaco.database.empty() ? (fs::path(config.run.dir) / "dipaco.sqlite").string() : "the PostgreSQL registry",
             config.dipaco.lease_s);
  std::fflush(options.out);

  int64_t restarts_left = options.restarts;
  auto alive = [&] { return std::count_if(workers.begin(), workers.end(), [](const auto& w) { return !w.exit_code; }); };
  while (alive() > 0) {
    status.refresh(workers);
    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, bool>> owners;
    for (size_t i = 0; i < workers.size(); ++i) {
      if (workers[i].out_fd >= 0) fds.push_back({workers[i].out_fd, POLLIN, 0}), owners.emplace_back(i, true);
      if (workers[i].err_fd >= 0) fds.push_back({workers[i].err_fd, POLLIN, 0}), owners.emplace_back(i, false);
    }
    ::poll(fds.data(), fds.size(), 200);
    for (size_t f = 0; f < fds.size(); ++f) {
      if (!(fds[f].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto& w = workers[owners[f].first];
      int& fd = owners[f].second ? w.out_fd : w.err_fd;
      std::vector<std::string> lines;
      if (!read_lines(fd, owners[f].second ? w.out_buffer : w.err_buffer, lines)) {
        ::close(fd);
        fd = -1;
      }
      for (const auto& line : lines) fmt::print(options.out, "[w{}] {}\n", w.rank, line);
      std::fflush(options.out);
    }
    const int interrupts = options.interrupts != nullptr ? options.interrupts->load() : 0;
    if (interrupts > interrupts_seen) {
      interrupts_seen = interrupts;
      status.stopping("interrupted (Ctrl-C)");
      fmt::print(options.out, "{}\n", interrupts == 1 ? "launch: stopping: each worker gives its task back (Ctrl-C again to kill them)"
                                                     : "launch: killing the workers");
      for (auto& w : workers) {
        if (!w.exit_code) ::kill(w.pid, interrupts == 1 ? SIGINT : SIGKILL);
      }
    }
    for (size_t i = 0; i < workers.size(); ++i) {
      auto& w = workers[i];
      int raw = 0;
      if (w.exit_code || ::waitpid(w.pid, &raw, WNOHANG) != w.pid) continue;
      w.exit_code = decode_status(raw);
      status.exited(w, /*failed=*/*w.exit_code != 0 && interrupts_seen == 0);
      if (*w.exit_code == 0 || interrupts_seen > 0) continue;
      fmt::print(options.out, "launch: worker {} exited with status {}; its task goes to another worker when its lease runs "
                              "out{}\n", w.rank, *w.exit_code, restarts_left > 0 ? "; starting it again" : "");
      if (restarts_left > 0) {
        --restarts_left;
        workers.push_back(spawn(w.rank, argv, m));
        status.started(workers.back());
      }
    }
  }

  status.refresh(workers, /*force=*/true);  // the registry as the run ends: the page shows it while the paths are scored
  // What the workers wrote last (an error, often) is still in their pipes.
  for (auto& w : workers) {
    for (int* fd : {&w.out_fd, &w.err_fd}) {
      std::vector<std::string> lines;
      while (*fd >= 0 && read_lines(*fd, fd == &w.out_fd ? w.out_buffer : w.err_buffer, lines)) {
      }
      for (const auto& line : lines) fmt::print(options.out, "[w{}] {}\n", w.rank, line);
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
  }
  std::fflush(options.out);
  std::vector<int> exit_codes;
  for (const auto& w : workers) exit_codes.push_back(*w.exit_code);
  return exit_codes;
}

}  // namespace

DipacoLaunchResult launch_dipaco(const RunConfig& config, const LaunchOptions& options) {
  const auto started = Clock::now();
  if (LinkPlan::from_config(config.link, options.links, config.cluster.workers).enabled) {
    throw ConfigError("launch", "emulated links (--link, [link]) are not supported for DiPaCo runs yet: its workers meet "
                                "through the task registry, not a coordinator; leave them out");
  }
  check_run_dir(config, options.resume);
  prepare_dipaco_run(config, options.out);

  DipacoLaunchResult result;
  int interrupts_seen = 0;
  DipacoStatus status(config, options);
  fmt::print(options.out, "launch: status page: {}\n", status.url());
  result.exit_codes = run_workers(config, options, status, interrupts_seen);
  auto registry = open_run_registry(config);
  for (const auto& task : registry->tasks()) result.reissued += task.leases > 1 ? 1 : 0;
  if (!registry->finished()) {
    int64_t left = 0;
    for (const auto& task : registry->tasks()) left += task.state != "done" && task.state != "cancelled";
    result.outcome = interrupts_seen > 0 ? RunOutcome::kStopped : RunOutcome::kFailed;
    result.message = interrupts_seen > 0 ? "interrupted (Ctrl-C)"
                                         : fmt::format("every worker exited before the run finished ({} task(s) not done)", left);
  } else {
    fmt::print(options.out, "launch: every module took its last outer step; scoring each path on its validation documents\n");
    result.evaluation = evaluate_dipaco(config);
    nlohmann::json paths = nlohmann::json::array();
    for (const auto& p : result.evaluation.paths) {
      paths.push_back({{"path", p.path}, {"documents", p.documents}, {"tokens", p.tokens},
                       {"val_loss", std::isfinite(p.loss) ? nlohmann::json(p.loss) : nlohmann::json(nullptr)}});
    }
    write_file_atomic(fs::path(config.run.dir) / "dipaco-eval.json",
                      nlohmann::json{{"val_loss", result.evaluation.loss}, {"tokens", result.evaluation.tokens},
                                     {"paths", paths}}.dump(1) + "\n", "launch");
    // A sample from the one path the router picks for a prompt: inference runs a single path.
    const auto tokenizer = data::Tokenizer::load(fs::path(config.data.dir) / "tokenizer.model");
    auto ids = tokenizer.encode(options.sample_prompt);
    if (ids.empty()) ids.push_back(tokenizer.eos_id());
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
    result.sample = tokenizer.decode(ids);
  }
  result.wall_s = std::chrono::duration<double>(Clock::now() - started).count();
  return result;
}

}  // namespace loco::runtime
