#include "loco/runtime/launch/launcher.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "loco/core/command.h"
#include "loco/core/files.h"
#include "loco/core/run_folder.h"
#include "loco/runtime/config/secrets.h"
#include "loco/runtime/net/auth.h"
#include "loco/runtime/launch/islands.h"
#include "loco/runtime/launch/supervisor.h"
#include "loco/metrics/progress.h"
#include "loco/runtime/worker/worker.h"

namespace loco::runtime {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// A worker's latest progress, as its JSON lines report it.
struct WorkerStatus {
  bool running = true;
  metrics::ProgressReport progress;
};

// The launcher's terminal: the main thread relays workers' lines and progress, the coordinator's
// threads log through line(); one mutex keeps their writes and the status line whole.
class Display {
 public:
  // `shared_steps`: the workers share the run's steps (asynchronous DiLoCo), each at its own pace:
  // the line counts every worker's steps against the run's, not the slowest worker's.
  Display(std::FILE* out, bool interactive, int64_t log_every, bool shared_steps)
      : out_(out), interactive_(interactive), log_every_(log_every), shared_steps_(shared_steps) {}

  void line(const std::string& text) {
    std::lock_guard lock(mutex_);
    clear();
    fmt::print(out_, "{}\n", text);
    redraw();
  }

  void progress(const std::map<int64_t, WorkerStatus>& workers) {
    std::lock_guard lock(mutex_);
    int64_t min_step = INT64_MAX, steps = 0, min_round = INT64_MAX, max_bytes = 0;
    double loss = 0, tokens_per_s = 0;
    int reporting = 0;
    for (const auto& [rank, w] : workers) {
      if (!w.running) continue;  // a worker that died (an elastic run goes on; a replacement takes over)
      const auto& p = w.progress;
      if (p.steps == 0) return;  // not every worker has reported yet
      min_step = std::min(min_step, p.step);
      steps = p.steps;
      min_round = std::min(min_round, p.round);
      max_bytes = std::max(max_bytes, p.bytes_sent);
      if (std::isfinite(p.loss)) {
        loss += p.loss;
        ++reporting;
      }
      tokens_per_s += p.tokens_per_s;
    }
    if (shared_steps_) {  // every worker's steps so far, ended ones' too, against the run's
      min_step = 0;
      for (const auto& [rank, w] : workers) min_step += w.progress.step, max_bytes = std::max(max_bytes, w.progress.bytes_sent);
      steps *= static_cast<int64_t>(workers.size());
    }
    if (first_step_ < 0) first_step_ = min_step, started_ = Clock::now();
    const double elapsed = std::chrono::duration<double>(Clock::now() - started_).count();
    const double eta = min_step > first_step_ ? elapsed / static_cast<double>(min_step - first_step_) * static_cast<double>(steps - min_step) : NAN;
    // No worker reports a loss when the compute is emulated (train.emulated_step_s).
    const std::string shown = reporting > 0 ? fmt::format("loss {:.4f} (mean of {})", loss / reporting, reporting) : "loss -";
    status_ = fmt::format("{} {}/{}  {}  {:.0f} tok/s (all workers){}  elapsed {}  eta {}", shared_steps_ ? "steps (all workers)" : "step",
                          min_step, steps, shown, tokens_per_s,
                          min_round >= 0 ? fmt::format("  round {}, sent {}/worker", min_round,
                                                       metrics::format_bytes(static_cast<double>(max_bytes)))
                                         : "",
                          metrics::format_duration(elapsed), metrics::format_duration(eta));
    if (interactive_) {
      redraw();
    } else if (min_step >= printed_step_ + log_every_ * (shared_steps_ ? std::ssize(workers) : 1) || min_step == steps) {
      if (min_step != printed_step_) fmt::print(out_, "{}\n", status_);
      printed_step_ = min_step;
      std::fflush(out_);
    }
  }

  void finish() {
    std::lock_guard lock(mutex_);
    clear();
  }

