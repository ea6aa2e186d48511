// The registry (registry.h) over sql.h, the same statements on SQLite and PostgreSQL. Tables:
//   loco_schema(version)                                   1 row: the schema's version
//   modules(module, version, file)                         primary key (module, version)
//   reports(module, phase, path, weight, file)             primary key (module, phase, path)
//   run_layout(key, value)                                 "plan", "phases", "reroute_phase", "max_positions"
//   path_modules(path, module)                             the plan: which modules each path has
//   tasks(...)                                             the task queue's (tasks/sql_queue.h)
#include "loco/runtime/dipaco/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "loco/core/files.h"
#include "loco/runtime/store/sql.h"

namespace loco::runtime {
namespace {

constexpr int64_t kSchema = 2;

// The kinds of file the registry names, each in its folder of the run folder.
struct FileKind {
  const char* what;
  const char* folder;  // its first component
  const char* suffix;  // of its last
};
constexpr FileKind kModuleFile{"a module file", "modules", ".safetensors"};
constexpr FileKind kReportFile{"an outer gradient file", "reports", ".safetensors"};
constexpr FileKind kPathFile{"a path's state file", "paths", ".safetensors"};
constexpr FileKind kRoutingFolder{"a routing folder", "routing", ""};

// `file` when it names a file of its kind inside the run folder: relative, in the kind's folder,
// made of plain names (letters, digits, '.', '_', '-'; never "." or ".."). Anyone who can write
// the database (a PostgreSQL registry is shared by every host) could otherwise make workers read
// any file (/dev/zero) or delete one outside the run: names are checked when written and again
// when read. DataError otherwise.
const std::string& checked(const std::string& file, const FileKind& kind, const std::string& where) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t slash = file.find('/', start);
    parts.push_back(file.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  const bool ok = parts.size() >= 2 && parts.size() <= 4 && parts.front() == kind.folder &&
                  std::all_of(parts.begin(), parts.end(), [](const std::string& part) { return plain_file_name(part); }) &&
                  parts.back().ends_with(kind.suffix);
  if (!ok) {
    throw DataError("registry", fmt::format("{}: '{}' is not {} in the run folder ({}/NAME{}); refused: the registry "
                                            "names files inside the run folder only", where, file.substr(0, 200),
                                            kind.what, kind.folder, kind.suffix));
  }
  return file;
}

const FileKind& result_kind(const TaskKey& task) {
  if (task.scope == TaskScope::kRoute) return kRoutingFolder;
  if (task.scope == TaskScope::kModuleStep) return kModuleFile;
  return kPathFile;
}

// A task's result as read back: a path task may have none (no inner state).
std::optional<std::string> checked_result(std::optional<std::string> result, const TaskKey& task, const std::string& where) {
  if (result && !(result->empty() && task.scope == TaskScope::kPath)) checked(*result, result_kind(task), where);
  return result;
}

}  // namespace

Registry::Registry(std::unique_ptr<sql::Connection> connection) : db_(std::move(connection)), queue_(*db_) {
  db_->write([&] {
    db_->query("CREATE TABLE IF NOT EXISTS loco_schema (version BIGINT NOT NULL)");
    auto schema = db_->query("SELECT version FROM loco_schema");
    if (schema.empty()) {
      db_->query("INSERT INTO loco_schema (version) VALUES ($1)", {kSchema});
    } else if (schema.integer(0, 0) != kSchema) {
      throw DataError("registry", fmt::format("{}: registry schema {} is not this version's ({}): another loco wrote it",
                                              db_->where(), schema.integer(0, 0), kSchema));
    }
    db_->query("CREATE TABLE IF NOT EXISTS modules (module TEXT NOT NULL, version BIGINT NOT NULL, file TEXT NOT NULL, "
               "PRIMARY KEY (module, version))");
    db_->query("CREATE TABLE IF NOT EXISTS reports (module TEXT NOT NULL, phase BIGINT NOT NULL, path BIGINT NOT NULL, "
               "weight DOUBLE PRECISION NOT NULL, file TEXT NOT NULL, PRIMARY KEY (module, phase, path))");
    db_->query("CREATE TABLE IF NOT EXISTS run_layout (key TEXT PRIMARY KEY, value TEXT NOT NULL)");
    db_->query("CREATE TABLE IF NOT EXISTS path_modules (path BIGINT NOT NULL, module TEXT NOT NULL, "
               "PRIMARY KEY (path, module))");
    queue_.create_table();
  });
}

Registry::~Registry() = default;

void Registry::publish_module(const std::string& module, int64_t version, const std::string& file) {
  checked(file, kModuleFile, db_->where());
  db_->write([&] {
    auto existing = db_->query("SELECT file FROM modules WHERE module = $1 AND version = $2", {module, version});
    if (!existing.empty()) {
      if (existing.text(0, 0) == file) return;
      throw DataError("registry", fmt::format("{}: module {} version {} is already published as {}, not {}", db_->where(),
                                              module, version, existing.text(0, 0), file));
    }
    db_->query("INSERT INTO modules (module, version, file) VALUES ($1, $2, $3)", {module, version, file});
  });
}

std::optional<int64_t> Registry::latest_version(const std::string& module) {
  auto latest = db_->query("SELECT MAX(version) FROM modules WHERE module = $1", {module});
  if (latest.empty() || latest.is_null(0, 0)) return std::nullopt;
  return latest.integer(0, 0);
}

std::string Registry::module_file(const std::string& module, int64_t version) {
  auto file = db_->query("SELECT file FROM modules WHERE module = $1 AND version = $2", {module, version});
  if (file.empty()) {
    throw DataError("registry", fmt::format("{}: module {} version {} was never published", db_->where(), module, version));
  }
  return checked(file.text(0, 0), kModuleFile, db_->where());
}

void Registry::insert_report(const ModuleReport& report) {
  checked(report.file, kReportFile, db_->where());
  auto existing = db_->query("SELECT 1 FROM reports WHERE module = $1 AND phase = $2 AND path = $3",
                             {report.module, report.phase, report.path});
  if (!existing.empty()) {
    throw DataError("registry", fmt::format("{}: path {} already reported for module {} in phase {}: its work would count "
                                            "twice", db_->where(), report.path, report.module, report.phase));
  }
  db_->query("INSERT INTO reports (module, phase, path, weight, file) VALUES ($1, $2, $3, $4, $5)",
             {report.module, report.phase, report.path, report.weight, report.file});
}

void Registry::record_report(const ModuleReport& report) {
  db_->write([&] { insert_report(report); });
}

std::vector<ModuleReport> Registry::reports(const std::string& module, int64_t phase) {
  auto rows = db_->query("SELECT path, weight, file FROM reports WHERE module = $1 AND phase = $2 ORDER BY path", {module, phase});
  std::vector<ModuleReport> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    out.push_back({module, phase, rows.integer(i, 0), rows.real(i, 1), checked(rows.text(i, 2), kReportFile, db_->where())});
  }
  return out;
}

