// DiLoCo (Douillard et al. 2023, arXiv 2311.08105, Algorithm 1; docs/diloco.md):
//
//   every worker m: H inner AdamW steps from θ on its own shard -> θ_m    (the loop does these)
//   Δ_m = θ − θ_m                                          outer gradient, fp32
//   Δ   = Σ_m w_m Δ_m,  w_m = tokens_m / Σ tokens          (or by shard size, or 1/M: sync.weighting)
//       = θ − θ̄,  θ̄ = Σ_m w_m θ_m                          what is all-reduced (same bytes)
//   θ   ← OuterOpt(θ, Δ)                                    optim::OuterOptimizer on an fp32 CPU copy
//   θ_m ← θ                                                 every worker continues from the new θ
//
// DiLoCo is Streaming DiLoCo (streaming.h) with one fragment, no overlap (τ = 0), no merge (α = 0)
// and fp32 outer gradients (or encoded ones: `exchange`), and that is how loco runs it: one strategy, one implementation of the
// rounds, the checkpointed state and the elastic parts. What is DiLoCo's own is time-budgeted
// rounds (round_seconds), and its name in the run's events.
//
// Each worker's AdamW state is its own: never averaged, never reset. A round ends every H inner
// steps and at the run's last step (a short final round). One collective of two numbers carries
// the weights, then θ̄ travels in buckets; the outer step is elementwise and every worker applies
// it to the same all-reduced θ̄, so θ stays bit-identical across workers (params_hash shows it).
//
// Elastic (with a Membership): each round runs with the group the coordinator convenes for it.
// With round_seconds, rounds are time-budgeted: each worker trains until its budget is spent, the
// contributors' outer gradients weigh by their tokens, and everyone continues from the round's
// step (the furthest contributor's). A collective that fails leaves the round's state untouched,
// and the round is tried again with whoever is left (weights renormalize). A joiner takes part in
// its first round adding nothing, then receives θ, the outer state and the round from rank 0.
#pragma once

#include "loco/algorithms/streaming.h"

namespace loco::algorithms {

class DiLoCo final : public StreamingDiLoCo {
 public:
  DiLoCo(comm::Group group, DiLoCoOptions options, Membership* membership = nullptr);

  // Whether the round ends after `step` steps: every H steps, or (time-budgeted) once
  // round_seconds have passed since it began; and at the run's last step.
  bool round_ends_at(int64_t step) const;

 private:
  int64_t total_steps_;
};

}  // namespace loco::algorithms
