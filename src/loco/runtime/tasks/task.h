// The task: the unit of work of every run (docs/architecture.md, "Tasks"), in one vocabulary that
// every kind of run shares. A task says what a worker trains (its scope), from which version, for
// how long, and what it sends back; a worker leases it, runs it and reports it. The kinds of run
// are policies that decide which tasks to issue and what their results do:
//   - a fixed run (coordinator/fixed_run.h) and an elastic run's rounds (coordinator/membership.h) issue
//     kModel or kFragment tasks into the coordinator's TaskTable (coordinator/tasks.h), kept in memory
//     and leased by the coordinator to the members it chooses;
//   - DiPaCo's phase graph (dipaco/registry.h) issues kPath, kModuleStep and kRoute tasks into a
//     SqlTaskQueue (sql_queue.h) in the run's database, which workers lease from themselves.
// Both backends move a task through the same states, by the transitions below alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "loco/core/error.h"

namespace loco::runtime {

// A task's state. Legal transitions:
//   kOpen    -> kLeased      a worker leases it
//   kLeased  -> kDone        its holder reported it (an elastic round: the round completed)
//   kLeased  -> kOpen        its lease ran out, its holder failed or gave it back: it is issued again
//   kOpen    -> kDone        an elastic round's task whose holder reported, then failed, and whose round
//                            completed with the report
//   kWaiting -> kOpen        DiPaCo: an outer step whose every path reported before its deadline
//   kWaiting -> kLeased      ... or whose deadline passed: it is leased as due, with the reports that came
//   kOpen, kLeased, kWaiting -> kCancelled   superseded (a new plan; a phase that closed without it;
//                                            a run restarted from a checkpoint)
// kDone and kCancelled are final.
enum class TaskState { kOpen, kWaiting, kLeased, kDone, kCancelled };
std::string_view to_string(TaskState state);  // "open", "waiting", "leased", "done", "cancelled"
std::optional<TaskState> parse_task_state(std::string_view text);
bool legal_transition(TaskState from, TaskState to);

// What a task trains or does.
enum class TaskScope {
  kModel,       // every parameter (DDP, DiLoCo)
  kFragment,    // a Streaming DiLoCo fragment
  kPath,        // a DiPaCo path: its modules' inner steps of a phase
  kModuleStep,  // a DiPaCo module's outer step of a phase
  kRoute,       // DiPaCo's re-routing of the documents before a phase
};
std::string_view to_string(TaskScope scope);  // "model", "fragment", "path", "step", "route"
std::optional<TaskScope> parse_task_scope(std::string_view text);

// A task of a queue that workers lease from (DiPaCo's): its scope, which path or module, and the
// phase (for kModuleStep, the version it steps from; for kRoute, the phase it routes before).
struct TaskKey {
  TaskScope scope = TaskScope::kPath;
  int64_t path = -1;   // kPath
  std::string module;  // kModuleStep
  int64_t phase = 0;
  bool operator==(const TaskKey&) const = default;
};
std::string describe(const TaskKey& task);  // "path 2 phase 0", "outer step of L1.M0 phase 3", ...

struct TaskRow {
  TaskKey key;
  TaskState state = TaskState::kOpen;
  std::string holder;      // the worker that leases it or did it
  double lease_until = 0;  // unix seconds (kWaiting: its deadline)
  int64_t leases = 0;      // times leased (more than once: issued again after a lease ran out)
  std::string result;      // a done task's result (a file or folder of the run)
};

// A task this worker no longer holds (its lease ran out and another worker took it, or it is done):
// its result must be dropped.
class LeaseLost : public DataError {
 public:
  using DataError::DataError;
};

}  // namespace loco::runtime
