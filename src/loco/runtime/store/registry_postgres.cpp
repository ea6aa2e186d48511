// The registry in PostgreSQL (registry.h), for runs across machines: the same three tables as the
// SQLite file, in the database a connection string names. Every statement runs with a server-side
// statement_timeout and the connection with connect_timeout, so nothing waits unbounded.
#include <fmt/format.h>
#include <libpq-fe.h>

#include <memory>

#include "loco/core/error.h"
#include "loco/runtime/store/registry.h"

namespace loco::runtime {
namespace {

constexpr int64_t kSchema = 1;
constexpr const char* kUniqueViolation = "23505";

using Result = std::unique_ptr<PGresult, decltype(&PQclear)>;

// A connection string with its password left out, for messages.
std::string without_password(const std::string& conninfo) {
  PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), nullptr);
  if (options == nullptr) return "(a malformed connection string)";
  std::string out;
  for (auto* o = options; o->keyword != nullptr; ++o) {
    if (o->val == nullptr || std::string(o->keyword) == "password") continue;
    out += fmt::format("{}{}={}", out.empty() ? "" : " ", o->keyword, o->val);
  }
  PQconninfoFree(options);
  return out;
}

class PostgresRegistry final : public Registry {
 public:
  PostgresRegistry(const std::string& conninfo, std::chrono::milliseconds timeout) : where_(without_password(conninfo)) {
    const std::string seconds = std::to_string(std::max<int64_t>(1, (timeout.count() + 999) / 1000));
    const char* keys[] = {"dbname", "connect_timeout", nullptr};
    const char* values[] = {conninfo.c_str(), seconds.c_str(), nullptr};
    connection_ = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
    if (connection_ == nullptr || PQstatus(connection_) != CONNECTION_OK) {
      const std::string message = connection_ != nullptr ? PQerrorMessage(connection_) : "out of memory";
      PQfinish(connection_);
      throw DataError("registry", fmt::format("PostgreSQL registry ({}): cannot connect: {}", where_, trimmed(message)));
    }
    execute(fmt::format("SET statement_timeout = {}", timeout.count()));
    transaction([&] {
      // Two processes creating the tables at once would race in the catalog: one at a time.
      execute("SELECT pg_advisory_xact_lock(7108091)");
      execute("CREATE TABLE IF NOT EXISTS loco_schema (version BIGINT NOT NULL)");
      execute("CREATE TABLE IF NOT EXISTS modules (module TEXT NOT NULL, version BIGINT NOT NULL, file TEXT NOT NULL, "
              "PRIMARY KEY (module, version))");
      execute("CREATE TABLE IF NOT EXISTS reports (module TEXT NOT NULL, phase BIGINT NOT NULL, path BIGINT NOT NULL, "
              "weight DOUBLE PRECISION NOT NULL, file TEXT NOT NULL, PRIMARY KEY (module, phase, path))");
      auto schema = query("SELECT version FROM loco_schema", {});
      if (PQntuples(schema.get()) == 0) {
        query("INSERT INTO loco_schema (version) VALUES ($1)", {std::to_string(kSchema)});
      } else if (std::stoll(PQgetvalue(schema.get(), 0, 0)) != kSchema) {
        throw DataError("registry", fmt::format("PostgreSQL registry ({}): schema {} is not this version's ({})", where_,
                                                PQgetvalue(schema.get(), 0, 0), kSchema));
      }
    });
  }
  ~PostgresRegistry() override { PQfinish(connection_); }

  void publish_module(const std::string& module, int64_t version, const std::string& file) override {
    transaction([&] {
      auto existing = query("SELECT file FROM modules WHERE module = $1 AND version = $2 FOR UPDATE", {module, std::to_string(version)});
      if (PQntuples(existing.get()) > 0) {
        const std::string held = PQgetvalue(existing.get(), 0, 0);
        if (held == file) return;
        throw DataError("registry", fmt::format("{}: module {} version {} is already published as {}, not {}", where_, module,
                                                version, held, file));
      }
      auto inserted = run("INSERT INTO modules (module, version, file) VALUES ($1, $2, $3)", {module, std::to_string(version), file});
      if (unique_violation(inserted)) {  // another writer published it between our read and write
        throw DataError("registry", fmt::format("{}: module {} version {} was published concurrently", where_, module, version));
      }
      check(inserted, "INSERT INTO modules");
    });
  }