 private:
  void clear() {
    if (interactive_ && drawn_) fmt::print(out_, "\r\033[K");
    drawn_ = false;
  }
  void redraw() {
    if (interactive_ && !status_.empty()) {
      fmt::print(out_, "\r\033[K{}", status_);
      drawn_ = true;
    }
    std::fflush(out_);
  }
  std::mutex mutex_;
  std::FILE* out_;
  bool interactive_;
  int64_t log_every_;
  bool shared_steps_;
  bool drawn_ = false;
  std::string status_;
  int64_t printed_step_ = -1, first_step_ = -1;
  Clock::time_point started_;
};

// --resume with another config than the one the run started with (RUN/config.toml, as its workers
// resolved it): keys that define the run are refused, all of them listed, before any process
// starts; the others (train.steps, eval, checkpoints, logging) are said and taken.
void check_against_saved_config(const RunConfig& config, std::FILE* out) {
  const auto file = RunFolder(config.run.dir).config();
  if (!fs::exists(file)) return;
  const auto saved = parse_config(read_file_beneath(file.parent_path(), file.filename(), "launch", kMaxRunTextBytes), file.string());
  RunConfig given = config;
  if (given.model.vocab_size == 0) given.model.vocab_size = saved.model.vocab_size;  // the dataset's, resolved at the start
  const auto fixed = differences(saved, given, kResumeFixedKeys);
  if (!fixed.empty()) {
    throw ConfigError("launch", fmt::format("--resume: the config differs from the one {} started with ({}) in keys that "
                                            "define the run: {}; continue it with its own config (loco launch --resume "
                                            "--run.dir={}), or start a new run in another run.dir",
                                            config.run.dir, file.string(), fmt::join(fixed, "; "), shell_word(config.run.dir)));
  }
  const auto changed = differences_except(saved, given, kResumeFixedKeys);
  if (!changed.empty()) fmt::print(out, "launch: resuming with changes from {}: {}\n", file.string(), fmt::join(changed, "; "));
}

void check_run_dir(const RunConfig& config, bool resume, std::FILE* out) {
  const fs::path run(config.run.dir);
  std::error_code ec;
  if (resume) {
    // An elastic run resumes from the global checkpoints, a fixed one (and asynchronous DiLoCo,
    // whose global state is the coordinator's outer state) from each worker's.
    const bool global = config.cluster.elastic && !config.sync.async;
    const fs::path needed = global ? RunFolder(run).checkpoints() : RunFolder(run).workers();
    if (!fs::exists(needed, ec)) {
      throw ConfigError("launch", fmt::format("--resume: {} holds no {} (no {}){}", run.string(),
                                              global ? "global checkpoints" : "workers' checkpoints",
                                              needed.string(),
                                              RunFolder(run).unstarted() ? ": the run never started; start it without --resume" : ""));
    }
    check_against_saved_config(config, out);
    return;
  }
  RunFolder(run).check_new_run("launch");  // a failed start's folder is taken again, its join token with it
}

// One `loco launch`: the coordinator in this process, the workers as child processes of the
// supervisor, their output relayed, and their ends (and Ctrl-C) turned into the run's outcome.
// launch() below calls the stages in order.
class Launch {
 public:
  Launch(const RunConfig& config, const LaunchOptions& options)
      : config_(config), options_(options), display_(options.out, options.interactive, config.train.log_every, config.sync.async),
        islands_(make_islands()), back_home_{islands_.get()}, coordinator_(coordinator_options()),
        workers_(config.cluster.workers, std::chrono::duration_cast<Supervisor::Clock::duration>(
                                             std::chrono::duration<double>(config.cluster.timeout_s + 60))),
        restarts_left_(options.restarts), elastic_(config.cluster.elastic) {
    public_overrides_ = options.overrides;
    secrets_ = take_secret_overrides(public_overrides_);  // `ps` shows argv to every local user
    coordinator_.start();
  }

  void start_workers();
  // Elastic runs go on when a worker dies, and may have members this launcher did not start
  // (replacements): the run ends when the coordinator says so.
  bool going() const { return workers_.alive() > 0 || (elastic_ && !run_over_); }
  void restart_dead();
  void relay_output();
  void handle_interrupts();
  void reap_exited();
  void watch_coordinator();
  void kill_when_overdue();
  LaunchResult finish();

