// A throwaway PostgreSQL server for tests: initdb in a temporary folder, started on 127.0.0.1 at a
// free port (TCP only: a socket path under a test's long folder name would pass the 107-byte
// limit), password authentication (scram-sha-256) for user
// "loco", stopped and deleted by the destructor. Run as root, the server runs as the "postgres"
// system user (initdb refuses root). Every command is bounded in time.
#pragma once

#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "process_util.h"
#include "test_util.h"

namespace loco::testing_util {

class PostgresServer {
 public:
  static constexpr const char* kPassword = "loco-test-password";

  PostgresServer() {
    const auto bin = server_bin();
    if (bin.empty()) {
      ADD_FAILURE() << "no PostgreSQL server under /usr/lib/postgresql/*/bin (scripts/setup.sh installs Debian's postgresql)";
      return;
    }
    port_ = free_port();
    const auto data = dir_.path() / "data";
    std::ofstream(dir_.path() / "pw") << kPassword << "\n";
    if (::geteuid() == 0) run({"/bin/chown", "-R", "postgres", dir_.path().string()}, "chown");
    ok_ = run(as_server_user({(bin / "initdb").string(), "-D", data.string(), "-U", "loco", "--pwfile",
                              (dir_.path() / "pw").string(), "-A", "scram-sha-256", "--no-sync", "-E", "UTF8"}),
              "initdb") &&
          start(bin);
    bin_ = bin;
  }
  // Crashes the server (pg_ctl stop -m immediate: no shutdown checkpoint, recovery at the next
  // start) and starts it again on the same port. Returns whether it is up again.
  bool crash_and_restart() {
    ok_ = run(as_server_user({(bin_ / "pg_ctl").string(), "-D", (dir_.path() / "data").string(), "-m", "immediate", "-w",
                              "-t", "30", "stop"}),
              "pg_ctl crash") &&
          start(bin_);
    return ok_;
  }
  ~PostgresServer() {
    if (!bin_.empty()) {
      run(as_server_user({(bin_ / "pg_ctl").string(), "-D", (dir_.path() / "data").string(), "-m", "immediate", "-w", "-t",
                          "30", "stop"}),
          "pg_ctl stop");
    }
  }
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  bool ok() const { return ok_; }
  int port() const { return port_; }
  std::string conninfo(const std::string& database = "postgres", const std::string& password = kPassword) const {
    return "host=127.0.0.1 port=" + std::to_string(port_) + " dbname=" + database + " user=loco password=" + password;
  }
  // A new, empty database; returns its connection string.
  std::string fresh_database() {
    static std::atomic<int> counter{0};
    const std::string name = "loco_test_" + std::to_string(counter++);
    PGconn* c = PQconnectdb(conninfo().c_str());
    EXPECT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
    PGresult* r = PQexec(c, ("CREATE DATABASE " + name).c_str());
    EXPECT_EQ(PQresultStatus(r), PGRES_COMMAND_OK) << PQerrorMessage(c);
    PQclear(r);
    PQfinish(c);
    return conninfo(name);
  }

 private:
  bool start(const std::filesystem::path& bin) {
    return run(as_server_user({(bin / "pg_ctl").string(), "-D", (dir_.path() / "data").string(), "-l",
                               (dir_.path() / "server.log").string(), "-w", "-t", "60", "-o",
                               "-h 127.0.0.1 -p " + std::to_string(port_) + " -k '' -c fsync=off", "start"}),
               "pg_ctl start");
  }
  static std::filesystem::path server_bin() {
    std::vector<std::filesystem::path> found;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/usr/lib/postgresql", ec)) {
      if (std::filesystem::exists(e.path() / "bin" / "pg_ctl")) found.push_back(e.path() / "bin");
    }
    std::sort(found.begin(), found.end());
    return found.empty() ? std::filesystem::path() : found.back();
  }
  static int free_port() {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(s, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    socklen_t length = sizeof(address);
    ::getsockname(s, reinterpret_cast<sockaddr*>(&address), &length);
    ::close(s);
    return ntohs(address.sin_port);
  }
  // Root runs the server's commands as "postgres"; anyone else runs them as themselves.
  static std::vector<std::string> as_server_user(std::vector<std::string> argv) {
    if (::geteuid() != 0) return argv;
    argv.insert(argv.begin(), {"/usr/sbin/runuser", "-u", "postgres", "--"});
    return argv;
  }
  bool run(const std::vector<std::string>& argv, const std::string& what) {
    const auto log = (dir_.path() / (what + ".log")).string();
    const auto result = run_command(argv, log, std::chrono::seconds(90));
    EXPECT_EQ(result.status, 0) << what << " failed: " << result.output;
    return result.status == 0;
  }

  TempDir dir_;
  std::filesystem::path bin_;
  int port_ = 0;
  bool ok_ = false;
};

}  // namespace loco::testing_util
