// A DiPaCo worker (docs/dipaco.md, "Training as tasks"): it leases a task from the run's registry,
// runs it, completes it, and again, until the run is finished. There is no process that must stay
// up: any number of workers, started at any time, share the run.
//
//   path task   loads only that path's modules (at the phase's versions) and its inner AdamW state,
//               trains the phase's inner steps on the path's documents (the training loop's own
//               inner step, runtime/worker/inner_step.h), and reports one outer gradient per
//               module, weighted by the path's training tokens (path_task.cpp)
//   step task   averages a module's reports (algorithms/dipaco.h), applies its outer optimizer and
//               publishes the next version (step_task.cpp)
//   route task  discriminative re-routing before a phase (route_task.cpp)
// The lease is renewed while the task runs (a thread with its own connection); a task whose lease
// was lost is dropped. The run is prepared by prepare_dipaco_run (run.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>

#include "loco/runtime/config/config.h"

namespace loco::runtime {

struct DipacoWorkerOptions {
  std::string name;                         // unique in the run (default: host:pid)
  const std::atomic<bool>* stop = nullptr;  // set by SIGINT/SIGTERM: drop the task in hand and return
  std::FILE* out = stderr;
  double poll_s = 0.5;                      // between asks when no task is due
  int64_t max_tasks = -1;                   // return after this many tasks (-1: until the run is finished)
};

struct DipacoWorkerSummary {
  int64_t path_tasks = 0, step_tasks = 0;
  int64_t lost_tasks = 0;                   // dropped: their lease ran out and another worker took them
  int64_t inner_steps = 0, tokens = 0;
  int64_t bytes_read = 0, bytes_written = 0;  // module, inner-state and report files
  double wall_s = 0, busy_s = 0;            // busy: running tasks (the rest is waiting for one)
  int64_t peak_rss_bytes = 0;               // the process's peak resident memory
  bool interrupted = false;
};

// Throws ConfigError/DataError when the run is not started or was started with another plan.
DipacoWorkerSummary run_dipaco_worker(const RunConfig& config, const DipacoWorkerOptions& options);

}  // namespace loco::runtime
