#include "loco/runtime/tasks/sql_queue.h"

#include <fmt/format.h>

namespace loco::runtime {
namespace {

// The task's primary key as statement parameters $1..$4.
std::vector<sql::Value> key_params(const TaskKey& task) {
  const bool path = task.scope == TaskScope::kPath;
  const bool step = task.scope == TaskScope::kModuleStep;
  return {std::string(to_string(task.scope)), path ? task.path : int64_t{-1}, step ? task.module : std::string(), task.phase};
}

constexpr const char* kKeyMatch = "kind = $1 AND path = $2 AND module = $3 AND phase = $4";

// The first four columns of `rows`' row `row` as a key; DataError for a kind this queue never wrote.
TaskKey key_from(const sql::Rows& rows, size_t row, const std::string& where) {
  const auto scope = parse_task_scope(rows.text(row, 0));
  if (!scope) throw DataError("tasks", fmt::format("{}: a task of unknown kind '{}'", where, rows.text(row, 0).substr(0, 32)));
  return {*scope, rows.integer(row, 1), rows.text(row, 2), rows.integer(row, 3)};
}

TaskState state_from(const std::string& text, const std::string& where) {
  const auto state = parse_task_state(text);
  if (!state) throw DataError("tasks", fmt::format("{}: a task in unknown state '{}'", where, text.substr(0, 32)));
  return *state;
}

std::vector<sql::Value> with(std::vector<sql::Value> params, std::initializer_list<sql::Value> more) {
  params.insert(params.end(), more);
  return params;
}

}  // namespace

void SqlTaskQueue::create_table() {
  db_.query("CREATE TABLE IF NOT EXISTS tasks (kind TEXT NOT NULL, path BIGINT NOT NULL, module TEXT NOT NULL, "
            "phase BIGINT NOT NULL, state TEXT NOT NULL, holder TEXT NOT NULL, lease_until DOUBLE PRECISION NOT NULL, "
            "leases BIGINT NOT NULL, result TEXT NOT NULL DEFAULT '', PRIMARY KEY (kind, path, module, phase))");
}

bool SqlTaskQueue::issue(const TaskKey& task, TaskState state, double until) {
  LOCO_CHECK(state == TaskState::kOpen || state == TaskState::kWaiting, "a task is issued open or waiting, not {}",
             to_string(state));
  if (!db_.query(std::string("SELECT 1 FROM tasks WHERE ") + kKeyMatch, key_params(task)).empty()) return false;
  db_.query("INSERT INTO tasks (kind, path, module, phase, state, holder, lease_until, leases) VALUES ($1, $2, $3, $4, $5, '', "
            "$6, 0)", with(key_params(task), {std::string(to_string(state)), until}));
  return true;
}

std::optional<TaskKey> SqlTaskQueue::lease(const std::string& holder, double now_s, double lease_s, int64_t preferred_path) {
  // 'step' sorts after 'route' and 'path': DESC takes the outer steps first. Of a phase's paths,
  // the preferred one comes first.
  auto due = db_.query("SELECT kind, path, module, phase, state FROM tasks WHERE state = 'open' OR (state IN ('leased', "
                       "'waiting') AND lease_until < $1) ORDER BY kind DESC, phase, CASE WHEN kind = 'path' AND path = $2 "
                       "THEN 0 ELSE 1 END, path, module LIMIT 1", {now_s, preferred_path});
  if (due.empty()) return std::nullopt;
  const auto key = key_from(due, 0, db_.where());
  const auto from = state_from(due.text(0, 4), db_.where());
  // A leased task whose lease ran out is open again first (kLeased -> kOpen -> kLeased).
  LOCO_CHECK(legal_transition(from == TaskState::kLeased ? TaskState::kOpen : from, TaskState::kLeased),
             "task {} cannot be leased from {}", describe(key), to_string(from));
  db_.query(std::string("UPDATE tasks SET state = 'leased', holder = $5, lease_until = $6, leases = leases + 1 WHERE ") +
                kKeyMatch, with(key_params(key), {holder, now_s + lease_s}));
  return key;
}

bool SqlTaskQueue::renew(const TaskKey& task, const std::string& holder, double now_s, double lease_s) {
  if (!holds(task, holder)) return false;
  db_.query(std::string("UPDATE tasks SET lease_until = $6 WHERE ") + kKeyMatch + " AND state = 'leased' AND holder = $5",
            with(key_params(task), {holder, now_s + lease_s}));
  return true;
}

void SqlTaskQueue::release(const TaskKey& task, const std::string& holder) {
  db_.query(std::string("UPDATE tasks SET state = 'open', holder = '', lease_until = 0 WHERE ") + kKeyMatch +
                " AND state = 'leased' AND holder = $5", with(key_params(task), {holder}));
}

bool SqlTaskQueue::holds(const TaskKey& task, const std::string& holder) {
  return !db_.query(std::string("SELECT 1 FROM tasks WHERE ") + kKeyMatch + " AND state = 'leased' AND holder = $5",
                    with(key_params(task), {holder}))
              .empty();
}

void SqlTaskQueue::check_held(const TaskKey& task, const std::string& holder) {
  auto row = db_.query(std::string("SELECT state, holder FROM tasks WHERE ") + kKeyMatch, key_params(task));
  if (row.empty()) throw DataError("tasks", fmt::format("{}: there is no task {}", db_.where(), describe(task)));
  if (row.text(0, 0) != to_string(TaskState::kLeased) || row.text(0, 1) != holder) {
    throw LeaseLost("tasks", fmt::format("{}: {} no longer holds {}: it is {}{} (its lease ran out and another worker took "
                                         "it, or its phase closed without it)", db_.where(), holder, describe(task),
                                         row.text(0, 0), row.text(0, 1).empty() ? "" : " by " + row.text(0, 1)));
  }
}

void SqlTaskQueue::finish(const TaskKey& task, const std::string& result) {
  const auto from = state(task);
  LOCO_CHECK(from && legal_transition(*from, TaskState::kDone), "task {} cannot be done from {}", describe(task),
             from ? to_string(*from) : "nothing");
  db_.query(std::string("UPDATE tasks SET state = 'done', result = $5 WHERE ") + kKeyMatch, with(key_params(task), {result}));
}

void SqlTaskQueue::move(const TaskKey& task, TaskState to) {
  const auto from = state(task);
  LOCO_CHECK(from && legal_transition(*from, to), "task {} cannot go from {} to {}", describe(task),
             from ? to_string(*from) : "nothing", to_string(to));
  db_.query(std::string("UPDATE tasks SET state = $5, lease_until = 0 WHERE ") + kKeyMatch,
            with(key_params(task), {std::string(to_string(to))}));
}

void SqlTaskQueue::cancel_before(TaskScope scope, int64_t path, int64_t phase) {
  const std::string pending = " AND state IN ('open', 'leased', 'waiting')";
  if (path < 0) {
    db_.query("UPDATE tasks SET state = 'cancelled' WHERE kind = $1 AND phase < $2" + pending,
              {std::string(to_string(scope)), phase});
  } else {
    db_.query("UPDATE tasks SET state = 'cancelled' WHERE kind = $1 AND path = $2 AND phase < $3" + pending,
              {std::string(to_string(scope)), path, phase});
  }
}

std::optional<TaskState> SqlTaskQueue::state(const TaskKey& task) {
  auto row = db_.query(std::string("SELECT state FROM tasks WHERE ") + kKeyMatch, key_params(task));
  if (row.empty()) return std::nullopt;
  return state_from(row.text(0, 0), db_.where());
}

std::optional<std::string> SqlTaskQueue::result(const TaskKey& task) {
  auto row = db_.query(std::string("SELECT result FROM tasks WHERE ") + kKeyMatch + " AND state = 'done'", key_params(task));
  if (row.empty()) return std::nullopt;
  return row.text(0, 0);
}

std::optional<std::pair<int64_t, std::string>> SqlTaskQueue::latest_result(TaskScope scope, int64_t path, int64_t phase) {
  auto row = db_.query("SELECT phase, result FROM tasks WHERE kind = $1 AND path = $2 AND phase < $3 AND state = 'done' "
                       "ORDER BY phase DESC LIMIT 1", {std::string(to_string(scope)), path, phase});
  if (row.empty()) return std::nullopt;
  return std::make_pair(row.integer(0, 0), row.text(0, 1));
}

std::vector<TaskRow> SqlTaskQueue::rows() {
  auto rows = db_.query("SELECT kind, path, module, phase, state, holder, lease_until, leases, result FROM tasks "
                        "ORDER BY phase, kind, path, module");
  std::vector<TaskRow> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    out.push_back({key_from(rows, i, db_.where()), state_from(rows.text(i, 4), db_.where()), rows.text(i, 5), rows.real(i, 6),
                   rows.integer(i, 7), rows.text(i, 8)});
  }
  return out;
}

}  // namespace loco::runtime
