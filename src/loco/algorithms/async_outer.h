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
  // Streaming DiLoCo's fragments: the Δ of fragment `fragment` only (-1: the whole θ, one fragment).
  // With steps 0 and values, a fragment's flush: the Δ of a worker whose share is done, for the
  // fragments it has not sent since its last steps.
  int64_t fragment = -1;
  std::vector<int64_t> fragment_sizes;  // at first contact, with P > 1: the values' cut into fragments
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
  // Flat fp32; only with steps to take or once finished (a waiting worker needs none): the
  // fragment's values for a fragment's exchange, else the whole θ (every fragment, in order).
  torch::Tensor theta;
  std::vector<int64_t> versions;  // with the whole θ: each fragment's version (`version` is a fragment's for its exchange)
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
  // are taken for the slot from now on. `member` kVacant: nobody's (every slot of an elastic run
  // until its first member; its speed counts for nothing).
  static constexpr int64_t kVacant = -2;
  void seat(int64_t worker, int64_t member);
  // The slot's member is known to be dead (its process exited), or has ended: its cycle's steps go
  // back to the others at once rather than after its silence, and it owes no flush. With `vacate`
  // (elastic runs) the slot is nobody's from now on: the member's later exchanges are refused.
  // Returns whether it had a cycle under way.
  bool release(int64_t worker, bool vacate = false);
  // Whether the slot's member has gone silent past its cycle (as judged at `now`).
  bool silent(int64_t worker, Clock::time_point now);
  // Whether the slot's member has made an exchange yet.
  bool heard(int64_t worker) const;

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
    int64_t unflushed = 0;              // fragments whose Δ it still owes after its share was done
    int64_t last_steps = 0;             // the steps its last counted outer gradient covered
    std::optional<Clock::time_point> heard;  // its last exchange (none yet: not judged between cycles)
    int64_t tenure = 0;                 // changes when the slot is released or changes hands
  };
  struct Batch {
    struct Entry {
      int64_t worker, fragment, base_version, steps;
      torch::Tensor delta;
      int64_t staleness;
    };
    std::vector<Entry> entries;
    Clock::time_point deadline;
    bool closed = false;
  };
  void check(const AsyncPush& push) const;
  // θ starts from a first contact's values, cut into fragments of `sizes` (empty: one).
  void start_state(torch::Tensor theta, std::vector<int64_t> sizes);
  int64_t fragments() const { return static_cast<int64_t>(versions_.size()); }
  std::vector<int64_t> fragment_sizes() const;
  torch::Tensor slice(int64_t fragment) const;
  std::string left_out(const AsyncPush& push, int64_t steps, int64_t staleness, double& scale);
  void apply(Batch& batch);
  int64_t apply_in_batch(std::unique_lock<std::mutex>& lock, const AsyncPush& push, double scale);
  double schedule_rate(const Member& me) const;
  std::string screen(const torch::Tensor& delta, int64_t fragment, double& scale);
  void release_silent(Clock::time_point now);
  // `m` is gone: it holds no cycle (its steps go back to the pool) and owes no flush.
  static void let_go(Member& m) { m.assigned = 0, m.unflushed = 0, m.gone = true; }
  int64_t next_share(int64_t worker, Clock::time_point now);
  double progress(Clock::time_point now) const;
  bool finished_locked() const;

  AsyncOptions options_;
  mutable std::mutex mutex_;
  torch::Tensor theta_;                        // every fragment's values, in order
  std::vector<int64_t> offsets_;               // fragment p is [offsets_[p], offsets_[p + 1]) of theta_
  std::vector<optim::DelayedNesterov> outers_;  // one per fragment, stepping its slice of theta_ in place
  std::vector<int64_t> versions_;              // per fragment: its outer gradients applied
  std::vector<Member> members_;
  std::vector<std::deque<double>> kept_norms_;  // per fragment: the norms of its last kept outer gradients
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
// learning rate's place in the schedule come from the reply too. With Streaming DiLoCo's fragments
// (fragments > 1, plan_fragments), each exchange sends one fragment's Δ, in turn, and takes that
// fragment's θ back; once its share is done it sends the others' too (their flushes), so that the
// run's final θ holds every worker's last steps on every fragment.
struct AsyncWorkerOptions {
  int64_t member = -1;       // the member id of an elastic run's slot holder (-1 in a fixed run)
  int64_t fragments = 1;     // Streaming DiLoCo's P (plan_fragments, by `pattern`)
  FragmentPattern pattern = FragmentPattern::kStrided;
  double merge_alpha = 0;    // a fragment's θ as it comes back: local ← α·local + (1 − α)·θ (sync.merge_alpha)
};

