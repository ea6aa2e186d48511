// sql.h over SQLite: one file, WAL journal (a reader never waits for a writer; a crash mid-write
// loses nothing committed), synchronous commits, lock waits bounded by the busy timeout.
#include <fmt/format.h>
#include <sqlite3.h>

#include "loco/core/error.h"
#include "loco/runtime/store/sql.h"

namespace loco::runtime::sql {
namespace {

class SqliteConnection final : public Connection {
 public:
  SqliteConnection(const std::filesystem::path& file, std::chrono::milliseconds busy_timeout) : where_(file.string()) {
    if (sqlite3_open_v2(where_.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK) {
      const std::string message = db_ != nullptr ? sqlite3_errmsg(db_) : "out of memory";
      sqlite3_close(db_);
      throw DataError("registry", fmt::format("{}: cannot open the registry: {}", where_, message));
    }
    sqlite3_busy_timeout(db_, static_cast<int>(busy_timeout.count()));
    try {
      query("PRAGMA journal_mode=WAL");
      query("PRAGMA synchronous=FULL");
    } catch (...) {  // not a database (the registry's opener says what it should be)
      sqlite3_close(db_);
      throw;
    }
  }
  ~SqliteConnection() override { sqlite3_close(db_); }

  Rows run(const std::string& statement, const std::vector<Value>& params) override {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db_, statement.c_str(), -1, &s, nullptr) != SQLITE_OK) fail(statement);
    std::unique_ptr<sqlite3_stmt, decltype(&sqlite3_finalize)> owned(s, &sqlite3_finalize);
    for (size_t i = 0; i < params.size(); ++i) {
      const int index = sqlite3_bind_parameter_index(s, fmt::format("${}", i + 1).c_str());
      if (index == 0) continue;  // not used by this statement
      int rc = SQLITE_OK;
      if (const auto* n = std::get_if<int64_t>(&params[i])) {
        rc = sqlite3_bind_int64(s, index, *n);
      } else if (const auto* x = std::get_if<double>(&params[i])) {
        rc = sqlite3_bind_double(s, index, *x);
      } else {
        const auto& text = std::get<std::string>(params[i]);
        rc = sqlite3_bind_text(s, index, text.c_str(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
      }
      if (rc != SQLITE_OK) fail(statement);
    }
    Rows out;
    for (;;) {
      const int rc = sqlite3_step(s);
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) fail(statement);
      auto& row = out.rows.emplace_back();
      for (int c = 0; c < sqlite3_column_count(s); ++c) {
        const auto* text = sqlite3_column_text(s, c);
        if (text == nullptr) {
          row.emplace_back(std::nullopt);
        } else {
          row.emplace_back(std::string(reinterpret_cast<const char*>(text)));
        }
      }
    }
    return out;
  }

  void begin_write() override { query("BEGIN IMMEDIATE"); }  // the write lock now, bounded by the busy timeout
  void commit() override { query("COMMIT"); }
  void rollback() noexcept override { sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr); }
  const std::string& where() const override { return where_; }

 private:
  [[noreturn]] void fail(const std::string& statement) {
    const int code = sqlite3_errcode(db_) & 0xff;
    if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {  // another process held the lock past the busy timeout
      throw DatabaseUnavailable("registry", fmt::format("{}: {}: {}", where_, statement.substr(0, 80), sqlite3_errmsg(db_)));
    }
    throw DataError("registry", fmt::format("{}: {}: {}", where_, statement.substr(0, 80), sqlite3_errmsg(db_)));
  }
  std::string where_;
  sqlite3* db_ = nullptr;
};

}  // namespace

std::unique_ptr<Connection> open_sqlite(const std::filesystem::path& file, std::chrono::milliseconds busy_timeout) {
  return std::make_unique<SqliteConnection>(file, busy_timeout);
}

}  // namespace loco::runtime::sql
