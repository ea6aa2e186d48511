// Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512; docs/streaming.md):
// DiLoCo with three changes.
//
// 1. Fragments. The model's parameters are split into P fragments (plan_fragments below); fragment
//    p is synchronized every H inner steps at offset t_p = floor(p·H/P), so only one fragment is on
//    the wire at a time. Each fragment has its own slice of θ and its own outer optimizer.
// 2. Overlap. At fragment p's sync step t its outer reduction starts on a background thread and
//    the worker keeps training; at step t + τ it waits (the stall), then
//        θ̃_p ← OuterOpt(θ_p, Δ_p);   θ_{m,p} ← α·θ_{m,p}(t+τ) + (1 − α)·θ̃_p;   θ_p ← θ̃_p
// 3. Low-precision exchange. With sync.exchange other than fp32, each worker's weighted outer
//    gradient w_m·Δ_m is encoded (comm/encoding.h) and the sum accumulates in fp32
//    (Group::all_reduce_sum with ReduceOptions). With fp32 the workers' weighted parameters
//    Σ w_m θ_m travel instead, exactly as in DiLoCo (algorithms/diloco.h).
//
// τ = 0, α = 0, P = 1 and fp32 is DiLoCo, and this class is loco's one implementation of both:
// algorithms::DiLoCo (diloco.h) is this strategy with those options, plus DiLoCo's time-budgeted
// rounds (round_seconds: a round ends by time, not after H steps; one fragment, no overlap only).
// At the run's last step every fragment synchronizes with τ = 0 and the model takes θ (α is not
// applied), so a finished run's model is θ.
//
// Eager outer updates (Kale et al. 2025, arXiv 2502.12996; docs/streaming.md, "Eager outer updates"), an
// option: a fragment's whole exchange overlaps its next H inner steps. At each of its syncs (step t,
// its r-th), worker m computes its fresh outer gradient Δ_m^r = θ_{m,p} − θ_{m,p}(t), starts the
// all-reduce of w_m·Δ_m^r, and at once waits for the previous one's (started H steps earlier) and
// steps with
//     g_m^r = Σ_k w_k^{r−1}·Δ_k^{r−1} − w_m^{r−1}·Δ_m^{r−1} + w_m^{r−1}·Δ_m^r
// (the others' one-round-stale share plus its own fresh one in place of its stale one; before any
// previous round, the sum is 0 and w = 1/M), then merges as above (τ = 0). The replicas' θ differ by
// their own fresh gradients, so a sync's params_hash is that of the all-reduced sum and the sync's
// place in the schedule, which every worker shares. At the run's last step each fragment waits for its exchange, steps with
// g = Σ_k w_k^{R−1}·Δ_k^{R−1} − w_m^{R−1}·Δ_m^{R−1} + Σ_k w_k^R·Δ_k^R (everything not yet applied), and
// the workers average their θ_p (one fp32 all-reduce), so a finished run's model is one θ again; a
// failure between these two phases is resumed from where it stopped.
// Needs τ = 0, no dropped gradients, fixed (not time-budgeted) rounds and a fixed membership.
//
// Threads: every collective of this strategy runs on its one background thread, in the same order
// on every worker (the schedule is deterministic). The training thread only copies a fragment's
// parameters out when its sync starts and applies the result when it completes.
//
// Elastic (with a Membership; needs τ < H/P, so that one fragment at most is on the wire): each
// fragment's sync is one of the run's rounds. The training thread asks for the round's group when
// the sync starts; when its collective fails, the round is convened again with the survivors and
// the same contribution sent again, and the result waits for that. A joiner takes part in a round
// adding zeros (rank 0 first tells it which fragment), then receives θ, every fragment's outer
// state and the schedule from rank 0 when the round's result is applied, and takes θ as its model.
#pragma once

#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loco/algorithms/elastic_rounds.h"
#include "loco/algorithms/flat_buffer.h"
#include "loco/algorithms/membership.h"
#include "loco/algorithms/options.h"
#include "loco/algorithms/restored_state.h"
#include "loco/algorithms/sync.h"
#include "loco/comm/background.h"
#include "loco/optim/outer.h"