  std::optional<int64_t> latest_version(const std::string& module) override {
    auto latest = query("SELECT MAX(version) FROM modules WHERE module = $1", {module});
    if (PQgetisnull(latest.get(), 0, 0)) return std::nullopt;
    return std::stoll(PQgetvalue(latest.get(), 0, 0));
  }

  std::string module_file(const std::string& module, int64_t version) override {
    auto file = query("SELECT file FROM modules WHERE module = $1 AND version = $2", {module, std::to_string(version)});
    if (PQntuples(file.get()) == 0) {
      throw DataError("registry", fmt::format("{}: module {} version {} was never published", where_, module, version));
    }
    return PQgetvalue(file.get(), 0, 0);
  }

  void record_report(const ModuleReport& report) override {
    auto inserted = run("INSERT INTO reports (module, phase, path, weight, file) VALUES ($1, $2, $3, $4, $5)",
                        {report.module, std::to_string(report.phase), std::to_string(report.path),
                         fmt::format("{:.17g}", report.weight), report.file});
    if (unique_violation(inserted)) {
      throw DataError("registry", fmt::format("{}: path {} already reported for module {} in phase {}: its work would count "
                                              "twice", where_, report.path, report.module, report.phase));
    }
    check(inserted, "INSERT INTO reports");
  }

  std::vector<ModuleReport> reports(const std::string& module, int64_t phase) override {
    auto rows = query("SELECT path, weight, file FROM reports WHERE module = $1 AND phase = $2 ORDER BY path",
                      {module, std::to_string(phase)});
    std::vector<ModuleReport> out;
    for (int i = 0; i < PQntuples(rows.get()); ++i) {
      out.push_back({module, phase, std::stoll(PQgetvalue(rows.get(), i, 0)), std::stod(PQgetvalue(rows.get(), i, 1)),
                     PQgetvalue(rows.get(), i, 2)});
    }
    return out;
  }

 private:
  static std::string trimmed(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }
  Result run(const std::string& sql, const std::vector<std::string>& params) {
    std::vector<const char*> values;
    for (const auto& p : params) values.push_back(p.c_str());
    return Result(PQexecParams(connection_, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(), nullptr,
                               nullptr, 0),
                  &PQclear);
  }
  static bool unique_violation(const Result& result) {
    const char* state = PQresultErrorField(result.get(), PG_DIAG_SQLSTATE);
    return state != nullptr && std::string(state) == kUniqueViolation;
  }
  void check(const Result& result, const std::string& what) {
    const auto status = PQresultStatus(result.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
      throw DataError("registry", fmt::format("PostgreSQL registry ({}): {} failed: {}", where_, what,
                                              trimmed(PQerrorMessage(connection_))));
    }
  }
  Result query(const std::string& sql, const std::vector<std::string>& params) {
    auto result = run(sql, params);
    check(result, sql);
    return result;
  }
  void execute(const std::string& sql) { check(run(sql, {}), sql); }
  template <class F>
  void transaction(F&& body) {
    execute("BEGIN");
    try {
      body();
      execute("COMMIT");
    } catch (...) {
      run("ROLLBACK", {});
      throw;
    }
  }

  std::string where_;
  PGconn* connection_ = nullptr;
};

}  // namespace

std::unique_ptr<Registry> open_postgres_registry(const std::string& conninfo, std::chrono::milliseconds timeout) {
  return std::make_unique<PostgresRegistry>(conninfo, timeout);
}

}  // namespace loco::runtime
