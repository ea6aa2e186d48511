#include "loco/runtime/launch/dipaco_launch.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include "loco/core/files.h"
#include "loco/data/tokenizer.h"
#include "loco/model/precision.h"
#include "loco/model/sampling.h"
#include "loco/runtime/launch/islands.h"
#include "loco/runtime/launch/processes.h"

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

// Starts cluster.workers `loco path-worker` processes and relays their lines until every one has
// exited: Ctrl-C stops them (again: kills them), one that dies is started again while --restarts
// allow. Returns each process's exit status, in start order; `interrupts_seen` the Ctrl-Cs.
std::vector<int> run_workers(const RunConfig& config, const LaunchOptions& options, int& interrupts_seen) {
  const int64_t m = config.cluster.workers;
  std::vector<std::string> argv = {options.executable.string(), "path-worker", "--config", options.config_file.string()};
  for (const auto& o : options.overrides) argv.push_back("--" + o);
  std::vector<WorkerProcess> workers;
  for (int64_t r = 0; r < m; ++r) workers.push_back(spawn(r, argv, m));
  fmt::print(options.out, "launch: {} workers lease DiPaCo's tasks from {}; a worker that dies loses its task to another "
                          "within dipaco.lease_s = {:g} s\n", m,
             config.dipaco.database.empty() ? (fs::path(config.run.dir) / "dipaco.sqlite").string() : "the PostgreSQL registry",
             config.dipaco.lease_s);
  std::fflush(options.out);

  int64_t restarts_left = options.restarts;
  auto alive = [&] { return std::count_if(workers.begin(), workers.end(), [](const auto& w) { return !w.exit_code; }); };
  while (alive() > 0) {
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
      if (*w.exit_code == 0 || interrupts_seen > 0) continue;
      fmt::print(options.out, "launch: worker {} exited with status {}; its task goes to another worker when its lease runs "
                              "out{}\n", w.rank, *w.exit_code, restarts_left > 0 ? "; starting it again" : "");
      if (restarts_left > 0) {
        --restarts_left;
        workers.push_back(spawn(w.rank, argv, m));
      }
    }
  }

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
  result.exit_codes = run_workers(config, options, interrupts_seen);
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
