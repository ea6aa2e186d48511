// The SQL backend of a queue that workers lease tasks from (task.h): one table, `tasks`, in a
// database several processes share (SQLite in the run folder, or PostgreSQL; store/sql.h). A policy
// (DiPaCo's phase graph, dipaco/registry.h) issues tasks and moves them on; workers lease, renew,
// give back and finish them. Every change goes through a legal transition of task.h.
//
// The queue opens no transaction of its own: its caller runs each call, or several calls with its
// own statements, inside one write transaction (sql::Connection::write), so that a task's end and
// what it makes due commit together. Not thread-safe (the connection's rule).
//
// Table: tasks(kind, path, module, phase, state, holder, lease_until, leases, result), primary key
// (kind, path, module, phase); kind is the scope's name, a path task has module '', others path -1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loco/runtime/store/sql.h"
#include "loco/runtime/tasks/task.h"

namespace loco::runtime {

class SqlTaskQueue {
 public:
  // `db` must outlive the queue.
  explicit SqlTaskQueue(sql::Connection& db) : db_(db) {}

  // Creates the table when the database has none.
  void create_table();

  // Adds `task` in `state` (kOpen, or kWaiting until `until`) unless it exists. Returns whether it
  // was added.
  bool issue(const TaskKey& task, TaskState state = TaskState::kOpen, double until = 0);
  // Leases the next due task to `holder` until now_s + lease_s: an open one, or a leased or waiting
  // one whose time ran out, outer steps first (they unblock the next phase), then by phase, path
  // `preferred_path` before the others (-1: none), path, module. Nothing when no task is due.
  std::optional<TaskKey> lease(const std::string& holder, double now_s, double lease_s, int64_t preferred_path = -1);
  // Extends `holder`'s lease; false when it no longer holds the task.
  bool renew(const TaskKey& task, const std::string& holder, double now_s, double lease_s);
  // Gives a held task back: open again at once. Does nothing when `holder` does not hold it.
  void release(const TaskKey& task, const std::string& holder);
  bool holds(const TaskKey& task, const std::string& holder);
  // Throws LeaseLost (naming its state and holder) unless `holder` leases `task` now; DataError
  // when there is no such task.
  void check_held(const TaskKey& task, const std::string& holder);
  // The held task is done, with its result.
  void finish(const TaskKey& task, const std::string& result);
  // Moves an existing task to `to` (kOpen: due now); an illegal transition is a bug.
  void move(const TaskKey& task, TaskState to);
  // Cancels the open or leased tasks of `scope` (and `path`, unless -1) of a phase before `phase`.
  void cancel_before(TaskScope scope, int64_t path, int64_t phase);

  std::optional<TaskState> state(const TaskKey& task);
  // The result of a done task, or nothing.
  std::optional<std::string> result(const TaskKey& task);
  // The latest done task of `scope` and `path` before `phase`: its phase and result.
  std::optional<std::pair<int64_t, std::string>> latest_result(TaskScope scope, int64_t path, int64_t phase);
  std::vector<TaskRow> rows();

 private:
  sql::Connection& db_;
};

}  // namespace loco::runtime
