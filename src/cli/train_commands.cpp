// loco train | launch | worker | path-worker | coordinator: the commands that train.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>

#include "command.h"
#include "loco/comm/group.h"
#include "loco/core/command.h"
#include "loco/core/environment.h"
#include "loco/core/error.h"
#include "loco/core/run_folder.h"
#include "loco/data/dataset.h"
#include "loco/runtime/coordinator/coordinator.h"
#include "loco/runtime/dipaco/evaluation.h"
#include "loco/runtime/dipaco/worker.h"
#include "loco/runtime/launch/dipaco_launch.h"
#include "loco/runtime/launch/launcher.h"
#include "loco/runtime/worker/trainer.h"
#include "loco/runtime/worker/worker.h"

namespace loco::cli {
namespace {

namespace fs = std::filesystem;
using metrics::format_bytes;
using metrics::format_duration;

std::string describe_summary(const runtime::TrainSummary& summary) {
  const double gain = summary.val_unigram_entropy - summary.val_loss;
  std::string sync;
  if (summary.rounds > 0) {
    sync = fmt::format("; {} sync rounds sent {}, received {} ({:.1f} s in collectives)", summary.rounds,
                       format_bytes(static_cast<double>(summary.bytes_sent)),
                       format_bytes(static_cast<double>(summary.bytes_received)), summary.sync_s);
  }
  std::string loss;
  if (std::isnan(summary.val_loss)) {
    loss = "not evaluated in this process (worker 0 scores the global parameters; a stopped round is scored on resume)";
  } else {
    loss = fmt::format("val_loss {:.4f} (ppl {:.2f}); val_unigram_entropy {:.4f}; val_loss is {:.3f} nats {} it",
                       summary.val_loss, summary.val_ppl, summary.val_unigram_entropy, std::abs(gain),
                       gain >= 0 ? "below" : "above");
  }
  return fmt::format("{} after {} steps ({} tokens, {}): {}{}", summary.interrupted ? "interrupted" : "trained",
                     summary.steps, summary.tokens, format_duration(summary.wall_s), loss, sync);
}

// One line for the whole launch: the global model's loss (or each replica's, for `local`) and the
// traffic of one worker; then each worker's compute utilization.
void print_launch_summary(const runtime::RunConfig& config, const runtime::LaunchResult& result) {
  std::vector<runtime::TrainSummary> summaries;
  for (const auto& s : result.summaries) {
    if (s) summaries.push_back(*s);
  }
  if (summaries.empty()) return;
  // The worker that scored the global parameters (worker 0; in an elastic run, the last leader).
  const auto evaluated =
      std::find_if(summaries.begin(), summaries.end(), [](const auto& s) { return std::isfinite(s.val_loss); });
  const auto& first = evaluated != summaries.end() ? *evaluated : summaries[0];
  int64_t tokens = 0;
  std::vector<int64_t> steps;
  for (const auto& s : summaries) tokens += s.tokens, steps.push_back(s.steps);
  // Asynchronous DiLoCo shares the run's steps by speed: each worker's own.
  const std::string steps_text = config.sync.async ? fmt::format("steps {} by worker", fmt::join(steps, ", "))
                                                   : fmt::format("{} steps each", first.steps);
  std::string loss;
  if (config.sync.algorithm == runtime::Algorithm::kLocal) {
    std::vector<std::string> each;
    double sum = 0;
    for (const auto& s : summaries) {
      each.push_back(fmt::format("{:.4f}", s.val_loss));
      sum += s.val_loss;
    }
    loss = fmt::format("val_loss of each replica {} (mean {:.4f})", fmt::join(each, ", "), sum / static_cast<double>(summaries.size()));
  } else if (config.train.emulated_step_s > 0) {
    loss = "no loss (compute emulated)";
  } else if (std::isnan(first.val_loss)) {
    loss = "not evaluated yet";
  } else {
    loss = fmt::format("val_loss {:.4f} (ppl {:.2f}) of the global parameters", first.val_loss, first.val_ppl);
  }
  // Its peak, stall and utilization: what overlapping communication (Streaming DiLoCo) buys.
  std::string overlap;
  if (first.rounds > 0) {
    overlap = fmt::format("; worker 0: at most {} sent in one step, {:.1f} s stalled, {:.1f}% compute",
                          format_bytes(static_cast<double>(first.peak_step_bytes)), first.stall_s,
                          100 * first.compute_utilization);
  }
  std::string traffic = fmt::format("each worker sent {} and received {} in {} sync rounds ({:.1f} s in collectives)",
                                    format_bytes(static_cast<double>(first.bytes_sent)),
                                    format_bytes(static_cast<double>(first.bytes_received)), first.rounds, first.sync_s);
  if (config.sync.async) {  // each worker exchanges at its own pace
    std::vector<std::string> each;
    for (size_t w = 0; w < summaries.size(); ++w) {
      each.push_back(fmt::format("worker {} sent {} and received {} in {} exchanges", w, format_bytes(static_cast<double>(summaries[w].bytes_sent)),
                                 format_bytes(static_cast<double>(summaries[w].bytes_received)), summaries[w].rounds));
    }
    traffic = fmt::format("{}", fmt::join(each, ", "));
  }
  fmt::print("{} {} with {} workers: {} ({} tokens in all) in {}: {}; val_unigram_entropy {:.4f}; {}{}\n",
             result.outcome == runtime::RunOutcome::kFinished ? "trained" : "stopped",
             runtime::to_string(config.sync.algorithm), result.summaries.size(), steps_text, tokens, format_duration(result.wall_s),
             loss, first.val_unigram_entropy, traffic, overlap);
  std::vector<std::string> each;
  double sum = 0;
  for (const auto& s : summaries) {
    each.push_back(fmt::format("{:.1f}%", 100 * s.end_to_end_utilization));
    sum += s.end_to_end_utilization;
  }
  fmt::print("compute utilization end to end (time computing / wall time): {:.1f}% for the run (the workers' mean); by "
             "worker {}\n", 100 * sum / static_cast<double>(each.size()), fmt::join(each, ", "));
}

// What to do with a finished run: each a command to paste.
void print_next_steps(const std::string& run_dir, bool dipaco, bool emulated = false) {
  const auto run = shell_word(run_dir);
  if (emulated) {  // no checkpoint, nothing to score or sample
    fmt::print("next: loco report {}\n", run);
    return;
  }
  const auto source = dipaco ? "--config " + shell_word((std::filesystem::path(run_dir) / "config.toml").string())
                             : "--checkpoint " + run;
  fmt::print("next: loco report {}\n", run);
  fmt::print("next: loco eval {}\n", source);
  fmt::print("next: loco generate {} --prompt The\n", source);
}

class Train : public Command {
 public:
  explicit Train(CLI::App& app) {
    cmd = app.add_subcommand("train", "Train a model (override any config key with --section.key=value)");
    cmd->add_option("--config", config_file_, "TOML run config (see docs/configuration.md); with --resume and "
                                               "--run.dir=RUN alone, the config RUN started with");
    cmd->add_flag("--resume", resume_, "continue the run in run.dir from its latest checkpoint");
    cmd->allow_extras();
  }
  int run() override {
    const auto overrides = collect_overrides(cmd->remaining());
    const auto config = runtime::load_config(run_config_file(config_file_, resume_, overrides, "train"), overrides);
    runtime::check_trainable(config);
    const auto lock = RunLock::acquire(config.run.dir, "train", "loco train");
    print_warnings(config);
    if (auto finished = resume_ ? std::nullopt : runtime::finished_run(config, true)) {
      fmt::print("train: {}\n", runtime::describe(*finished, config));
      return 0;
    }
    if (config.cluster.workers > 1) {
      throw ConfigError("cli", fmt::format("cluster.workers = {}: `loco train` is one process; use `loco launch` (or `loco "
                                           "coordinator` and `loco worker`)", config.cluster.workers));
    }
    if (config.sync.async) {
      throw ConfigError("cli", "sync.async: asynchronous DiLoCo's outer state is a coordinator's; `loco train` has none: use "
                               "`loco launch` (or `loco coordinator` and `loco worker`)");
    }
    install_stop_handler();
    // One process is a group of one: DiLoCo, DDP and local then take the same path as with M workers
    // (its weight is 1 whatever its shard's size, given here as 1 token).
    auto sync = runtime::make_strategy(config, comm::GroupFactory::local().make(0, 0, 1), 1);
    runtime::TrainOptions options;
    options.resume = resume_;
    options.stop = &stop_requested();
    options.progress = progress_mode("auto");
    const auto summary = runtime::train(config, *sync, options);
    fmt::print("{}\n", describe_summary(summary));
    if (!summary.interrupted) {
      print_next_steps(config.run.dir, false, config.train.emulated_step_s > 0);
      return 0;
    }
    fmt::print("checkpoint saved; continue with: {}\n", resume_command("train", config.run.dir));
    return 130;
  }