namespace loco::algorithms {

// A piece of a fragment: rows [begin, begin + rows) of dimension 0 of parameter `index` (in the
// model's named_parameters() order); the whole parameter when it has no more rows.
struct FragmentSlice {
  size_t index = 0;
  std::string name;  // the parameter's name, with "[begin:end]" when it is a part of it
  int64_t begin = 0, rows = 0;
};

// Which parameters each fragment holds. Blocks go by `pattern`: strided puts block i in fragment
// i mod P; sequential gives fragment p the p-th run of consecutive blocks (sizes differing by at
// most one). Every other parameter (the token and position embeddings, which the output layer
// shares, and the final norm) is cut along its first dimension into P equal runs of rows, run p
// joining fragment p, so that fragments are about equally large however big the vocabulary is.
// Throws ConfigError when P exceeds the number of blocks.
std::vector<std::vector<FragmentSlice>> plan_fragments(const model::Transformer& model, int64_t fragments,
                                                       FragmentPattern pattern);

class StreamingDiLoCo : public SyncStrategy {
 public:
  // `name`: how the run calls it ("streaming"; DiLoCo passes "diloco").
  StreamingDiLoCo(comm::Group group, StreamingOptions options, Membership* membership = nullptr,
                  std::string name = "streaming");
  ~StreamingDiLoCo() override;
  std::string name() const override { return name_; }

  SyncReports on_start(model::Transformer& model, int64_t step) override;
  SyncReports after_step(StepContext& context) override;
  bool in_sync() const override;
  const std::vector<torch::Tensor>* evaluation_parameters() const override { return &global_; }
  int64_t bytes_sent() const override { return elastic_.bytes_sent(); }
  bool at_boundary() const override;
  std::optional<int64_t> joined_at_step() const override { return elastic_.joined_step(); }
  bool leads() const override { return elastic_.leads(); }

  // "global.<param>" (θ), per fragment p "outer.<p>.<...>" (its outer optimizer), and 0-dim
  // tensors "streaming.step", "streaming.rounds", "streaming.<p>.{round,tokens,started}"; for a
  // fragment whose sync is in flight, either its reduced result ("streaming.<p>.result", when it
  // arrived) or what it sent ("streaming.<p>.sent", when the collective failed, to send again).
  NamedTensors state() override;
  // Also reads the state a DiLoCo wrote before it became this class's one-fragment case
  // ("diloco.round", "diloco.synced_step", "diloco.round_tokens", "outer.<key>").
  void load_state(const NamedTensors& tensors) override;

  // Inner steps (1-based) at which fragment p's sync starts (time-budgeted rounds: once the
  // round's seconds have passed).
  bool starts_at(int64_t fragment, int64_t step) const;
  int64_t fragments() const { return static_cast<int64_t>(fragments_.size()); }

 private:
  struct Reduced {  // what a background reduction returns
    comm::CommStats stats;
    int64_t participants = 0;
    double weight = -1;  // this worker's w_m (-1: not known, e.g. restored from a checkpoint)
    bool empty = false;  // every worker's outer gradient was dropped: θ stays
    int64_t rejected = 0;   // contributions screening left out
    std::string screening;  // who was left out or clipped, and why
  };
  struct Fragment {
    std::vector<FragmentSlice> slices;
    std::vector<torch::Tensor> local, global;  // views of the model's parameters and of θ
    std::unique_ptr<optim::OuterOptimizer> outer;
    std::unique_ptr<FlatBuffer> sent;          // the local values as they were when the sync started (none when τ = 0: keeps_sent)
    std::unique_ptr<FlatBuffer> result;        // θ̄ (fp32) or Δ (encoded exchange), once reduced
    std::unique_ptr<FlatBuffer> step_by;       // eager: the outer gradient g_m it steps with
    int64_t final_phase = 0;                   // eager, the run's end: 1 last exchange due, 2 average due
    double fresh_weight = 0;                   // eager: the weight it applied its own fresh Δ_m with, at its last sync
    int64_t sync_number = 0;                   // eager: the sync whose exchange is in flight (1-based, for sync.poison)
    int64_t offset = 0;                        // t_p
    int64_t round = 0;                         // syncs of this fragment completed
    int64_t tokens = 0;                        // tokens since its last sync started
    int64_t started = 0;                       // inner step its last sync started at
    int64_t exact = 0;                         // inner step the model last took θ_p unmerged
    // In flight: started, not applied.
    bool pending = false;
    int64_t pending_tokens = 0;                // the weight's tokens of the sync in flight
    std::future<Reduced> reduction;
    std::optional<Reduced> arrived;            // its result, once waited for
    std::exception_ptr failure;                // its collective's error, when state() met it first
    double stall = 0;                          // seconds the training thread waited for it
  };

