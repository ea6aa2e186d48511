// DiLoCo (Douillard et al. 2023, arXiv 2311.08105, Algorithm 1; ALGORITHMS.md "DiLoCo"):
//
//   every worker m: H inner AdamW steps from θ on its own shard -> θ_m    (the loop does these)
//   Δ_m = θ − θ_m                                          outer gradient, fp32
//   Δ   = Σ_m w_m Δ_m,  w_m = tokens_m / Σ tokens          (or 1/M: sync.weighting = "uniform")
//       = θ − θ̄,  θ̄ = Σ_m w_m θ_m                          what is all-reduced (same bytes)
//   θ   ← OuterOpt(θ, Δ)                                    optim::OuterOptimizer on an fp32 CPU copy
//   θ_m ← θ                                                 every worker continues from the new θ
//
// Each worker's AdamW state is its own: never averaged, never reset. A round ends every H inner
// steps and at the run's last step (a short final round). One collective of two numbers carries
// the weights, then θ̄ travels in buckets; the outer step is elementwise and every worker applies
// it to the same all-reduced θ̄, so θ stays bit-identical across workers (params_hash shows it).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>

#include "loco/algorithms/elastic_rounds.h"
#include "loco/algorithms/flat_buffer.h"
#include "loco/algorithms/membership.h"
#include "loco/algorithms/restored_state.h"
#include "loco/algorithms/sync.h"
#include "loco/optim/outer.h"

namespace loco::algorithms {

enum class Weighting { kTokens, kUniform };

struct DiLoCoOptions {
  int64_t inner_steps = 50;         // H
  double round_seconds = 0;         // > 0: a round ends after this long of inner steps instead (elastic)
  int64_t total_steps = 0;          // the run's inner steps; its last step ends the final round
  optim::OuterOptions outer;
  Weighting weighting = Weighting::kTokens;
  int64_t bucket_bytes = 32 << 20;  // outer-gradient bytes per all-reduce
  void validate() const;            // ConfigError
};

// Elastic (with a Membership): each round runs with the group the coordinator convenes for it.
// With round_seconds, rounds are time-budgeted: each worker trains until its budget is spent, the
// contributors' outer gradients weigh by their tokens, and everyone continues from the round's
// step (the furthest contributor's), so the schedule follows the fastest worker. A
// collective that fails leaves the round's state untouched, and the round is tried again with
// whoever is left (weights renormalize: they come from the all-reduced token counts). A joiner
// takes part in its first round adding nothing, then receives θ, the outer state and the round
// from rank 0, and continues from the round's step.
class DiLoCo final : public SyncStrategy {
 public:
  DiLoCo(comm::Group group, DiLoCoOptions options, Membership* membership = nullptr);
  std::string name() const override { return "diloco"; }

  SyncReports on_start(model::Transformer& model, int64_t step) override;
  SyncReports after_step(StepContext& context) override;
  bool in_sync() const override { return synced_step_ == step_; }
  int64_t bytes_sent() const override { return elastic_.bytes_sent(); }
  std::optional<int64_t> joined_at_step() const override { return elastic_.joined_step(); }
  bool leads() const override { return elastic_.leads(); }

  // "global.<param>" (θ), "outer.<...>" (the outer optimizer's state), and 0-dim int64 tensors
  // "diloco.round", "diloco.synced_step" (inner steps at the last sync) and "diloco.round_tokens".
  // No data positions: those are the runtime's (docs/architecture.md, "Run state").
  NamedTensors state() override;
  void load_state(const NamedTensors& tensors) override;

  // The global parameters θ (fp32, CPU), in the model's parameter order. Valid after on_start.
  const std::vector<torch::Tensor>& global_parameters() const { return global_; }
  // Whether the round ends after `step` steps: every H steps, or (time-budgeted) once
  // round_seconds have passed since it began; and at the run's last step.
  bool round_ends_at(int64_t step) const;

 private:
  SyncReport synchronize(int64_t step);
  SyncReport synchronize_elastic(int64_t step);
  SyncReport join_round();
  // The round's collectives over `group` and, when they succeed, the outer step. A non-contributor
  // adds zeros (and no tokens) and leaves its state alone.
  SyncReport reduce_and_step(comm::Group& group, bool contributes, int64_t step);
  // Rank 0 sends θ, the outer state, the round and its step to every rank (the joiners).
  comm::CommStats transfer_state(comm::Group& group);

  ElasticRounds elastic_;                   // the round's group (elastic: from the Membership)
  int64_t failed_epoch_ = -1;              // a state transfer failed in this epoch (told at the next round)
  DiLoCoOptions options_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> parameters_;  // the live model's (θ_m)
  std::vector<torch::Tensor> global_;      // θ
  std::unique_ptr<optim::OuterOptimizer> outer_;
  std::unique_ptr<FlatBuffer> average_;    // w_m θ_m, then θ̄ = Σ w_m θ_m
  std::optional<RestoredState> restored_;  // load_state's, until on_start applies it
  int64_t round_ = 0, synced_step_ = 0, step_ = 0, round_tokens_ = 0;
  std::chrono::steady_clock::time_point round_start_;  // time-budgeted rounds: when this one began
};

}  // namespace loco::algorithms