 private:
  std::string config_file_;
  bool resume_ = false;
};

class Launch : public Command {
 public:
  explicit Launch(CLI::App& app) {
    cmd = app.add_subcommand("launch", "Train with a coordinator and several worker processes on this machine "
                                       "(override any config key with --section.key=value)");
    cmd->add_option("--workers", workers_, "worker processes (default: the config's cluster.workers)")
        ->check(CLI::Range(int64_t{1}, int64_t{4096}));
    cmd->add_option("--config", config_file_, "TOML run config (see docs/configuration.md); with --resume and "
                                               "--run.dir=RUN alone, the config RUN started with");
    cmd->add_option("--port", port_, "the coordinator's port on 127.0.0.1, or a DiPaCo launch's status page's (default: "
                                     "any free one)")->check(CLI::Range(int64_t{1}, int64_t{65535}));
    cmd->add_flag("--resume", resume_, "continue the run in run.dir from the workers' checkpoints");
    cmd->add_option("--link", links_, "run each process in an emulated island (its own network namespace; needs root) "
                                      "with this link: rate=RATE,delay=DELAY, e.g. rate=100mbit,delay=50ms; again as "
                                      "worker=R,rate=...,delay=... for worker R alone (see docs/slow-links.md)");
    cmd->add_option("--restarts", restarts_, "elastic runs: start a worker that dies again, up to this many times in all "
                                             "(it joins as a replacement)")->check(CLI::Range(int64_t{0}, int64_t{1000000}));
    cmd->allow_extras();
  }
  int run() override {
    auto overrides = collect_overrides(cmd->remaining());
    if (workers_ > 0) overrides.push_back(fmt::format("cluster.workers={}", workers_));
    const auto config_file = run_config_file(config_file_, resume_, overrides, "launch");
    const auto config = runtime::load_config(config_file, overrides);
    const bool dipaco = runtime::path_options(config).enabled();
    if (!dipaco) runtime::check_trainable(config);
    const auto lock = RunLock::acquire(config.run.dir, "launch", "loco launch");
    print_warnings(config);
    if (auto finished = resume_ || dipaco ? std::nullopt : runtime::finished_run(config)) {
      fmt::print("launch: {}\n", runtime::describe(*finished, config));
      print_next_steps(config.run.dir, false, config.train.emulated_step_s > 0);
      return 0;
    }
    install_interrupt_counter();
    ignore_broken_pipes();
    runtime::LaunchOptions options;
    options.config_file = config_file;
    options.overrides = overrides;
    options.resume = resume_;
    options.port = port_ > 0 ? port_ : 0;
    options.restarts = restarts_;
    options.links = links_;
    const auto worker = read_environment().worker_executable;
    options.executable = worker ? trusted_file(*worker, "LOCO_WORKER_EXECUTABLE") : fs::read_symlink("/proc/self/exe");
    options.interactive = metrics::Progress::is_terminal(stderr);
    options.interrupts = &interrupts();
    return dipaco ? run_dipaco(config, options) : run_dense(config, options);
  }

