// The registry in SQLite (registry.h): one file, three tables.
//   loco_schema(version)                             1 row: the schema's version
//   modules(module, version, file)                   primary key (module, version)
//   reports(module, phase, path, weight, file)       primary key (module, phase, path)
#include <fmt/format.h>
#include <sqlite3.h>

#include "loco/core/error.h"
#include "loco/runtime/store/registry.h"

namespace loco::runtime {
namespace {

constexpr int64_t kSchema = 1;

// One prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql, const std::string& where) : db_(db), where_(where) {
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &statement_, nullptr) != SQLITE_OK) fail("prepare");
  }
  ~Statement() { sqlite3_finalize(statement_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind(int index, const std::string& text) {
    check(sqlite3_bind_text(statement_, index, text.c_str(), static_cast<int>(text.size()), SQLITE_TRANSIENT), "bind");
    return *this;
  }
  Statement& bind(int index, int64_t value) {
    check(sqlite3_bind_int64(statement_, index, value), "bind");
    return *this;
  }
  Statement& bind(int index, double value) {
    check(sqlite3_bind_double(statement_, index, value), "bind");
    return *this;
  }
  // True while a row is there; false when done.
  bool step() {
    const int rc = sqlite3_step(statement_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    fail("step");
  }
  bool constraint_failed() {  // step() that reports a uniqueness conflict instead of throwing
    const int rc = sqlite3_step(statement_);
    if (rc == SQLITE_DONE) return false;
    if ((rc & 0xff) == SQLITE_CONSTRAINT) return true;
    fail("step");
  }
  int64_t integer(int column) const { return sqlite3_column_int64(statement_, column); }
  bool is_null(int column) const { return sqlite3_column_type(statement_, column) == SQLITE_NULL; }
  double real(int column) const { return sqlite3_column_double(statement_, column); }
  std::string text(int column) const {
    const auto* p = sqlite3_column_text(statement_, column);
    return p == nullptr ? "" : std::string(reinterpret_cast<const char*>(p));
  }

 private:
  void check(int rc, const char* what) {
    if (rc != SQLITE_OK) fail(what);
  }
  [[noreturn]] void fail(const char* what) {
    throw DataError("registry", fmt::format("{}: {} failed: {}", where_, what, sqlite3_errmsg(db_)));
  }
  sqlite3* db_;
  sqlite3_stmt* statement_ = nullptr;
  std::string where_;
};

class SqliteRegistry final : public Registry {
 public:
  SqliteRegistry(const std::filesystem::path& file, std::chrono::milliseconds busy_timeout) : where_(file.string()) {
    if (sqlite3_open_v2(where_.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK) {
      const std::string message = db_ != nullptr ? sqlite3_errmsg(db_) : "out of memory";
      sqlite3_close(db_);
      throw DataError("registry", fmt::format("{}: cannot open the registry: {}", where_, message));
    }
    sqlite3_busy_timeout(db_, static_cast<int>(busy_timeout.count()));
    try {
      execute("PRAGMA journal_mode=WAL");
      execute("PRAGMA synchronous=FULL");
      execute("BEGIN IMMEDIATE");
      execute("CREATE TABLE IF NOT EXISTS loco_schema (version INTEGER NOT NULL)");
      execute("CREATE TABLE IF NOT EXISTS modules (module TEXT NOT NULL, version INTEGER NOT NULL, file TEXT NOT NULL, "
              "PRIMARY KEY (module, version))");
      execute("CREATE TABLE IF NOT EXISTS reports (module TEXT NOT NULL, phase INTEGER NOT NULL, path INTEGER NOT NULL, "
              "weight REAL NOT NULL, file TEXT NOT NULL, PRIMARY KEY (module, phase, path))");
      Statement schema(db_, "SELECT version FROM loco_schema", where_);
      if (!schema.step()) {
        Statement(db_, "INSERT INTO loco_schema (version) VALUES (?1)", where_).bind(1, kSchema).step();
      } else if (schema.integer(0) != kSchema) {
        throw DataError("registry", fmt::format("{}: registry schema {} is not this version's ({}); a newer loco wrote it?",
                                                where_, schema.integer(0), kSchema));
      }
      execute("COMMIT");
    } catch (const DataError& e) {
      sqlite3_close(db_);
      // A file that is not a database at all reads as "file is not a database": say what it is for.
      throw DataError("registry", fmt::format("{} (is {} a loco registry? it is RUN/dipaco.sqlite)", e.what(), where_));
    }
  }
  ~SqliteRegistry() override { sqlite3_close(db_); }

  void publish_module(const std::string& module, int64_t version, const std::string& file) override {
    transaction([&] {
      Statement existing(db_, "SELECT file FROM modules WHERE module = ?1 AND version = ?2", where_);
      existing.bind(1, module).bind(2, version);
      if (existing.step()) {
        if (existing.text(0) == file) return;
        throw DataError("registry", fmt::format("{}: module {} version {} is already published as {}, not {}", where_, module,
                                                version, existing.text(0), file));
      }
      Statement(db_, "INSERT INTO modules (module, version, file) VALUES (?1, ?2, ?3)", where_)
          .bind(1, module).bind(2, version).bind(3, file).step();
    });
  }

  std::optional<int64_t> latest_version(const std::string& module) override {
    Statement latest(db_, "SELECT MAX(version) FROM modules WHERE module = ?1", where_);
    latest.bind(1, module);
    if (!latest.step() || latest.is_null(0)) return std::nullopt;
    return latest.integer(0);
  }

  std::string module_file(const std::string& module, int64_t version) override {
    Statement file(db_, "SELECT file FROM modules WHERE module = ?1 AND version = ?2", where_);
    file.bind(1, module).bind(2, version);
    if (!file.step()) {
      throw DataError("registry", fmt::format("{}: module {} version {} was never published", where_, module, version));
    }
    return file.text(0);
  }

  void record_report(const ModuleReport& report) override {
    transaction([&] {
      Statement insert(db_, "INSERT INTO reports (module, phase, path, weight, file) VALUES (?1, ?2, ?3, ?4, ?5)", where_);
      insert.bind(1, report.module).bind(2, report.phase).bind(3, report.path).bind(4, report.weight).bind(5, report.file);
      if (insert.constraint_failed()) {
        throw DataError("registry", fmt::format("{}: path {} already reported for module {} in phase {}: its work would count "
                                                "twice", where_, report.path, report.module, report.phase));
      }
    });
  }

  std::vector<ModuleReport> reports(const std::string& module, int64_t phase) override {
    Statement select(db_, "SELECT path, weight, file FROM reports WHERE module = ?1 AND phase = ?2 ORDER BY path", where_);
    select.bind(1, module).bind(2, phase);
    std::vector<ModuleReport> out;
    while (select.step()) out.push_back({module, phase, select.integer(0), select.real(1), select.text(2)});
    return out;
  }

 private:
  void execute(const char* sql) {
    char* error = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &error) != SQLITE_OK) {
      const std::string message = error != nullptr ? error : sqlite3_errmsg(db_);
      sqlite3_free(error);
      throw DataError("registry", fmt::format("{}: {}: {}", where_, sql, message));
    }
  }
  template <class F>
  void transaction(F&& body) {
    execute("BEGIN IMMEDIATE");  // takes the write lock now (bounded by the busy timeout)
    try {
      body();
      execute("COMMIT");
    } catch (...) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
  }

  std::string where_;
  sqlite3* db_ = nullptr;
};

}  // namespace

std::unique_ptr<Registry> open_sqlite_registry(const std::filesystem::path& file, std::chrono::milliseconds busy_timeout) {
  return std::make_unique<SqliteRegistry>(file, busy_timeout);
}

}  // namespace loco::runtime
