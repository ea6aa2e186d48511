// DiPaCo's outer step of one module (Douillard et al. 2024, arXiv 2403.10616;
// docs/dipaco.md; the structure is model/paths.h). After a phase, every path that went through module m
// reports its outer gradient for m's tensors, Δ_p = θ_m − θ_p (the module's global copy minus what
// path p trained it to), with the size of p's shard as its weight. The module's outer gradient is
// their weighted average rescaled by the square root of how many paths went into it,
//
//     Δ_m = √n · Σ_p w_p Δ_p / Σ_p w_p        over the n paths that reported,
//
// (averaging n nearly independent outer gradients shrinks their norm by about √n; the rescaling
// gives it back; `rescale` = false, dipaco.outer_rescale, leaves the plain weighted average), and
// the module's own outer optimizer (Nesterov, as in DiLoCo) applies it. A
// path-specific module (n = 1) takes its one path's Δ unaveraged. Outer steps of different modules
// are independent: each ModuleState owns its copy, its optimizer state and its version.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loco/algorithms/screening.h"
#include "loco/optim/outer.h"

namespace loco::algorithms {

// One path's report for one module.
struct PathReport {
  int64_t path = 0;
  double weight = 0;                         // > 0: the path's shard size (tokens)
  std::vector<torch::Tensor> outer_gradient;  // Δ_p for each tensor of the module, fp32
};

// Δ_m from the reports of one phase (see above), over the reports screening keeps (options.h,
// Screening: one with a value that is not finite, or a norm more than reject_ratio times the other
// paths' median, is left out and the weights renormalize; clip_norm clips each; n counts the kept
// ones). `screened`, when given, receives what screening made of them. Throws DataError when there
// are none or none is kept, when a path reports twice (nothing may be trained twice into a
// module), or when a weight is not positive and finite or a tensor's shape differs from the first
// report's.
std::vector<torch::Tensor> module_outer_gradient(const std::vector<PathReport>& reports, bool rescale = true,
                                                 const Screening& screening = {}, ScreenedSync* screened = nullptr);

// A module's global copy θ_m (fp32), its outer optimizer and its version: how many outer steps it
// has taken (a path's task names the versions of the modules it starts from).
class ModuleState {
 public:
  ModuleState(std::string name, std::vector<std::string> tensor_names, std::vector<torch::Tensor> parameters,
              optim::OuterOptions outer);

  // One outer step from one phase's reports: θ_m ← OuterOpt(θ_m, Δ_m); the version goes up by one.
  void step(const std::vector<PathReport>& reports, bool rescale = true, const Screening& screening = {},
            ScreenedSync* screened = nullptr);

  // Restores the outer optimizer's state (and so the version) saved with the module.
  void load_optimizer_state(const std::vector<std::pair<std::string, torch::Tensor>>& state) { optimizer_.load_state(state); }

  const std::string& name() const { return name_; }
  int64_t version() const { return optimizer_.steps(); }
  const std::vector<torch::Tensor>& parameters() const { return parameters_; }
  const optim::OuterOptimizer& optimizer() const { return optimizer_; }

 private:
  std::string name_;
  std::vector<torch::Tensor> parameters_;
  optim::OuterOptimizer optimizer_;
};

}  // namespace loco::algorithms