 private:
  int run_dense(const runtime::RunConfig& config, const runtime::LaunchOptions& options) {
    const auto result = runtime::launch(config, options);
    print_launch_summary(config, result);
    switch (result.outcome) {
      case runtime::RunOutcome::kFinished: print_next_steps(config.run.dir, false, config.train.emulated_step_s > 0); return 0;
      case runtime::RunOutcome::kStopped: {
        // Ctrl-C twice kills the workers before they save: their last periodic checkpoints remain.
        const bool killed = std::any_of(result.exit_codes.begin(), result.exit_codes.end(), [](int code) { return code == 128 + SIGKILL; });
        fmt::print("stopped ({}); {}; continue with: {}\n", result.message,
                   killed ? "workers were killed before they saved (Ctrl-C twice): the run continues from their last "
                            "checkpoints (checkpoint.every)"
                          : "the workers saved their state",
                   resume_command("launch", config.run.dir));
        return 130;
      }
      case runtime::RunOutcome::kFailed: break;
    }
    if (RunFolder(config.run.dir).unstarted()) {
      fmt::print(stderr, "error: [launch] {}; nothing was saved: once that is fixed, run the same command again\n", result.message);
      return 1;
    }
    // A worker (a peer of the run) failed after the start: exit status 2, as a worker's own.
    fmt::print(stderr, "error: [launch] {}; the workers that could saved their state; once that is fixed, continue with: "
                       "{}\n", result.message, resume_command("launch", config.run.dir));
    return 2;
  }
  int run_dipaco(const runtime::RunConfig& config, const runtime::LaunchOptions& options) {
    const auto result = runtime::launch_dipaco(config, options);
    if (result.outcome == runtime::RunOutcome::kFinished) {
      fmt::print("{}", runtime::describe(result.evaluation));
      fmt::print("\nsample from path {} (the one the router picks for \"{}\"): {}\n\n", result.sample_path,
                 options.sample_prompt, result.sample);
      fmt::print("DiPaCo {}: val_loss {:.4f} over {} tokens; {} task(s) issued again after a worker died or stopped; {} in "
                 "all\n", config.dipaco.levels, result.evaluation.loss, result.evaluation.tokens, result.reissued,
                 format_duration(result.wall_s));
      print_next_steps(config.run.dir, true);
      return 0;
    }
    if (result.outcome == runtime::RunOutcome::kStopped) {
      fmt::print("stopped ({}); the registry keeps every completed task; continue with: {}\n", result.message,
                 resume_command("launch", config.run.dir));
      return 130;
    }
    fmt::print(stderr, "error: [launch] {}; once that is fixed, continue with: {}\n", result.message,
               resume_command("launch", config.run.dir));
    return 2;
  }

