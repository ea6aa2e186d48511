// `loco launch`: a coordinator (in this process) and M worker processes on this machine over
// loopback, their progress merged into one display. Ctrl-C stops them all cleanly (each finishes
// its step and checkpoints; a second Ctrl-C kills them); a worker that fails stops the others the
// same way. No worker outlives the launcher: each is told to stop (SIGTERM) if it dies.
// With links (--link or [link]), the coordinator and each worker are on emulated islands joined by
// shaped, delayed links (islands.h) instead of loopback.
#pragma once

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "loco/runtime/config/config.h"
#include "loco/runtime/coordinator/coordinator.h"

namespace loco::runtime {

struct LaunchOptions {
  std::filesystem::path config_file;       // passed to every worker, with the overrides
  std::vector<std::string> overrides;      // "section.key=value"
  bool resume = false;
  int64_t port = 0;                        // the coordinator's; 0 = any free port
  std::filesystem::path executable;        // the loco binary to start workers from
  bool interactive = false;                // redraw one status line (a terminal)
  const std::atomic<int>* interrupts = nullptr;  // SIGINT/SIGTERM received so far
  // Elastic runs: how many times in all a worker process that dies is started again (it joins as a
  // replacement for its slot). 0: the run goes on without it.
  int64_t restarts = 0;
  std::FILE* out = stderr;
  std::string sample_prompt = "The";       // DiPaCo: the prompt of the sample shown at the end
  // `--link` arguments (islands.h), over the config's [link] section: with either, every process
  // runs in an emulated island of its own.
  std::vector<std::string> links;
};

struct LaunchResult {
  RunOutcome outcome = RunOutcome::kFinished;
  std::string message;
  std::vector<std::optional<metrics::TrainSummary>> summaries;  // by rank (none when a worker sent none)
  std::vector<int> exit_codes;             // each process started, in order (128 + signal when killed)
  double wall_s = 0;
};

// Runs the whole job; returns when every worker has exited. Throws ConfigError before starting
// anything when the run folder is not fit (a fresh run into a used folder, a resume of nothing).
LaunchResult launch(const RunConfig& config, const LaunchOptions& options);

}  // namespace loco::runtime