void Registry::start(const RunLayout& layout) {
  db_->write([&] {
    auto existing = db_->query("SELECT key, value FROM run_layout ORDER BY key");
    if (!existing.empty()) {
      std::map<std::string, std::string> saved;
      for (size_t i = 0; i < existing.size(); ++i) saved[existing.text(i, 0)] = existing.text(i, 1);
      if (saved["plan"] != layout.plan || saved["phases"] != std::to_string(layout.phases) ||
          saved["reroute_phase"] != std::to_string(layout.reroute_phase)) {
        throw DataError("registry", fmt::format("{}: the run was started with plan {}, {} phases and re-routing before phase "
                                                "{}, not plan {}, {} phases and {}: a run's shape cannot change", db_->where(),
                                                saved["plan"], saved["phases"], saved["reroute_phase"], layout.plan,
                                                layout.phases, layout.reroute_phase));
      }
      return;
    }
    if (layout.phases < 1 || layout.path_modules.empty() || layout.reroute_phase < 0 || layout.reroute_phase >= layout.phases) {
      throw DataError("registry", fmt::format("{}: a run needs at least one phase and one path, and re-routes before a phase "
                                              "it has after the first", db_->where()));
    }
    std::set<std::string> modules;
    for (size_t p = 0; p < layout.path_modules.size(); ++p) {
      for (const auto& module : layout.path_modules[p]) {
        db_->query("INSERT INTO path_modules (path, module) VALUES ($1, $2)", {static_cast<int64_t>(p), module});
        modules.insert(module);
      }
    }
    for (const auto& module : modules) {
      if (db_->query("SELECT 1 FROM modules WHERE module = $1 AND version = 0", {module}).empty()) {
        throw DataError("registry", fmt::format("{}: module {} has no version 0: publish every module's initial copy before "
                                                "the run starts", db_->where(), module));
      }
    }
    db_->query("INSERT INTO run_layout (key, value) VALUES ('plan', $1)", {layout.plan});
    db_->query("INSERT INTO run_layout (key, value) VALUES ('phases', $1)", {std::to_string(layout.phases)});
    db_->query("INSERT INTO run_layout (key, value) VALUES ('reroute_phase', $1)", {std::to_string(layout.reroute_phase)});
    if (layout.max_positions > 0) {
      db_->query("INSERT INTO run_layout (key, value) VALUES ('max_positions', $1)", {std::to_string(layout.max_positions)});
    }
    for (size_t p = 0; p < layout.path_modules.size(); ++p) queue_.issue({TaskScope::kPath, static_cast<int64_t>(p), "", 0});
  });
}

