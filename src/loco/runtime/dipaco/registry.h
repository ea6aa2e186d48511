// DiPaCo's registry (docs/dipaco.md, "Where state lives" and "Training as tasks"): the run's module
// metadata and its phase graph, in a real database. It records which versions of each module exist
// and in which file, and which paths reported which outer gradient for a module in a phase; and it
// is the policy that issues the run's tasks into the database's task queue (tasks/sql_queue.h,
// the vocabulary of tasks/task.h): each phase, one kPath task per path (train it H inner steps
// from its modules' versions of that phase) and, once every path through a module has reported,
// one kModuleStep task to take the module's outer step (and a kRoute task before a re-routed
// phase). The module files themselves are store/modules.h's; the registry only points at them,
// and only after they are complete.
//
// Tasks are leased: a worker holds a task until its lease runs out (it renews it while it works).
// A worker that dies loses only its lease, and its task goes to the next worker that asks. Every
// change that moves the run on is one transaction: a path's reports, its task's completion and the
// step tasks that completion makes due commit together; a module's new version, its step task's
// completion and the path tasks of the next phase that become due commit together. So a worker
// killed at any instant leaves the run consistent, and a restarted database loses nothing.
//
// SQLite in the run folder by default (RUN/dipaco.sqlite); PostgreSQL for runs across machines.
// Not thread-safe: one Registry per thread; several processes may open the same database.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loco/core/error.h"
#include "loco/runtime/store/sql.h"
#include "loco/runtime/tasks/sql_queue.h"
#include "loco/runtime/tasks/task.h"

namespace loco::runtime {

struct ModuleReport {
  std::string module;
  int64_t phase = 0;
  int64_t path = 0;
  double weight = 0;  // the path's shard size
  std::string file;   // its outer gradient, relative to the run folder
};

// The run's shape, given once when the run starts.
struct RunLayout {
  std::string plan;                                   // PathPlan::fingerprint()
  int64_t phases = 0;                                 // outer steps of every module
  std::vector<std::vector<std::string>> path_modules; // per path, its modules
  int64_t reroute_phase = 0;                          // > 0: a route task runs before this phase's path tasks
  // The positions of the model train.init_from named (its max_position_embeddings), which an
  // exported path keeps; 0: none said (the path's context).
  int64_t max_positions = 0;
};

class Registry {
 public:
  explicit Registry(std::unique_ptr<sql::Connection> connection);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Records that `module` has `version`, held by `file` (relative to the run folder). Publishing
  // the same (module, version, file) again does nothing (a retried request); another file for a
  // version already published is refused with DataError (two writers disagree).
  void publish_module(const std::string& module, int64_t version, const std::string& file);
  // The highest published version of `module`, or nothing when none is.
  std::optional<int64_t> latest_version(const std::string& module);
  // The file of a published version; DataError naming the module when it was never published.
  std::string module_file(const std::string& module, int64_t version);

  // Records one path's report for a module's phase. A second report of the same (module, phase,
  // path) is refused with DataError: nothing is trained twice into a module.
  void record_report(const ModuleReport& report);
  // The reports of a module's phase, by path.
  std::vector<ModuleReport> reports(const std::string& module, int64_t phase);

  // Starts the run: records its layout and issues phase 0's path tasks. The modules' version 0
  // must be published first. Doing it again with the same layout does nothing (a resumed launch);
  // another plan or number of phases is refused with DataError.
  void start(const RunLayout& layout);
  // The layout of a started run, or nothing.
  std::optional<RunLayout> layout();

  // Leases the next task to `worker` until now_s + lease_s: step tasks first (they unblock the next
  // phase), then paths by phase, `preferred_path` first (the path whose inner state the worker
  // holds: it keeps its path; -1 for none), then by number; an open task, or one whose lease ran
  // out. Nothing when no task is due now.
  std::optional<TaskKey> lease(const std::string& worker, double now_s, double lease_s, int64_t preferred_path = -1);
  // Gives a held task back (a worker that stops): it is open again at once. Does nothing when
  // `worker` does not hold it.
  void release(const TaskKey& task, const std::string& worker);
  // Extends the lease; false when `worker` no longer holds the task.
  bool renew(const TaskKey& task, const std::string& worker, double now_s, double lease_s);
  // A path task's end: its reports (one per module of the path), the task done, and the step tasks
  // of the modules every path has now reported for, in one transaction. Throws LeaseLost when
  // `worker` does not hold the task.
  // `result` is the file of the path's inner optimizer state after the phase (relative to the run
  // folder), which the path's next task continues from.
  //
  // A phase deadline (`deadline_s` > 0, the worker's dipaco.phase_deadline_s): a module's first
  // report of a phase starts a clock; if every path through the module has not reported by
  // now_s + deadline_s, its outer step becomes due with the reports that arrived. A report for a
  // module whose phase has closed is left out (its path was too late for it); the others count.
  // Returns the modules whose reports were left out.
  std::vector<std::string> complete_path(const TaskKey& task, const std::string& worker,
                                         const std::vector<ModuleReport>& reports, const std::string& result,
                                         double now_s = 0, double deadline_s = 0);
  // The result file of a done task, or nothing.
  std::optional<std::string> task_result(const TaskKey& task);
  // The result of path `path`'s latest done task before `phase` and that task's phase, or nothing
  // (a path whose late task was cancelled continues from its last completed one).
  std::optional<std::pair<int64_t, std::string>> latest_path_result(int64_t path, int64_t phase);
  // A step task's end: the module's version phase + 1 in `file`, the task done, and the next
  // phase's tasks of the paths whose modules are all at that version now, in one transaction.
  // Throws LeaseLost when `worker` does not hold the task.
  void complete_step(const TaskKey& task, const std::string& worker, const std::string& file);
  // A route task's end: the new routing in `folder`, the task done, and every path's task of the
  // phase, in one transaction. Throws LeaseLost when `worker` does not hold the task.
  void complete_route(const TaskKey& task, const std::string& worker, const std::string& folder);

  // Whether a path task not done yet (open or leased) may still read `module` at `version`: one
  // through the module of that phase or an earlier one.
  bool version_needed(const std::string& module, int64_t version);
  // Whether `worker` holds `task` now (a read; nothing changes).
  bool holds(const TaskKey& task, const std::string& worker);

  std::vector<TaskRow> tasks();
  // Every module has taken the run's last outer step.
  bool finished();

 private:
  void insert_report(const ModuleReport& report);
  std::unique_ptr<sql::Connection> db_;
  SqlTaskQueue queue_;  // over db_
};

// Opens (creating if needed) the SQLite registry at `file`. Throws DataError naming the file when it
// is not a loco registry (another database, a corrupt file, another schema), or when a lock is not
// had within `busy_timeout`.
std::unique_ptr<Registry> open_sqlite_registry(const std::filesystem::path& file,
                                               std::chrono::milliseconds busy_timeout = std::chrono::seconds(10));

// Connects to the PostgreSQL registry a connection string names ("host=... port=... dbname=...
// user=... password=..." or "postgresql://..."), creating its tables if needed; `timeout` bounds
// the connection and every statement. Throws DataError for an unreachable server, a wrong
// password or a database that is not a loco registry; messages never show the password.
std::unique_ptr<Registry> open_postgres_registry(const std::string& conninfo,
                                                 std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace loco::runtime
