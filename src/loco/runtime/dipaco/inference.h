// Single-path inference of a DiPaCo run (docs/dipaco.md, "Inference"): the router picks a path for
// a text from the initial model's features of data.route_tokens of its tokens (the first ones, as
// training routes documents; or the latest ones, to re-route as a generation goes on), and only
// that path's modules are loaded (their latest versions, or with dipaco.early_stopping the ones
// scoring picked: evaluation.h scored_versions; each path once).
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "loco/model/sampling.h"
#include "loco/model/transformer_fwd.h"
#include "loco/runtime/config/config.h"

namespace loco::runtime {

struct PathGeneration {
  std::vector<int32_t> tokens;                     // the prompt and what was generated (no final stop token)
  std::vector<std::pair<int64_t, int64_t>> paths;  // (tokens generated before, the path that took over)
};

class PathInference {
 public:
  // Throws DataError when the run is not routed or a module has no version.
  explicit PathInference(const RunConfig& config);
  ~PathInference();
  // The path for `tokens`: by their first data.route_tokens tokens, or with `latest` their last.
  int64_t route(const std::vector<int32_t>& tokens, bool latest = false);
  // Path `path`'s model on `device`, in evaluation mode.
  model::Transformer& model(int64_t path, const torch::Device& device);
  // Continues `prompt` by the path the router picks for it; with `reroute_every` N > 0 the router
  // looks again every N new tokens at the latest ones, and a new path reads the whole text so far
  // (there is no cache to carry over). Each chunk samples with seed + its index.
  PathGeneration generate(std::vector<int32_t> prompt, const model::SampleOptions& sample, int64_t reroute_every,
                          const torch::Device& device);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loco::runtime