class AsyncDiLoCo final : public SyncStrategy {
 public:
  // `stop` (may be null): set when the run is stopping; a worker waiting for the others' last
  // outer gradients then stops waiting (RunStopping).
  AsyncDiLoCo(std::shared_ptr<OuterServerLink> link, int64_t worker, Poison poison = {}, const std::atomic<bool>* stop = nullptr,
              AsyncWorkerOptions options = {});
  std::string name() const override { return options_.fragments > 1 ? "streaming-async" : "diloco-async"; }
  SyncReports on_start(model::Transformer& model, int64_t step) override;
  SyncReports after_step(StepContext& context) override;
  // At a cycle's end, holding every fragment of one θ (with fragments, only after a whole θ came).
  bool in_sync() const override { return cycle_steps_ == 0 && whole_; }
  std::optional<bool> part_done() const override { return done_; }
  std::optional<double> schedule_step(int64_t step) const override;
  bool joined_under_way() const override { return joined_under_way_; }
  int64_t bytes_sent() const override { return bytes_sent_; }
  // With fragments: every fragment's θ as its last exchange brought it, for evaluation between them.
  const std::vector<torch::Tensor>* evaluation_parameters() const override { return global_.empty() ? nullptr : &global_; }

 private:
  // A fragment's parameters (views of the model's) and the θ its last exchange brought (flat, and
  // with fragments laid out as the model's parameters in `global`, views of global_).
  struct Fragment {
    std::vector<torch::Tensor> views, global;
    torch::Tensor base;
    int64_t base_version = -1;
  };
  torch::Tensor values(size_t fragment) const;  // flat fp32 on the CPU
  // Fragment `fragment` takes `flat` (mixed with its local values by α when `merge`) as its base.
  void load(size_t fragment, const torch::Tensor& flat, bool merge = false);
  AsyncReply exchange(AsyncPush push);
  // Its share done (steps_next 0): asks again until it gets steps or the run's steps are all done.
  AsyncReply wait_for_share(AsyncReply reply);
  // Fragments: the Δ of every fragment but `last`, whose share is done.
  AsyncReply flush(size_t last, AsyncReply reply);
  // The reply's schedule, and its θ: the whole (every fragment) or fragment `fragment`'s.
  void adopt(const AsyncReply& reply, std::optional<size_t> fragment, int64_t step);

  std::shared_ptr<OuterServerLink> link_;
  int64_t worker_;
  Poison poison_;
  const std::atomic<bool>* stop_;
  AsyncWorkerOptions options_;
  std::vector<Fragment> fragments_;
  std::vector<torch::Tensor> global_;  // fragments only: θ in the model's parameter order (CPU fp32)
  size_t next_ = 0;             // the fragment its next exchange sends
  bool whole_ = false;          // the model is one θ (the last reply brought every fragment)
  int64_t steps_next_ = 0, cycle_steps_ = 0, cycle_start_step_ = 0, cycles_ = 0;
  double schedule_base_ = 0, schedule_rate_ = 1;
  std::chrono::steady_clock::time_point cycle_start_{};
  bool done_ = false;
  bool joined_under_way_ = false;  // the first answer's schedule was past the run's start
  int64_t bytes_sent_ = 0;
};

}  // namespace loco::algorithms