std::optional<RunLayout> Registry::layout() {
  auto rows = db_->query("SELECT key, value FROM run_layout");
  if (rows.empty()) return std::nullopt;
  RunLayout layout;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows.text(i, 0) == "plan") layout.plan = rows.text(i, 1);
    if (rows.text(i, 0) == "phases") layout.phases = rows.integer(i, 1);
    if (rows.text(i, 0) == "reroute_phase") layout.reroute_phase = rows.integer(i, 1);
    if (rows.text(i, 0) == "max_positions") layout.max_positions = rows.integer(i, 1);
  }
  auto modules = db_->query("SELECT path, module FROM path_modules ORDER BY path, module");
  for (size_t i = 0; i < modules.size(); ++i) {
    const auto path = static_cast<size_t>(modules.integer(i, 0));
    if (layout.path_modules.size() <= path) layout.path_modules.resize(path + 1);
    layout.path_modules[path].push_back(modules.text(i, 1));
  }
  return layout;
}

std::optional<TaskKey> Registry::lease(const std::string& worker, double now_s, double lease_s, int64_t preferred_path) {
  return db_->write([&] { return queue_.lease(worker, now_s, lease_s, preferred_path); });
}

bool Registry::renew(const TaskKey& task, const std::string& worker, double now_s, double lease_s) {
  return db_->write([&] { return queue_.renew(task, worker, now_s, lease_s); });
}

void Registry::release(const TaskKey& task, const std::string& worker) {
  db_->write([&] { queue_.release(task, worker); });
}

std::optional<std::string> Registry::task_result(const TaskKey& task) {
  return checked_result(queue_.result(task), task, db_->where());
}