  std::string config_file_;
  int64_t workers_ = 0, port_ = -1, restarts_ = 0;
  std::vector<std::string> links_;
  bool resume_ = false;
};

class Worker : public Command {
 public:
  explicit Worker(CLI::App& app) {
    cmd = app.add_subcommand("worker", "One worker of a run: joins a coordinator and trains its shard");
    cmd->add_option("--coordinator", coordinator_, "HOST:PORT of `loco coordinator` (default: $LOCO_COORDINATOR)");
    cmd->add_option("--config", config_file_, "TOML run config (the coordinator's, up to paths and devices)")->required();
    cmd->add_option("--rank", rank_, "this worker's rank (default: $RANK, $SLURM_PROCID, or the coordinator's choice)")
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
    cmd->add_flag("--resume", resume_, "continue from this worker's checkpoints (needs the rank)");
    cmd->add_flag("--insecure", insecure_, "without a join token, believe the coordinator's unsigned answers (only for a "
                  "`loco coordinator --insecure` on a network you trust: anyone holding its port could answer)");
    cmd->add_option("--progress", progress_, "auto, bar, lines or json")->check(CLI::IsMember({"auto", "bar", "lines", "json"}));
    cmd->allow_extras();
  }
  int run() override {
    const auto env = read_environment();
    if (coordinator_.empty()) {
      if (!env.coordinator) {
        throw ConfigError("cli", "worker: no coordinator; pass --coordinator HOST:PORT or set LOCO_COORDINATOR=HOST:PORT "
                                 "(torchrun's MASTER_ADDR:MASTER_PORT is its own rendezvous store, not loco's coordinator)");
      }
      coordinator_ = *env.coordinator;
    }
    const auto config = load_config_with(config_file_, cmd);
    runtime::check_trainable(config);
    if (env.world_size && *env.world_size != config.cluster.workers) {
      throw ConfigError("cli", fmt::format("WORLD_SIZE (or SLURM_NTASKS) is {} but cluster.workers is {}; hint: pass "
                                           "--cluster.workers={}", *env.world_size, config.cluster.workers, *env.world_size));
    }
    install_stop_handler();
    ignore_broken_pipes();
    runtime::WorkerOptions options;
    options.coordinator = coordinator_;
    options.rank = rank_ >= 0 ? rank_ : env.rank.value_or(-1);
    options.resume = resume_;
    options.insecure = insecure_;
    options.stop = &stop_requested();
    options.progress = progress_mode(progress_);
    options.out = options.progress == metrics::ProgressMode::kJson ? stdout : stderr;
    runtime::TrainSummary summary;
    try {
      summary = runtime::run_worker(config, options);
    } catch (const PeerError&) {
      // A worker started again after its run finished finds no coordinator there: where the run
      // folder records the end (this host's, as one host's runs share it), that is no failure.
      auto finished = resume_ ? std::nullopt : runtime::finished_run(config);
      if (!finished) throw;
      fmt::print(stderr, "worker: the coordinator did not answer, and {}\n", runtime::describe(*finished, config));
      return 0;
    }
    if (options.progress != metrics::ProgressMode::kJson) fmt::print("{}\n", describe_summary(summary));
    return summary.interrupted ? 130 : 0;
  }

