// `loco launch` of a DiPaCo run (docs/dipaco.md, "Training as tasks"): prepares the run (routing,
// the modules' version 0, the registry's first tasks), starts cluster.workers `loco path-worker`
// processes that lease tasks until the run is finished, relays their lines, and scores every path
// at the end. A worker that dies is not waited for: its task goes to another worker when its lease
// runs out (dipaco.lease_s); with --restarts it is started again. Ctrl-C: each worker gives its
// task back and exits; `--resume` continues the run where its registry stands. The launcher serves
// the run's status page on 127.0.0.1 (docs/status-page.md): the task queue and the modules' versions.
#pragma once

#include <string>
#include <vector>

#include "loco/runtime/launch/launcher.h"
#include "loco/runtime/dipaco/evaluation.h"
#include "loco/runtime/dipaco/run.h"

namespace loco::runtime {

struct DipacoLaunchResult {
  RunOutcome outcome = RunOutcome::kFinished;
  std::string message;
  std::vector<int> exit_codes;       // each process started, in order (128 + signal when killed)
  DipacoEvaluation evaluation;       // when finished
  int64_t reissued = 0;              // tasks leased more than once (a worker died or stopped)
  int64_t sample_path = -1;          // the path the router picked for LaunchOptions::sample_prompt
  std::string sample;                // its continuation by that one path
  double wall_s = 0;
};

// Throws ConfigError before starting anything when the run folder is not fit (a fresh run into a
// used folder, a resume of nothing).
DipacoLaunchResult launch_dipaco(const RunConfig& config, const LaunchOptions& options);

}  // namespace loco::runtime
