// DiPaCo's training as tasks (docs/dipaco.md, "Training as tasks"): the run's state is the
// registry (store/registry.h: the task queue and the module versions, in SQLite or PostgreSQL) and
// the module files (store/modules.h) in the run folder. There is no process that must stay up: any
// number of workers, started at any time, lease tasks until the run is finished.
//
//   prepare_dipaco_run    routes the training documents (RUN/routing, as `loco route`) unless they
//                         are routed, writes version 0 of every module from the initial model,
//                         and starts the run in the registry (phase 0's path tasks). Idempotent.
//   run_dipaco_worker     a worker's loop: lease a task, run it, complete it, until the run is
//                         finished. A path task loads only that path's modules (at the phase's
//                         versions) and its inner AdamW state, trains the phase's inner steps on
//                         the path's documents, and reports one outer gradient per module, weighted
//                         by the path's training tokens. A step task averages a module's reports
//                         (algorithms/dipaco.h), applies its outer optimizer and publishes the
//                         next version. The lease is renewed while the task runs (a thread with
//                         its own connection); a task whose lease was lost is dropped.
//   evaluate_dipaco       each path's validation loss on the validation documents routed to it,
//                         and the token-weighted overall loss.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "loco/model/transformer.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/store/registry.h"

namespace loco::runtime {

// The run's registry: RUN/dipaco.sqlite, or the PostgreSQL server of dipaco.database.
std::unique_ptr<Registry> open_run_registry(const RunConfig& config);

// The phases of a run: ceil(train.steps / sync.inner_steps), the last one shorter when H does not
// divide the steps.
int64_t dipaco_phases(const RunConfig& config);

// See above. Prints what it does to `out`. Throws ConfigError/DataError on a config or folder that
// cannot be a DiPaCo run (and DataError when the run folder's registry holds another plan).
RunLayout prepare_dipaco_run(const RunConfig& config, std::FILE* out);

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

DipacoWorkerSummary run_dipaco_worker(const RunConfig& config, const DipacoWorkerOptions& options);

struct PathScore {
  int64_t path = 0;
  int64_t documents = 0;  // validation documents routed to it
  int64_t tokens = 0;     // scored
  double loss = 0;
};

// A dense model scored on the same routed windows as the paths (a baseline).
struct BaselineScore {
  std::string checkpoint;
  std::vector<double> paths;  // its loss on each path's windows (NaN where the path has none)
  double loss = 0;            // over every scored token
};

struct DipacoEvaluation {
  std::vector<PathScore> paths;
  double loss = 0;        // over every scored token
  int64_t tokens = 0;
  std::vector<BaselineScore> baselines;
};

// Scores the modules' latest versions: each validation document is routed by the run's router
// and scored by that one path, its routing tokens left out. Each of `baselines` (a checkpoint or
// run folder of a dense model on the same dataset) is scored on exactly the same windows. Throws
// DataError when a module has no version, the run is not routed, or a baseline's tokenizer differs.
DipacoEvaluation evaluate_dipaco(const RunConfig& config, const std::vector<std::string>& baselines = {});

// Single-path inference: the router picks a path for a text from the initial model's features of
// data.route_tokens of its tokens (the first ones, as training routes documents; or the latest
// ones, to re-route as a generation goes on), and only that path's modules are loaded (their
// latest versions; each path once).
class PathInference {
 public:
  explicit PathInference(const RunConfig& config);
  ~PathInference();
  // The path for `tokens`: by their first data.route_tokens tokens, or with `latest` their last.
  int64_t route(const std::vector<int32_t>& tokens, bool latest = false);
  // Path `path`'s model on `device`, in evaluation mode.
  model::Transformer& model(int64_t path, const torch::Device& device);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loco::runtime
