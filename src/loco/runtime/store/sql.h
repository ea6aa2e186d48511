// A database connection, one interface over SQLite and PostgreSQL so that the statements of its
// users (DiPaCo's registry, runtime/dipaco/registry.h) are written once. Statements use $1, $2, ... placeholders and the SQL
// both databases accept (BIGINT, DOUBLE PRECISION, TEXT, INSERT ... ON CONFLICT DO NOTHING).
//
// Writes are serialized: begin_write() takes the database's write lock for the whole transaction
// (SQLite: BEGIN IMMEDIATE; PostgreSQL: a transaction-scoped advisory lock), so that a transaction
// may read, decide and write without another writer between. Every wait is bounded (SQLite's busy
// timeout; PostgreSQL's statement_timeout), then a DataError naming the database.
//
// Not thread-safe: one connection per thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "loco/core/error.h"

namespace loco::runtime {

// The database could not be reached or answered in time (a server down or restarting, a lock held
// past the busy timeout): the same request may succeed on a new connection later.
class DatabaseUnavailable : public DataError {
 public:
  using DataError::DataError;
};

}  // namespace loco::runtime

namespace loco::runtime::sql {

using Value = std::variant<int64_t, double, std::string>;

// The rows of a query; a NULL is nullopt.
struct Rows {
  std::vector<std::vector<std::optional<std::string>>> rows;
  size_t size() const { return rows.size(); }
  bool empty() const { return rows.empty(); }
  bool is_null(size_t row, size_t column) const { return !rows.at(row).at(column).has_value(); }
  const std::string& text(size_t row, size_t column) const;
  int64_t integer(size_t row, size_t column) const;
  double real(size_t row, size_t column) const;
};

class Connection {
 public:
  virtual ~Connection() = default;
  // Runs one statement with `params` bound to $1, $2, ... Throws DataError naming the database.
  Rows query(const std::string& statement, const std::vector<Value>& params = {}) { return run(statement, params); }
  // Opens a transaction holding the write lock until commit() or rollback().
  virtual void begin_write() = 0;
  virtual void commit() = 0;
  virtual void rollback() noexcept = 0;
  // The statement itself, as query() describes.
  virtual Rows run(const std::string& statement, const std::vector<Value>& params) = 0;
  // How messages name the database (a file, or the connection string without its password).
  virtual const std::string& where() const = 0;

  // Runs `body` in a write transaction: committed when it returns, rolled back when it throws.
  template <class F>
  auto write(F&& body) {
    begin_write();
    try {
      if constexpr (std::is_void_v<decltype(body())>) {
        body();
        commit();
      } else {
        auto result = body();
        commit();
        return result;
      }
    } catch (...) {
      rollback();
      throw;
    }
  }
};

// Opens (creating if needed) an SQLite database file in WAL mode with synchronous commits.
std::unique_ptr<Connection> open_sqlite(const std::filesystem::path& file, std::chrono::milliseconds busy_timeout);
// Connects to PostgreSQL; `timeout` bounds the connection and every statement. Messages never show
// the password.
std::unique_ptr<Connection> open_postgres(const std::string& conninfo, std::chrono::milliseconds timeout);

}  // namespace loco::runtime::sql