 private:
  // With links: island 0 for the coordinator, island r + 1 for worker r. This thread enters island 0,
  // so that the coordinator's socket (opened next) lives there.
  std::unique_ptr<Islands> make_islands() {
    const auto plan = LinkPlan::from_config(config_.link, options_.links, config_.cluster.workers);
    if (!plan.enabled) return nullptr;
    LinkSpec coordinator = plan.all;
    coordinator.cpu = 0;  // (it runs in this process, which keeps the machine's cores)
    std::vector<LinkSpec> links = {coordinator};
    for (int64_t r = 0; r < config_.cluster.workers; ++r) links.push_back(plan.for_worker(r));
    auto islands = std::make_unique<Islands>(links);
    islands->enter(0);
    display_.line("launch: " + islands->describe());
    return islands;
  }
  std::string coordinator_host() const { return islands_ ? islands_->address(0) : "127.0.0.1"; }
  CoordinatorOptions coordinator_options() {
    CoordinatorOptions o;
    o.bind = coordinator_host();
    // Its workers find the token where this one does (the config, the environment, or the run
    // folder's generated one), so that the control plane is authenticated on one machine too. The
    // islands' network exists only on this machine: its token is generated as on loopback.
    o.token = auth::coordinator_token(join_token(config_.cluster), config_.run.dir, islands_ ? "127.0.0.1" : o.bind, false);
    o.tls_cert = config_.cluster.tls_cert;
    o.tls_key = config_.cluster.tls_key;
    o.port = options_.port;
    o.config = config_;
    o.resume = options_.resume;
    o.log = [this](const std::string& text) { display_.line("[coordinator] " + text); };
    return o;
  }
  Placement island_of(int64_t rank) const {
    if (!islands_) return {-1, "", secrets_};
    const auto island = static_cast<size_t>(rank) + 1;
    return {islands_->netns_fd(island), islands_->cpu_procs_file(island), secrets_};
  }
  void start_worker(int64_t rank) {
    const pid_t pid = workers_.start(rank, argvs_[static_cast<size_t>(rank)], island_of(rank));
    coordinator_.process_started(rank, host_name(), pid);
    status_[rank] = WorkerStatus{};
  }
  // Stops the workers after a failure: they save their state, and are killed after the grace.
  void fail(const std::string& why) {
    failure_ = why;
    coordinator_.request_stop(failure_);
    workers_.stop_all(SIGTERM);
  }
  void relay(const ChildLine& line);

