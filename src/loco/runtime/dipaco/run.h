// A DiPaCo run (docs/dipaco.md): its state is the registry (registry.h: the task queue and the
// module versions, in SQLite or PostgreSQL) and the module files (store/modules.h) in the run
// folder. What every part of the run (a worker, the launcher, evaluation, inference) opens the same
// way lives here: the config resolved against the dataset, the plan of paths and modules, the
// routing's documents per path, a path's model, and the router as it stands.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loco/data/dataset.h"
#include "loco/core/run_folder.h"
#include "loco/model/paths.h"
#include "loco/model/transformer_fwd.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/dipaco/registry.h"

namespace loco::runtime {

// The run's registry: RUN/dipaco.sqlite, or the PostgreSQL server of dipaco.database.
std::unique_ptr<Registry> open_run_registry(const RunConfig& config);

// The phases of a run: ceil(train.steps / sync.inner_steps), the last one shorter when H does not
// divide the steps.
int64_t dipaco_phases(const RunConfig& config);

// Routes the training documents (RUN/routing, as `loco route`) unless they are routed, writes
// version 0 of every module from the initial model, and starts the run in the registry (phase 0's
// path tasks). Idempotent. Prints what it does to `out`. Throws ConfigError/DataError on a config
// or folder that cannot be a DiPaCo run (and DataError when the registry holds another plan).
RunLayout prepare_dipaco_run(const RunConfig& config, std::FILE* out);

// A router: the path of each row of (N, D) document features.
using PathRouter = std::function<std::vector<int64_t>(const torch::Tensor&)>;

class DipacoRun {
 public:
  // The config resolved against its dataset and validated; throws ConfigError/DataError.
  static DipacoRun open(const RunConfig& given);

  const RunConfig& config() const { return config_; }
  const data::Dataset& dataset() const { return dataset_; }
  const model::PathPlan& plan() const { return plan_; }
  const std::filesystem::path& dir() const { return dir_; }
  int64_t phases() const { return phases_; }
  // The most bytes any file of the run's shared folder can hold (a path's parameters, outer
  // gradient or momentum, or its AdamW state, in fp32, with room for the header): a larger one
  // is refused unread (a link to /dev/zero took a path worker to 1.6 GB before; issue #49).
  uint64_t max_file_bytes() const;

  // The training documents of each path, from `routing`/paths.json (RUN/routing: k-means's; a
  // re-routing's folder after it). Throws DataError naming the file when it does not fit the run.
  std::vector<std::vector<int64_t>> path_documents(const std::string& routing = RunFolder::routing_name()) const;

  // The tokens of `documents` of `split`, in order, and the same stream as targets with each
  // document's first data.route_tokens tokens left out: the router read them, so no loss counts
  // them, in training or evaluation (as in the paper).
  struct Stream {
    std::vector<int32_t> tokens, targets;
  };
  Stream stream_of(const data::Split& split, const std::vector<int64_t>& documents) const;

  // A path model with `versions[m]` of each of its modules loaded (and no other module). Returns
  // the bytes read, by module. Throws DataError when a module file does not fit the model.
  std::map<std::string, int64_t> load_path(model::Transformer& model, int64_t path,
                                           const std::map<std::string, int64_t>& versions) const;
  // The version `version` of each module of `path`, or each one's latest published version.
  std::map<std::string, int64_t> versions_of(int64_t path, int64_t version) const;
  std::map<std::string, int64_t> latest_versions(Registry& registry, int64_t path) const;

  // The run's router as it stands: the re-routing's linear router once it ran, else the k-means
  // centres of RUN/routing; checked to route for this plan.
  PathRouter load_router(Registry& registry) const;

 private:
  DipacoRun(RunConfig config, data::Dataset dataset, model::PathPlan plan);
  RunConfig config_;
  data::Dataset dataset_;
  model::PathPlan plan_;
  std::filesystem::path dir_;
  int64_t phases_ = 0;
};

// Small things the run's files need.
int64_t file_bytes(const std::filesystem::path& file);  // 0 when it cannot be read
// Removes the file `relative` (to `run_dir`) the run no longer needs, following no link below
// `run_dir` (remove_file_beneath); one already gone is fine (a duplicate of the task removed it).
void remove_file(const std::filesystem::path& run_dir, const std::filesystem::path& relative);
// A worker's name as a file name's part: letters, digits, '.', '-', '_' (others become '_').
std::string file_safe(const std::string& name);

}  // namespace loco::runtime