 private:
  std::string coordinator_, config_file_, progress_ = "auto";
  int64_t rank_ = -1;
  bool resume_ = false, insecure_ = false;
};

class PathWorker : public Command {
 public:
  explicit PathWorker(CLI::App& app) {
    cmd = app.add_subcommand("path-worker", "One worker of a DiPaCo run: leases path and outer-step tasks from the run's "
                                            "registry until the run is finished (`loco launch` starts these)");
    cmd->add_option("--config", config_file_, "TOML run config with dipaco.levels (the run's)")->required();
    cmd->add_option("--name", name_, "this worker's name in the registry (default: host:pid)");
    cmd->add_option("--tasks", tasks_, "return after this many tasks (default: until the run is finished)")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    cmd->allow_extras();
  }
  int run() override {
    const auto config = load_config_with(config_file_, cmd);
    if (!runtime::path_options(config).enabled()) {
      throw ConfigError("cli", fmt::format("path-worker: {} sets no dipaco.levels; hint: `loco worker` trains a dense model",
                                           config_file_));
    }
    install_stop_handler();
    ignore_broken_pipes();
    runtime::DipacoWorkerOptions options;
    options.name = name_;
    options.stop = &stop_requested();
    options.max_tasks = tasks_;
    const auto summary = runtime::run_dipaco_worker(config, options);
    fmt::print(stderr, "{} path task(s) ({} inner steps, {} tokens), {} outer step(s), {} dropped; read {}, wrote {}; busy "
                       "{:.0f}% of {}; peak memory {}\n", summary.path_tasks, summary.inner_steps, summary.tokens,
               summary.step_tasks, summary.lost_tasks, format_bytes(static_cast<double>(summary.bytes_read)),
               format_bytes(static_cast<double>(summary.bytes_written)), 100 * summary.busy_s / std::max(summary.wall_s, 1e-9),
               format_duration(summary.wall_s), format_bytes(static_cast<double>(summary.peak_rss_bytes)));
    return summary.interrupted ? 130 : 0;
  }