std::vector<std::string> Registry::complete_path(const TaskKey& task, const std::string& worker,
                                                 const std::vector<ModuleReport>& reports, const std::string& result,
                                                 double now_s, double deadline_s) {
  LOCO_CHECK(task.scope == TaskScope::kPath, "complete_path of {}", describe(task));
  if (!result.empty()) checked(result, kPathFile, db_->where());
  return db_->write([&] {
    queue_.check_held(task, worker);
    auto modules = db_->query("SELECT module FROM path_modules WHERE path = $1 ORDER BY module", {task.path});
    std::set<std::string> expected, reported;
    for (size_t i = 0; i < modules.size(); ++i) expected.insert(modules.text(i, 0));
    for (const auto& report : reports) {
      if (report.path != task.path || report.phase != task.phase || !reported.insert(report.module).second) {
        throw DataError("registry", fmt::format("{}: {} reports path {} phase {} module {}", db_->where(), describe(task),
                                                report.path, report.phase, report.module));
      }
    }
    if (reported != expected) {
      throw DataError("registry", fmt::format("{}: {} must report each of its {} modules once, got {}", db_->where(),
                                              describe(task), expected.size(), reports.size()));
    }
    std::vector<std::string> late;
    for (const auto& report : reports) {
      // A module whose step of this phase is due, under way or done has closed the phase.
      const TaskKey step{TaskScope::kModuleStep, -1, report.module, task.phase};
      const auto step_state = queue_.state(step);
      if (step_state && *step_state != TaskState::kWaiting) {
        late.push_back(report.module);
        continue;
      }
      insert_report(report);
      auto counts = db_->query("SELECT (SELECT COUNT(*) FROM reports WHERE module = $1 AND phase = $2), "
                               "(SELECT COUNT(*) FROM path_modules WHERE module = $1)", {report.module, task.phase});
      if (counts.integer(0, 0) >= counts.integer(0, 1)) {  // every path reported: the step is due now
        if (!queue_.issue(step)) queue_.move(step, TaskState::kOpen);
      } else if (deadline_s > 0) {  // the first report starts the deadline's clock
        queue_.issue(step, TaskState::kWaiting, now_s + deadline_s);
      }
    }
    queue_.finish(task, result);
    return late;
  });
}

std::optional<std::pair<int64_t, std::string>> Registry::latest_path_result(int64_t path, int64_t phase) {
  auto latest = queue_.latest_result(TaskScope::kPath, path, phase);
  if (latest && !latest->second.empty()) checked(latest->second, kPathFile, db_->where());
  return latest;
}

void Registry::complete_step(const TaskKey& task, const std::string& worker, const std::string& file) {
  LOCO_CHECK(task.scope == TaskScope::kModuleStep, "complete_step of {}", describe(task));
  checked(file, kModuleFile, db_->where());
  db_->write([&] {
    queue_.check_held(task, worker);
    const int64_t version = task.phase + 1;
    auto existing = db_->query("SELECT file FROM modules WHERE module = $1 AND version = $2", {task.module, version});
    if (!existing.empty() && existing.text(0, 0) != file) {
      throw DataError("registry", fmt::format("{}: module {} version {} is already published as {}, not {}", db_->where(),
                                              task.module, version, existing.text(0, 0), file));
    }
    if (existing.empty()) db_->query("INSERT INTO modules (module, version, file) VALUES ($1, $2, $3)", {task.module, version, file});
    queue_.finish(task, file);
    // The paths through this module whose every module is now at `version`. A task of theirs of an
    // earlier phase still under way came too late for every one of its modules (a phase deadline
    // closed them): its work could count nowhere, so it is cancelled.
    auto ready = db_->query("SELECT p.path FROM path_modules p LEFT JOIN (SELECT module, MAX(version) AS v FROM modules "
                            "GROUP BY module) m ON m.module = p.module WHERE p.path IN (SELECT path FROM path_modules "
                            "WHERE module = $1) GROUP BY p.path HAVING MIN(COALESCE(m.v, -1)) >= $2 ORDER BY p.path",
                            {task.module, version});
    for (size_t i = 0; i < ready.size(); ++i) queue_.cancel_before(TaskScope::kPath, ready.integer(i, 0), version);
    auto phases = db_->query("SELECT value FROM run_layout WHERE key = 'phases'");
    if (phases.empty() || version >= phases.integer(0, 0)) return;  // the module's last step
    auto reroute = db_->query("SELECT value FROM run_layout WHERE key = 'reroute_phase'");
    if (!reroute.empty() && reroute.integer(0, 0) == version) {
      // The documents are routed again before this phase, once every module has reached it.
      auto behind = db_->query("SELECT COUNT(*) FROM (SELECT DISTINCT module FROM path_modules) p LEFT JOIN (SELECT module, "
                               "MAX(version) AS v FROM modules GROUP BY module) m ON m.module = p.module WHERE "
                               "COALESCE(m.v, -1) < $1", {version});
      if (behind.integer(0, 0) == 0) queue_.issue({TaskScope::kRoute, -1, "", version});
      return;
    }
    for (size_t i = 0; i < ready.size(); ++i) queue_.issue({TaskScope::kPath, ready.integer(i, 0), "", version});
  });
}

