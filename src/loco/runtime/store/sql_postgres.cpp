// sql.h over PostgreSQL, for runs across machines: the connection is bounded by connect_timeout and
// every statement by a server-side statement_timeout, so nothing waits unbounded; messages name
// the server by its connection string without the password.
#include <fmt/format.h>
#include <libpq-fe.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <regex>
#include <vector>

#include "loco/core/error.h"
#include "loco/runtime/store/sql.h"

namespace loco::runtime::sql {
namespace {

constexpr int64_t kWriteLock = 7108091;  // the advisory lock every write transaction holds

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

// The passwords a connection string carries, found without libpq (which cannot parse a malformed
// one): `scheme://user:PASSWORD@...`, `...?password=PASSWORD` (or `&password=`) in a URI, or
// `password=PASSWORD` (quoted or not) among keywords.
std::vector<std::string> passwords_in(const std::string& conninfo) {
  static const std::regex uri(R"(^[A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*:([^@/?#]*)@)");
  static const std::regex parameter(R"([?&]password=([^&#\s]*))");
  static const std::regex keyword(R"((?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s']+))");
  std::vector<std::string> found;
  std::smatch m;
  if (std::regex_search(conninfo, m, uri)) found.push_back(m[1].str());
  for (auto it = std::sregex_iterator(conninfo.begin(), conninfo.end(), parameter); it != std::sregex_iterator(); ++it) {
    found.push_back((*it)[1].str());
  }
  for (auto it = std::sregex_iterator(conninfo.begin(), conninfo.end(), keyword); it != std::sregex_iterator(); ++it) {
    std::string value = (*it)[1].str();
    if (value.size() >= 2 && value.front() == '\'') value = value.substr(1, value.size() - 2);
    found.push_back(value);
  }
  return found;
}

// libpq's message with the connection string and its passwords taken out: it quotes a malformed
// string, or the token it could not read, whole ("invalid percent-encoded token: \"s3cret%zz\"").
std::string scrubbed(std::string message, const std::string& conninfo) {
  auto replace_all = [&](const std::string& what, const std::string& with) {
    if (what.empty()) return;
    for (size_t at = message.find(what); at != std::string::npos; at = message.find(what, at + with.size())) {
      message.replace(at, what.size(), with);
    }
  };
  replace_all(conninfo, "(the connection string)");
  auto passwords = passwords_in(conninfo);  // the longest first: one may hold another
  std::sort(passwords.begin(), passwords.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  for (const auto& password : passwords) {
    if (password.size() < 2) continue;  // a one-character password would turn every such letter into ***
    std::string decoded = password;  // as libpq may quote it after percent-decoding
    for (size_t i = 0; i + 2 < decoded.size(); ++i) {
      if (decoded[i] == '%' && std::isxdigit(static_cast<unsigned char>(decoded[i + 1])) &&
          std::isxdigit(static_cast<unsigned char>(decoded[i + 2]))) {
        decoded.replace(i, 3, 1, static_cast<char>(std::stoi(decoded.substr(i + 1, 2), nullptr, 16)));
      }
    }
    replace_all(password, "***");
    replace_all(decoded, "***");
  }
  return message;
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

class PostgresConnection final : public Connection {
 public:
  PostgresConnection(const std::string& conninfo, std::chrono::milliseconds timeout)
      : where_(fmt::format("PostgreSQL registry ({})", without_password(conninfo))) {
    const std::string seconds = std::to_string(std::max<int64_t>(1, (timeout.count() + 999) / 1000));
    const char* keys[] = {"dbname", "connect_timeout", nullptr};
    const char* values[] = {conninfo.c_str(), seconds.c_str(), nullptr};
    connection_ = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
    if (connection_ == nullptr || PQstatus(connection_) != CONNECTION_OK) {
      const std::string message = scrubbed(connection_ != nullptr ? PQerrorMessage(connection_) : "out of memory", conninfo);
      PQfinish(connection_);
      // A refused login or a missing database will not mend by trying again; a server that is down
      // or restarting may.
      const bool refused = message.find("authentication failed") != std::string::npos ||
                           message.find("no password supplied") != std::string::npos ||
                           message.find("does not exist") != std::string::npos;
      if (refused) throw DataError("registry", fmt::format("{}: cannot connect: {}", where_, trimmed(message)));
      throw DatabaseUnavailable("registry", fmt::format("{}: cannot connect: {}", where_, trimmed(message)));
    }
    try {
      query(fmt::format("SET statement_timeout = {}", timeout.count()));
      query("SET client_min_messages = warning");  // no NOTICE that a table to create exists
    } catch (...) {
      PQfinish(connection_);
      throw;
    }
  }
  ~PostgresConnection() override { PQfinish(connection_); }

  Rows run(const std::string& statement, const std::vector<Value>& params) override {
    std::vector<std::string> texts;
    for (const auto& p : params) {
      if (const auto* n = std::get_if<int64_t>(&p)) {
        texts.push_back(std::to_string(*n));
      } else if (const auto* x = std::get_if<double>(&p)) {
        texts.push_back(fmt::format("{:.17g}", *x));
      } else {
        texts.push_back(std::get<std::string>(p));
      }
    }
    std::vector<const char*> values;
    for (const auto& t : texts) values.push_back(t.c_str());
    Result result(PQexecParams(connection_, statement.c_str(), static_cast<int>(values.size()), nullptr, values.data(),
                               nullptr, nullptr, 0),
                  &PQclear);
    const auto status = PQresultStatus(result.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
      const char* state = PQresultErrorField(result.get(), PG_DIAG_SQLSTATE);
      // A lost connection, a server shutting down or a statement timeout: worth a new connection.
      if (PQstatus(connection_) == CONNECTION_BAD || (state != nullptr && (std::string(state).rfind("57", 0) == 0 ||
                                                                           std::string(state).rfind("08", 0) == 0))) {
        throw DatabaseUnavailable("registry", fmt::format("{}: {}: {}", where_, statement.substr(0, 80),
                                                          trimmed(PQerrorMessage(connection_))));
      }
      throw DataError("registry", fmt::format("{}: {}: {}", where_, statement.substr(0, 80), trimmed(PQerrorMessage(connection_))));
    }
    Rows out;
    for (int r = 0; r < PQntuples(result.get()); ++r) {
      auto& row = out.rows.emplace_back();
      for (int c = 0; c < PQnfields(result.get()); ++c) {
        if (PQgetisnull(result.get(), r, c)) {
          row.emplace_back(std::nullopt);
        } else {
          row.emplace_back(std::string(PQgetvalue(result.get(), r, c)));
        }
      }
    }
    return out;
  }

  void begin_write() override {
    query("BEGIN");
    try {
      query(fmt::format("SELECT pg_advisory_xact_lock({})", kWriteLock));
    } catch (...) {
      rollback();
      throw;
    }
  }
  void commit() override { query("COMMIT"); }
  void rollback() noexcept override { PQclear(PQexec(connection_, "ROLLBACK")); }
  const std::string& where() const override { return where_; }

 private:
  std::string where_;
  PGconn* connection_ = nullptr;
};

}  // namespace

std::unique_ptr<Connection> open_postgres(const std::string& conninfo, std::chrono::milliseconds timeout) {
  return std::make_unique<PostgresConnection>(conninfo, timeout);
}

}  // namespace loco::runtime::sql