  const Clock::time_point started_ = Clock::now();
  const RunConfig& config_;
  const LaunchOptions& options_;
  Display display_;
  std::unique_ptr<Islands> islands_;  // before the coordinator: its socket is opened in island 0
  // Takes this thread out of island 0 again, however the launch ends (a constructor that throws
  // included), so that the islands' namespaces go with their descriptors.
  struct BackHome {
    Islands* islands;
    ~BackHome() {
      if (islands != nullptr) islands->leave();
    }
  } back_home_;
  Coordinator coordinator_;
  Supervisor workers_;                           // after the coordinator: workers go first
  std::vector<std::string> public_overrides_;    // the user's overrides but secrets, for the workers' argv
  std::vector<std::pair<std::string, std::string>> secrets_;  // ... and the secrets, for their environment
  std::vector<std::vector<std::string>> argvs_;  // by rank
  std::map<int64_t, WorkerStatus> status_;       // by rank: its latest process's progress
  int64_t restarts_left_;
  std::vector<int64_t> to_restart_;              // ranks whose process died, to start again (elastic --restarts)
  const bool elastic_;
  bool run_over_ = false;
  std::string failure_;
};

void Launch::start_workers() {
  const int64_t m = config_.cluster.workers;
  if (islands_) {
    // Each worker's link, for `loco report` to count what a sync took beyond its bytes.
    const auto plan = LinkPlan::from_config(config_.link, options_.links, m);
    nlohmann::json workers = nlohmann::json::array();
    for (int64_t r = 0; r < m; ++r) {
      const auto link = plan.for_worker(r);
      workers.push_back({{"rank", r}, {"rate_bps", link.rate_bps}, {"delay_s", link.delay_s}});
    }
    std::filesystem::create_directories(config_.run.dir);
    write_file_atomic(RunFolder(config_.run.dir).links(), nlohmann::json{{"workers", workers}}.dump(2) + "\n", "launch");
  }
  for (int64_t r = 0; r < m; ++r) {
    std::vector<std::string> argv = {options_.executable.string(), "worker", "--coordinator",
                                     fmt::format("{}:{}", coordinator_host(), coordinator_.port()), "--config",
                                     options_.config_file.string(), "--rank", std::to_string(r), "--progress", "json"};
    if (options_.resume) argv.push_back("--resume");
    for (const auto& o : public_overrides_) argv.push_back("--" + o);
    argvs_.push_back(std::move(argv));
    start_worker(r);  // one that cannot start: the supervisor kills the others as the launch unwinds
  }
  // A launch always has a join token, so "auto" is an authenticated data plane.
  const auto& plane = config_.cluster.data_plane;
  display_.line(fmt::format("launch: {} workers ({}), coordinator on {}:{}, data plane {}, run {}", m,
                            to_string(config_.sync.algorithm), coordinator_host(), coordinator_.port(),
                            plane == "auto" ? "authenticated" : plane, config_.run.dir));
}

void Launch::restart_dead() {
  for (int64_t rank : std::exchange(to_restart_, {})) {
    auto& argv = argvs_[static_cast<size_t>(rank)];
    argv.erase(std::remove(argv.begin(), argv.end(), std::string("--resume")), argv.end());  // it joins the run under way
    start_worker(rank);
    display_.line(fmt::format("launch: started worker {} again ({} restart(s) left): it joins the run as a replacement",
                              rank, restarts_left_));
  }
}

// Waits up to 200 ms for output, then relays every complete line: progress into the status line,
// messages and anything else as lines prefixed with the worker's rank.
void Launch::relay_output() {
  if (islands_ && !workers_.stopping() && !islands_->relay_error().empty()) {
    display_.line("launch: the emulated links stopped: " + islands_->relay_error() + "; stopping the workers");
    fail("the emulated links stopped: " + islands_->relay_error());
  }
  for (const auto& line : workers_.read(std::chrono::milliseconds(200))) relay(line);
}

void Launch::relay(const ChildLine& line) {
  const auto parsed = line.is_stdout ? metrics::parse_progress_line(line.text) : std::nullopt;
  if (parsed && parsed->progress) {
    status_[line.rank].progress = *parsed->progress;
    display_.progress(status_);
  } else if (parsed && parsed->message) {
    display_.line(fmt::format("[w{}] {}", line.rank, *parsed->message));
  } else if (!line.text.empty()) {
    display_.line(fmt::format("[w{}] {}", line.rank, line.text));
  }
}

// Ctrl-C: the workers finish their step and checkpoint. Again: kill them.
void Launch::handle_interrupts() {
  const int count = options_.interrupts != nullptr ? options_.interrupts->load() : 0;
  if (!workers_.interrupt(count)) return;
  if (count == 1) {
    coordinator_.request_stop("interrupted (Ctrl-C)");
    display_.line("launch: stopping: each worker finishes its step and saves a checkpoint (Ctrl-C again to kill them)");
  } else {
    display_.line("launch: killing the workers");
  }
}

// A worker that exited: fine when it finished (or stopped on request); in an elastic run its
// member failed and the run goes on (started again with --restarts); in a fixed run the others stop.
void Launch::reap_exited() {
  for (const auto& exit : workers_.reap()) {
    status_[exit.rank].running = false;
    const bool clean = exit.code == 0 || (exit.code == 130 && workers_.stopping());
    coordinator_.process_exited(host_name(), exit.pid, exit.code, /*failed=*/!clean);
    if (clean) continue;
    if (elastic_) {
      if (workers_.stopping() || run_over_) continue;
      const bool restart = restarts_left_ > 0;
      display_.line(fmt::format("launch: worker {} exited with {}; the run goes on without it{}", exit.rank,
                                describe_exit(exit.code), restart ? " until it is started again" : ""));
      if (restart) {
        --restarts_left_;
        to_restart_.push_back(exit.rank);
      }
      continue;
    }
    if (!workers_.stopping()) {
      display_.line(fmt::format("launch: worker {} exited with {}; stopping the others (they save their state)",
                                exit.rank, describe_exit(exit.code)));
      fail(fmt::format("worker {} exited with status {}", exit.rank, exit.code));
    }
  }
}

// The coordinator may fail the run by itself (a worker never joined); an elastic run ends there.
void Launch::watch_coordinator() {
  if (run_over_) return;
  auto result = coordinator_.wait_for(std::chrono::milliseconds(0));
  if (!result) return;
  if (result->outcome == RunOutcome::kFailed && !workers_.stopping()) fail(result->message);
  if (!elastic_) return;
  run_over_ = true;
  // Members that left (a frozen worker declared failed) may still be running.
  if (workers_.alive() > 0) workers_.stop_all(SIGTERM, std::chrono::seconds(10));
}

void Launch::kill_when_overdue() {
  if (workers_.kill_when_overdue()) display_.line("launch: workers did not stop in time; killing them");
}

LaunchResult Launch::finish() {
  display_.finish();
  for (const auto& line : workers_.drain()) relay(line);  // what they wrote last (an error, often)
  if (islands_) {
    // What the emulator itself did: a run's times are the links' only where it kept up.
    display_.line(fmt::format("launch: the relay carried {} frames, dropped {} (a full queue, as a router drops); a frame "
                              "waited in its socket at most {:.1f} ms and left at most {:.1f} ms after it was due",
                              islands_->frames_relayed(), islands_->frames_dropped(), islands_->relay_backlog_s() * 1e3,
                              islands_->relay_late_s() * 1e3));
    if (islands_->frames_tampered() > 0) {
      display_.line(fmt::format("launch: the relay altered {} frame(s), as an attacker on the path would (--link tamper=)",
                                islands_->frames_tampered()));
    }
  }
  LaunchResult result;
  for (const auto& code : workers_.exit_codes()) result.exit_codes.push_back(code.value_or(-1));
  const bool interrupted = workers_.interrupts() > 0;
  auto outcome = coordinator_.wait_for(std::chrono::milliseconds(workers_.stopping() ? 0 : 2000));
  const bool all_ok = std::all_of(result.exit_codes.begin(), result.exit_codes.end(), [](int c) { return c == 0; });
  if (outcome) {
    result.outcome = outcome->outcome;
    result.message = outcome->message;
    result.summaries = outcome->summaries;
  }
  if (!failure_.empty()) {
    result.outcome = RunOutcome::kFailed;
    result.message = failure_;
  } else if (!all_ok && !elastic_) {
    result.outcome = interrupted ? RunOutcome::kStopped : RunOutcome::kFailed;
    if (result.message.empty()) result.message = interrupted ? "interrupted (Ctrl-C)" : "a worker failed";
  }
  if (result.summaries.empty()) result.summaries.resize(result.exit_codes.size());
  result.wall_s = std::chrono::duration<double>(Clock::now() - started_).count();
  return result;
}

}  // namespace

LaunchResult launch(const RunConfig& config, const LaunchOptions& options) {
  if (options.restarts > 0 && !config.cluster.elastic) {
    throw ConfigError("launch", "--restarts needs cluster.elastic = true: in a fixed run a worker's death stops the run "
                                "(continue it with --resume)");
  }
  check_run_dir(config, options.resume, options.out);
  Launch run(config, options);  // starts the coordinator
  run.start_workers();
  while (run.going()) {
    run.restart_dead();
    run.relay_output();
    run.handle_interrupts();
    run.reap_exited();
    run.watch_coordinator();
    run.kill_when_overdue();
  }
  return run.finish();
}

}  // namespace loco::runtime