void Registry::complete_route(const TaskKey& task, const std::string& worker, const std::string& folder) {
  LOCO_CHECK(task.scope == TaskScope::kRoute, "complete_route of {}", describe(task));
  checked(folder, kRoutingFolder, db_->where());
  db_->write([&] {
    queue_.check_held(task, worker);
    queue_.finish(task, folder);
    auto paths = db_->query("SELECT DISTINCT path FROM path_modules ORDER BY path");
    for (size_t i = 0; i < paths.size(); ++i) queue_.issue({TaskScope::kPath, paths.integer(i, 0), "", task.phase});
    queue_.cancel_before(TaskScope::kPath, -1, task.phase);  // too late for every module (a phase deadline): see complete_step
  });
}

// (The policy reads the queue's table where it joins with its own.)
bool Registry::version_needed(const std::string& module, int64_t version) {
  return !db_->query("SELECT 1 FROM tasks t JOIN path_modules pm ON pm.path = t.path WHERE t.kind = 'path' AND "
                     "pm.module = $1 AND t.phase <= $2 AND t.state IN ('open', 'leased') LIMIT 1", {module, version})
              .empty();
}

bool Registry::holds(const TaskKey& task, const std::string& worker) { return queue_.holds(task, worker); }

std::vector<TaskRow> Registry::tasks() { return queue_.rows(); }

bool Registry::finished() {
  auto rows = db_->query("SELECT (SELECT value FROM run_layout WHERE key = 'phases'), "
                         "(SELECT COUNT(DISTINCT module) FROM path_modules)");
  if (rows.is_null(0, 0)) return false;
  const int64_t phases = rows.integer(0, 0);
  auto done = db_->query("SELECT COUNT(DISTINCT module) FROM modules WHERE version = $1 AND module IN "
                         "(SELECT module FROM path_modules)", {phases});
  return done.integer(0, 0) == rows.integer(0, 1);
}

std::unique_ptr<Registry> open_sqlite_registry(const std::filesystem::path& file, std::chrono::milliseconds busy_timeout) {
  try {
    return std::make_unique<Registry>(sql::open_sqlite(file, busy_timeout));
  } catch (const DatabaseUnavailable&) {
    throw;  // busy past the timeout: worth another try, not a wrong file
  } catch (const DataError& e) {
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) throw;  // "cannot open the registry": the folder is missing, or unreadable
    // A file that is not a database at all reads as "file is not a database": say what it is for.
    const std::string message = e.what();
    throw DataError("registry", fmt::format("{} (is {} a loco registry? it is RUN/dipaco.sqlite)",
                                            message.substr(message.find(' ') + 1), file.string()));
  }
}

std::unique_ptr<Registry> open_postgres_registry(const std::string& conninfo, std::chrono::milliseconds timeout) {
  return std::make_unique<Registry>(sql::open_postgres(conninfo, timeout));
}

}  // namespace loco::runtime
