// Scoring a DiPaCo run (docs/dipaco.md, "Scoring"): each validation document is routed by the
// run's router and scored whole by that one path (every token, in windows that start at the
// document's start; data::covering_batches), its routing tokens left out; dense baselines are
// scored on exactly the same windows. Each document's losses are kept, and every pair of models
// is compared by a paired bootstrap over documents (metrics/bootstrap.h). With
// dipaco.early_stopping, half of each path's validation documents (by a hash of train.seed and the
// document) pick its version among the kept ones (on eval.windows windows of theirs), and only the
// other half is scored, for the paths and the baselines alike.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "loco/metrics/bootstrap.h"
#include "loco/runtime/config/config.h"

namespace loco::runtime {

class DipacoRun;
class Registry;

struct PathScore {
  int64_t path = 0;
  int64_t documents = 0;  // validation documents routed to it (and scored: without those that picked its version)
  int64_t tokens = 0;     // scored
  double loss = 0;
  int64_t version = -1;   // the version of its modules scored: the latest, or the one early stopping picked
  std::map<int64_t, double> picking;  // early stopping: each kept version's loss on the documents that pick
};

// A dense model scored on the same routed windows as the paths (a baseline).
struct BaselineScore {
  std::string checkpoint;
  std::vector<double> paths;  // its loss on each path's windows (NaN where the path has none)
  double loss = 0;            // over every scored token
};

// One scored validation document.
struct DocumentScore {
  int64_t document = 0;           // its index in the validation split
  int64_t path = 0;               // the router's
  int64_t tokens = 0;             // scored
  std::vector<double> loss_sums;  // summed over its tokens: [0] DiPaCo's path, then each baseline's in order
};

// Two of the models scored (DiPaCo is "dipaco", a baseline its checkpoint): a - b per token.
struct Comparison {
  std::string a, b;
  metrics::PairedInterval interval;
};

struct DipacoEvaluation {
  bool early_stopping = false;
  std::vector<PathScore> paths;
  double loss = 0;        // over every scored token
  int64_t tokens = 0;
  std::vector<BaselineScore> baselines;
  std::vector<DocumentScore> documents;  // every document scored, by path
  std::vector<Comparison> comparisons;   // every pair of models, DiPaCo first
};

// Whether validation document `document` is one of those that pick a path's version (early stopping).
bool picks_version(uint64_t seed, int64_t document);

// The versions of path `path`'s modules to run: each path's picked version when the run's
// RUN/dipaco-eval.json holds one (early stopping), else the latest.
std::map<std::string, int64_t> scored_versions(const DipacoRun& run, Registry& registry, int64_t path);

// Scores the modules' latest versions (or with early stopping the picked ones). Each of `baselines` (a checkpoint or run folder of a dense
// model on the same dataset) is scored on exactly the same windows. Throws DataError when a module
// has no version, the run is not routed, or a baseline's tokenizer differs.
DipacoEvaluation evaluate_dipaco(const RunConfig& config, const std::vector<std::string>& baselines = {});

// The per-path table (Markdown), with any dense baselines as columns, the paired differences,
// and what it means.
std::string describe(const DipacoEvaluation& evaluation);

// RUN/dipaco-eval.json (and `loco eval --json`): the losses, by path and by document, and the
// comparisons. `version` and `picking_loss` by path with early stopping (scored_versions reads them).
nlohmann::json to_json(const DipacoEvaluation& evaluation);

}  // namespace loco::runtime
