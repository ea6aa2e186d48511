// Asynchronous DiLoCo (Liu et al. 2024, arXiv 2401.09135; docs/async.md): no worker waits for
// another. A worker that finishes its inner steps sends its outer gradient Δ = θ_base − θ_local to
// the run's outer state, which applies it at once with delayed Nesterov (optim/delayed_nesterov.h),
// and continues from the θ that comes back. The run's inner steps (train.steps × workers) are
// shared out as they are asked for, and each worker's share of a cycle follows its speed (dynamic
// local updates: H_w = H · v_w / max v, at least 1), so that unequal workers arrive at the same
// pace and the slow one's outer gradients are no staler than the others'.
//
// AsyncOuterServer is the outer state (the coordinator holds one); AsyncDiLoCo is a worker's side,
// reaching it through an OuterServerLink (runtime: the coordinator's /v1/outer).
#pragma once

#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "loco/algorithms/options.h"
#include "loco/algorithms/sync.h"
#include "loco/core/error.h"
#include "loco/optim/delayed_nesterov.h"

namespace loco::algorithms {

// One exchange, from a worker.
struct AsyncPush {
  int64_t worker = 0;
  int64_t base_version = -1;  // the version of θ its cycle started from; -1: its first contact
  int64_t steps = 0;          // inner steps its Δ covers (0: none sent, it asks for θ)
  double seconds = 0;         // their wall time, for its speed
  torch::Tensor values;       // flat fp32: Δ; at first contact its initial θ (adopted when the state has none)
  int64_t cycle = 0;          // the worker's count of its cycles (1 for its first Δ): a retried exchange is not applied twice
  int64_t member = -1;        // elastic runs: the member holding the worker's slot (seat()); -1 in a fixed run
};

// The exchange came from a member whose slot another member holds now (elastic runs): refused.
class SlotTaken : public loco::Error {
 public:
  explicit SlotTaken(std::string_view message) : loco::Error("async", message) {}
};

// The answer.
struct AsyncReply {
  int64_t version = 0;        // θ's: outer gradients applied so far
  int64_t steps_next = 0;     // inner steps of its next cycle; 0: its share is done
  double schedule_step = 0;   // the run's progress in inner steps per worker: where the learning-rate schedule stands
  double schedule_rate = 1;   // schedule steps per inner step of its next cycle
  bool applied = false;       // its Δ was applied
  int64_t staleness = 0;      // versions applied since its base
  std::string rejected;       // why its Δ was left out ("" when applied or none)
  bool finished = false;      // every share is in: θ is the run's final θ
  torch::Tensor theta;        // flat fp32; only with steps to take or once finished (a waiting worker needs none)
};

class AsyncOuterServer {
 public:
  using Clock = std::chrono::steady_clock;
  explicit AsyncOuterServer(AsyncOptions options);

  // Thread-safe. A malformed push (an unknown worker, a size not the model's, more steps than H,
  // a version from the future) throws Error naming what is wrong, and changes nothing; one from a
  // member that no longer holds the slot throws SlotTaken. An outer gradient may wait up to the
  // grace for the others of its batch.
  AsyncReply exchange(const AsyncPush& push, Clock::time_point now);

  // Elastic membership (the coordinator's slots; docs/async.md). A new member takes `worker`'s
  // slot: the cycle its predecessor had under way goes back to the others, and the slot's speed
  // and retry memory start afresh (its first cycle measures its speed); only `member`'s exchanges
  // are taken for the slot from now on.
  void seat(int64_t worker, int64_t member);
  // The slot's member is known to be dead (its process exited): its cycle's steps go back to the
  // others at once rather than after its silence. Returns whether it had a cycle under way.
  bool release(int64_t worker);
  // Whether the slot's member has gone silent past its cycle (as judged at `now`).
  bool silent(int64_t worker, Clock::time_point now);

  // Applies the batch waiting for the others, if any, and makes every later one apply at once: the
  // coordinator's end, so that no request waits on a batch nobody else will complete.
  void close();

  struct Totals {
    int64_t version = 0, applied = 0, rejected = 0, steps_done = 0, budget = 0;
    bool finished = false;
  };
  Totals totals() const;
  // Lines for the coordinator's log since the last call (rejections, workers gone).
  std::vector<std::string> take_notes();

  // What a resumed run continues from: θ, delayed Nesterov's state, the counters and the workers'
  // speeds (empty before the first worker arrived). load_state takes what state() returned, before
  // any exchange; DataError names what does not fit.
  NamedTensors state() const;
  void load_state(const NamedTensors& tensors);

