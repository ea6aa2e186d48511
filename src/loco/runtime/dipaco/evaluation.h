// Scoring a DiPaCo run (docs/dipaco.md, "Evaluation"): each validation document is routed by the
// run's router and scored by that one path, its routing tokens left out; dense baselines are
// scored on exactly the same windows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loco/runtime/config/config.h"

namespace loco::runtime {

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

// Scores the modules' latest versions. Each of `baselines` (a checkpoint or run folder of a dense
// model on the same dataset) is scored on exactly the same windows. Throws DataError when a module
// has no version, the run is not routed, or a baseline's tokenizer differs.
DipacoEvaluation evaluate_dipaco(const RunConfig& config, const std::vector<std::string>& baselines = {});

// The per-path table (Markdown), with any dense baselines as columns, and what it means.
std::string describe(const DipacoEvaluation& evaluation);

}  // namespace loco::runtime
