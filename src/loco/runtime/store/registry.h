// DiPaCo's registry (docs/dipaco.md, "Where state lives"): which versions of each module exist and
// in which file, and which paths reported which outer gradient for a module in a phase. The module
// files themselves are modules.h's; the registry only points at them, and only after they are
// complete (a file is published after save_module returned).
//
// A real database: SQLite in the run folder by default (RUN/dipaco.sqlite: WAL journal, so a
// reader never waits for a writer and a crash mid-write loses nothing committed). Every operation
// is one transaction, and every wait for a lock is bounded (`busy_timeout`, then a DataError naming
// the file). PostgreSQL, for runs across machines, implements the same interface on a server.
//
// Not thread-safe: one Registry per thread; several processes may open the same file.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace loco::runtime {

struct ModuleReport {
  std::string module;
  int64_t phase = 0;
  int64_t path = 0;
  double weight = 0;  // the path's shard size
  std::string file;   // its outer gradient, relative to the run folder
};

class Registry {
 public:
  virtual ~Registry() = default;

  // Records that `module` has `version`, held by `file` (relative to the run folder). Publishing
  // the same (module, version, file) again does nothing (a retried request); another file for a
  // version already published is refused with DataError (two writers disagree).
  virtual void publish_module(const std::string& module, int64_t version, const std::string& file) = 0;
  // The highest published version of `module`, or nothing when none is.
  virtual std::optional<int64_t> latest_version(const std::string& module) = 0;
  // The file of a published version; DataError naming the module when it was never published.
  virtual std::string module_file(const std::string& module, int64_t version) = 0;

  // Records one path's report for a module's phase. A second report of the same (module, phase,
  // path) is refused with DataError: nothing is trained twice into a module.
  virtual void record_report(const ModuleReport& report) = 0;
  // The reports of a module's phase, by path.
  virtual std::vector<ModuleReport> reports(const std::string& module, int64_t phase) = 0;
};

// Opens (creating if needed) the SQLite registry at `file`. Throws DataError naming the file when it
// is not a loco registry (another database, a corrupt file, a newer schema), or when a lock is not
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