 private:
  std::string config_file_, name_;
  int64_t tasks_ = -1;
};

class Coordinator : public Command {
 public:
  explicit Coordinator(CLI::App& app) {
    cmd = app.add_subcommand("coordinator", "Serve a run's membership and rendezvous to its workers");
    cmd->add_option("--config", config_file_, "TOML run config: the reference every worker must match")->required();
    cmd->add_option("--port", port_, "port to listen on (default: the config's cluster.port)")->check(CLI::Range(int64_t{1}, int64_t{65535}));
    cmd->add_option("--bind", bind_, "address to listen on (default: 0.0.0.0 when the run has a join token, else 127.0.0.1)");
    cmd->add_flag("--insecure", insecure_, "allow listening on a non-loopback address without a join token: anyone who can "
                                           "reach the port can then drive the run (a network you trust only)");
    cmd->add_option("--workers", workers_, "workers in the run (default: the config's cluster.workers)")->check(CLI::Range(int64_t{1}, int64_t{4096}));
    cmd->add_flag("--resume", resume_, "the workers continue from their checkpoints");
    cmd->allow_extras();
  }
  int run() override {
    std::vector<std::string> more;
    if (workers_ > 0) more.push_back(fmt::format("cluster.workers={}", workers_));
    const auto config = load_config_with(config_file_, cmd, more);
    runtime::check_trainable(config);
    const auto lock = RunLock::acquire(config.run.dir, "coordinator", "loco coordinator");
    if (auto finished = resume_ ? std::nullopt : runtime::finished_run(config)) {
      fmt::print(stderr, "coordinator: {}\n", runtime::describe(*finished, config));
      return 0;
    }
    install_stop_handler();
    ignore_broken_pipes();
    auto options = runtime::standalone_coordinator_options(config, bind_, insecure_, port_ > 0 ? port_ : 0, resume_);
    if (runtime::join_token(config.cluster).empty() && !options.token.empty()) {
      fmt::print(stderr, "coordinator: no join token set: workers on this machine sign their requests with the run's "
                         "generated one, {}/join_token (mode 0600)\n", config.run.dir);
    }
    options.log = [](const std::string& line) { fmt::print(stderr, "coordinator: {}\n", line); };
    runtime::Coordinator coordinator(options);
    coordinator.start();
    while (!stop_requested().load()) {
      const auto result = coordinator.wait_for(std::chrono::milliseconds(500));
      if (!result) continue;
      switch (result->outcome) {
        case runtime::RunOutcome::kFinished: fmt::print(stderr, "coordinator: the run finished\n"); return 0;
        case runtime::RunOutcome::kStopped: fmt::print(stderr, "coordinator: the run stopped: {}\n", result->message); return 130;
        case runtime::RunOutcome::kFailed: fmt::print(stderr, "error: [coordinator] {}\n", result->message); return 1;
      }
    }
    fmt::print(stderr, "coordinator: interrupted; running workers keep training (they need the coordinator to start, and "
                       "to tell a stop from a crash)\n");
    return 130;
  }

 private:
  std::string config_file_, bind_;
  int64_t port_ = -1, workers_ = 0;
  bool resume_ = false, insecure_ = false;
};

}  // namespace

void add_train_commands(CLI::App& app, Commands& commands) {
  commands.push_back(std::make_unique<Train>(app));
  commands.push_back(std::make_unique<Launch>(app));
  commands.push_back(std::make_unique<Worker>(app));
  commands.push_back(std::make_unique<PathWorker>(app));
  commands.push_back(std::make_unique<Coordinator>(app));
}

}  // namespace loco::cli
