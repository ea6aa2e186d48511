// The coordinator's task table: the in-memory queue of the dense runs' tasks (the vocabulary and the
// states' legal transitions are tasks/task.h's, shared with DiPaCo's SQL queue; docs/architecture.md,
// "Tasks").
//
// A task says what a worker is to train (the whole model, a fragment, later a DiPaCo path), from
// which global version, on which shard from which data position, for how many steps or seconds,
// and what it sends back. A worker's life is: join, lease a task, run it, report it, repeat. The
// kinds of run are policies over this one table:
//   - a fixed run (FixedRun) issues one task per rank for the whole run (kRun: every
//     synchronization happens inside it, over the run's one group);
//   - an elastic run (MembershipTable) issues, with each round's plan, the next round's task for
//     every shard that has a reader: its owner's, or a vacant slot's dealt to a participant. The
//     round's collective is the report (kRound); the shard's position advances when the round
//     completes. A lease lasts as long as its holder's heartbeats: a holder that fails loses its
//     leases, and its shard's work is issued again, from the same position, at the next plan.
//
// A pure state machine: no I/O, no clock of its own. Not thread-safe (the coordinator's lock).
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loco/runtime/coordinator/protocol.h"

namespace loco::runtime {

struct TaskRecord {
  protocol::Task task;
  TaskState state = TaskState::kOpen;
  int64_t holder = -1;                            // the member leasing it (kLeased, kDone)
  std::optional<std::chrono::steady_clock::time_point> deadline;  // of the lease; none: until reported
  data::SamplerPosition end;                      // kDone: where its shard's reading stopped
  int64_t issued = 1;                             // times it was leased (more than once: reissued)
};

class TaskTable {
 public:
  using Clock = std::chrono::steady_clock;

  // Adds a task (kOpen) and returns its id. An open task of the same shard (its holder failed, or
  // its lease expired) is superseded: the new task is that work issued again, and its lease
  // counts as a reissue.
  int64_t issue(protocol::Task task);
  // Leases an open task to `member` until `deadline` (none: until it is reported).
  void lease(int64_t id, int64_t member, std::optional<Clock::time_point> deadline);
  // The holder is alive: its leases last until `deadline` (a lease taken without one gets it).
  void renew(int64_t member, Clock::time_point deadline);
  // The holder failed or left: its leased tasks are open again. Returns their ids.
  std::vector<int64_t> release(int64_t member);
  // Leases past their deadline become open again. Returns their ids.
  std::vector<int64_t> expire(Clock::time_point now);
  // `member` reports task `id` done, its shard read up to `end`. Throws ProtocolError when the
  // task is not leased to `member` (a hostile or stale report).
  void complete(int64_t id, int64_t member, const data::SamplerPosition& end);
  // The round policy's completion: the task's report was taken (its holder's arrival) and its
  // round completed, so its work is in θ, even if its holder failed since (kOpen -> kDone).
  void record_done(int64_t id, const data::SamplerPosition& end);
  // Cancels task `id` if it is not done (a new plan supersedes it).
  void cancel(int64_t id);
  // Cancels every task of a version below `version` that is not done (its round completed without it).
  void cancel_before(int64_t version);
  // Cancels every task not done (the run restarts from a checkpoint).
  void cancel_pending();
  // Forgets the tasks that are done or cancelled (their effect is applied: the shard positions
  // advanced), so that the table holds only the work under way. Their counts stay in totals().
  void prune();

  const TaskRecord* find(int64_t id) const;
  // The tasks of `version` leased to `member` now, by shard.
  std::map<int64_t, const TaskRecord*> leased_to(int64_t member, int64_t version) const;
  // The task of `shard` and `version` that `member` leases now, if any.
  const TaskRecord* held(int64_t member, int64_t shard, int64_t version) const;
  size_t size() const { return tasks_.size(); }
  // Tasks now in each state, and since the start: issued, leased again after a failure, done.
  std::map<TaskState, int64_t> counts() const;
  struct Totals {
    int64_t issued = 0, reissued = 0, done = 0;
  };
  const Totals& totals() const { return totals_; }

  // The durable part (for RUN/coordinator.json); leases lose their deadlines on load, and the
  // coordinator renews them as the holders' heartbeats come. Throws std::invalid_argument.
  nlohmann::json save() const;
  void load(const nlohmann::json& saved);

 private:
  TaskRecord& at(int64_t id);
  void move(TaskRecord& record, TaskState to);

  std::map<int64_t, TaskRecord> tasks_;
  int64_t next_id_ = 1;
  Totals totals_;
};

}  // namespace loco::runtime