  SyncReports advance(int64_t step);
  // on_start's half for a run resumed from a checkpoint (load_state's).
  SyncReports resume(int64_t step);
  // Whether a sync in flight needs its own copy of the local values: when steps run meanwhile
  // (τ > 0) or eager updates keep Δ_m. With τ = 0 the model is not trained while a sync is in
  // flight, so what it sends is what the model holds, and a model's worth of memory is saved.
  bool keeps_sent() const;
  // Without that copy: the local values into `result`, to send (on the training thread, before
  // each submit, so that a GPU model is read from the thread that trains it).
  void stage(Fragment& fragment);
  void start(Fragment& fragment, int64_t step);
  // Its reduction on the background thread; `tell_joiners`: rank 0 first broadcasts the fragment's
  // index (elastic rounds with joiners).
  std::future<Reduced> submit(Fragment& fragment, bool tell_joiners = false);
  // Whether this worker's outer gradient is dropped from fragment `index`'s current sync.
  bool dropped(size_t index);
  // Elastic: round `round` convened for the sync that starts now, and the group it runs in.
  void begin_round(int64_t round, int64_t step, int64_t failed_epoch, const std::string& failure = "");
  // Whether fragment f still owes the run a sync at its last step (eager: its last exchange or average).
  bool owes_final_sync(const Fragment& f, int64_t step) const;
  // Whether a fragment other than `index` still has a round at `step` (the coordinator ends the
  // training with the round at the last step that has none after it).
  bool rounds_follow(int64_t step, size_t index) const;
  SyncReport join_round();
  // Rank 0's state to the round's joiners (`joiner`: this rank is one, and takes it); the other
  // contributors keep their own (their models hold progress not yet synchronized; eager replicas differ).
  comm::CommStats transfer_state(comm::Group& group, int64_t step, bool joiner);
  // At the end of the current round (plan_), as rank 0 or another contributor: the state to its
  // joiners, if it has any (a joiner failing meanwhile leaves the round standing).
  comm::CommStats state_to_joiners(int64_t step);
  SyncReport complete(size_t index, int64_t step, bool last);
  // Eager updates: fragment `index`'s sync at `step` (its previous exchange waited for, the next
  // started, the eager step taken); at the last step, the final step and the average of θ_p.
  SyncReport eager_sync(size_t index, int64_t step, bool last);
  SyncReport eager_finish(size_t index, int64_t step, comm::CommStats stats, int64_t participants, double weight);
  // The merge (α), the counters and the report of an eager sync.
  SyncReport eager_report(size_t index, int64_t step, double alpha, const comm::CommStats& stats, int64_t participants,
                          double weight, uint64_t hash);
  // Eager updates with elastic membership (streaming_eager.cpp): the open round closed (waited
  // for, reported, its joiners given the state), and a fragment's average at the run's end.
  comm::CommStats close_round(int64_t step, double& stall);
  comm::CommStats average_round(size_t index, int64_t step);
  // An eager report's hash after fragment `index`'s final average (θ_p is then one).
  uint64_t averaged_hash(size_t index) const;
  // Waits for fragment f's exchange in flight (rethrowing its failure); adds the wait to f.stall.
  void await(Fragment& f, size_t index);
  int64_t apply_step(const Fragment& fragment) const;

  ElasticRounds elastic_;                   // the round's group (elastic: from the Membership)
  StreamingOptions options_;
  std::string name_;
  std::chrono::steady_clock::time_point round_start_;  // time-budgeted rounds: when this one began
  std::optional<RoundPlan> plan_;           // elastic: the round of the fragment in flight
  int64_t open_ = -1;                       // eager and elastic: the fragment whose round is open
  // Eager: the hash of this worker's last sync report, shared by every member (their θ differ: it
  // hashes what they share); an elastic round reports it to the coordinator, and joiners take it.
  uint64_t reported_hash_ = 0;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> parameters_;  // the live model's (θ_m)
  std::vector<torch::Tensor> global_;      // θ, fp32 CPU
  std::vector<Fragment> fragments_;
  std::optional<RestoredState> restored_;  // load_state's, until on_start applies it
  int64_t step_ = 0, rounds_ = 0;
  comm::Background background_;  // last: destroyed first, while the members its tasks use exist
};

}  // namespace loco::algorithms