 private:
  struct Member {
    int64_t assigned = 0;               // steps of its cycle under way (0: none)
    double speed = 0;                   // inner steps per second, last measured (0: not yet)
    Clock::time_point since{};          // when its cycle was assigned
    bool gone = false;
    int64_t last_cycle = 0;             // the last cycle it sent a Δ for
    bool last_applied = false;          // ... whether it was applied
    int64_t last_staleness = 0;         // ... at which staleness
    std::string last_rejected;          // ... or why not
    int64_t member = -1;                // who holds the slot (seat(); -1: a fixed run's worker)
  };
  struct Batch {
    struct Entry {
      int64_t worker, base_version, steps;
      torch::Tensor delta;
      int64_t staleness;
    };
    std::vector<Entry> entries;
    Clock::time_point deadline;
    bool closed = false;
  };
  void check(const AsyncPush& push) const;
  std::string left_out(const AsyncPush& push, int64_t staleness, double& scale);
  void apply(Batch& batch);
  int64_t apply_in_batch(std::unique_lock<std::mutex>& lock, const AsyncPush& push, double scale);
  double schedule_rate(const Member& me) const;
  std::string screen(const torch::Tensor& delta, double& scale);
  void release_silent(Clock::time_point now);
  int64_t next_share(int64_t worker, Clock::time_point now);
  double progress(Clock::time_point now) const;
  bool finished_locked() const;

  AsyncOptions options_;
  mutable std::mutex mutex_;
  torch::Tensor theta_;
  std::optional<optim::DelayedNesterov> outer_;
  std::vector<Member> members_;
  std::deque<double> kept_norms_;
  std::shared_ptr<Batch> open_;  // outer gradients waiting for the others of their batch
  bool closing_ = false;         // close(): batches no longer wait
  std::condition_variable batch_closed_;
  int64_t version_ = 0, applied_ = 0, rejected_ = 0, steps_done_ = 0;
  std::vector<std::string> notes_;
};

// How a worker reaches the outer state.
class OuterServerLink {
 public:
  virtual ~OuterServerLink() = default;
  virtual AsyncReply exchange(const AsyncPush& push) = 0;
};

// A worker's side: its model continues from the θ of each reply; its inner steps per cycle and its
// learning rate's place in the schedule come from the reply too.
class AsyncDiLoCo final : public SyncStrategy {
 public:
  // `stop` (may be null): set when the run is stopping; a worker waiting for the others' last
  // outer gradients then stops waiting (RunStopping).
  // `member`: the member id of an elastic run's slot holder (-1 in a fixed run).
  AsyncDiLoCo(std::shared_ptr<OuterServerLink> link, int64_t worker, Poison poison = {}, const std::atomic<bool>* stop = nullptr,
              int64_t member = -1);
  std::string name() const override { return "diloco-async"; }
  SyncReports on_start(model::Transformer& model, int64_t step) override;
  SyncReports after_step(StepContext& context) override;
  bool in_sync() const override { return cycle_steps_ == 0; }
  std::optional<bool> part_done() const override { return done_; }
  std::optional<double> schedule_step(int64_t step) const override;
  int64_t bytes_sent() const override { return bytes_sent_; }

 private:
  AsyncReply exchange(AsyncPush push);
  // Its share done (steps_next 0): asks again until it gets steps or the run's steps are all done.
  AsyncReply wait_for_share(AsyncReply reply);
  void adopt(const AsyncReply& reply, model::Transformer& model, int64_t step);

  std::shared_ptr<OuterServerLink> link_;
  int64_t worker_, member_;
  Poison poison_;
  const std::atomic<bool>* stop_;
  torch::Tensor base_;          // θ its cycle started from (flat fp32)
  int64_t base_version_ = -1;
  int64_t steps_next_ = 0, cycle_steps_ = 0, cycle_start_step_ = 0, cycles_ = 0;
  double schedule_base_ = 0, schedule_rate_ = 1;
  std::chrono::steady_clock::time_point cycle_start_{};
  bool done_ = false;
  int64_t bytes_sent_ = 0;
};

// θ as one flat fp32 tensor, and back into the model's parameters.
torch::Tensor flat_parameters(model::Transformer& model);
void load_flat_parameters(model::Transformer& model, const torch::Tensor& flat);

}  // namespace loco::algorithms
