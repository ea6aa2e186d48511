// DiPaCo's registry, the same suite on SQLite (a file in the run folder) and on a real PostgreSQL
// server (started and stopped by the suite on 127.0.0.1): published versions and reports survive
// a reopen (a restarted coordinator loses nothing), a second report of one path refuses,
// conflicting publications refuse, two connections see each other's commits; and each backend's
// own bad inputs (a file that is not a registry; a wrong password, no server) are named.
#include <gtest/gtest.h>

#include <fstream>

#include "loco/core/error.h"
#include "loco/runtime/store/registry.h"
#include "postgres_server.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

using testing_util::expect_error;
using testing_util::PostgresServer;
using testing_util::TempDir;

class RegistryTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    if (GetParam() == "postgres") {
      if (server_ == nullptr) server_ = new PostgresServer();  // one for the suite, when a test needs it
      ASSERT_TRUE(server_->ok()) << "the throwaway PostgreSQL server did not start";
      conninfo_ = server_->fresh_database();
    }
  }
  // A new connection to this test's registry.
  std::unique_ptr<Registry> open() {
    if (GetParam() == "sqlite") return open_sqlite_registry(dir_.path() / "dipaco.sqlite");
    return open_postgres_registry(conninfo_);
  }

  static PostgresServer* server_;
  TempDir dir_;
  std::string conninfo_;
};
PostgresServer* RegistryTest::server_ = nullptr;

TEST_P(RegistryTest, VersionsAndReportsSurviveAReopen) {
  {
    auto registry = open();
    EXPECT_FALSE(registry->latest_version("L1.M0").has_value());
    registry->publish_module("L1.M0", 0, "modules/L1.M0/v0.safetensors");
    registry->publish_module("L1.M0", 1, "modules/L1.M0/v1.safetensors");
    registry->publish_module("L1.M0", 1, "modules/L1.M0/v1.safetensors");  // a retry: nothing changes
    registry->publish_module("embed", 0, "modules/embed/v0.safetensors");
    registry->record_report({"L1.M0", 1, 3, 1200.0, "reports/p1/L1.M0.3"});
    registry->record_report({"L1.M0", 1, 2, 800.5, "reports/p1/L1.M0.2"});
    registry->record_report({"L1.M0", 2, 2, 800.0, "reports/p2/L1.M0.2"});
  }
  auto registry = open();
  EXPECT_EQ(registry->latest_version("L1.M0"), 1);
  EXPECT_EQ(registry->latest_version("embed"), 0);
  EXPECT_EQ(registry->module_file("L1.M0", 1), "modules/L1.M0/v1.safetensors");
  const auto phase1 = registry->reports("L1.M0", 1);
  ASSERT_EQ(phase1.size(), 2u);
  EXPECT_EQ(phase1[0].path, 2);  // by path
  EXPECT_EQ(phase1[0].weight, 800.5);
  EXPECT_EQ(phase1[1].file, "reports/p1/L1.M0.3");
  EXPECT_EQ(registry->reports("L1.M0", 2).size(), 1u);
  EXPECT_TRUE(registry->reports("L2.M0", 1).empty());
}

TEST_P(RegistryTest, DuplicatesAndConflictsAreRefused) {
  auto registry = open();
  registry->publish_module("L2.M1", 4, "a");
  expect_error<DataError>([&] { registry->publish_module("L2.M1", 4, "b"); }, "module L2.M1 version 4 is already published as a, not b");
  expect_error<DataError>([&] { registry->module_file("L2.M1", 5); }, "module L2.M1 version 5 was never published");
  registry->record_report({"L2.M1", 7, 0, 1.0, "x"});
  expect_error<DataError>([&] { registry->record_report({"L2.M1", 7, 0, 1.0, "y"}); },
                          "path 0 already reported for module L2.M1 in phase 7");
  // The refused writes left nothing behind, and the registry still works.
  EXPECT_EQ(registry->reports("L2.M1", 7).at(0).file, "x");
  EXPECT_EQ(registry->module_file("L2.M1", 4), "a");
  registry->record_report({"L2.M1", 7, 1, 1.0, "z"});
  EXPECT_EQ(registry->reports("L2.M1", 7).size(), 2u);
}

TEST_P(RegistryTest, TwoConnectionsSeeEachOthersCommits) {
  auto a = open();
  auto b = open();
  a->publish_module("embed", 0, "e0");
  EXPECT_EQ(b->latest_version("embed"), 0);
  b->record_report({"embed", 0, 1, 2.0, "r"});
  expect_error<DataError>([&] { a->record_report({"embed", 0, 1, 2.0, "r"}); }, "already reported");
}

INSTANTIATE_TEST_SUITE_P(Backends, RegistryTest, ::testing::Values("sqlite", "postgres"),
                         [](const auto& info) { return info.param; });

TEST(SqliteRegistryTest, FilesThatAreNotARegistryAreNamed) {
  TempDir dir;
  const auto junk = dir.path() / "junk.sqlite";
  std::ofstream(junk) << std::string(4096, 'x');
  expect_error<DataError>([&] { open_sqlite_registry(junk); }, "is " + junk.string() + " a loco registry?");
  expect_error<DataError>([&] { open_sqlite_registry(dir.path() / "no" / "such" / "folder" / "r.sqlite"); }, "cannot open the registry");
}

TEST(PostgresRegistryTest, WrongPasswordAndNoServerAreNamedWithoutThePassword) {
  PostgresServer server;
  ASSERT_TRUE(server.ok());
  try {
    open_postgres_registry(server.conninfo("postgres", "not-the-password"));
    ADD_FAILURE() << "a wrong password connected";
  } catch (const DataError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cannot connect"), std::string::npos) << message;
    EXPECT_NE(message.find("password authentication failed"), std::string::npos) << message;
    EXPECT_EQ(message.find("not-the-password"), std::string::npos) << "the password leaked: " << message;
  }
  // No server at the address (nothing listens on port 1 of loopback): an error, within the timeout.
  const auto start = std::chrono::steady_clock::now();
  expect_error<DataError>([&] { open_postgres_registry("host=127.0.0.1 port=1 dbname=x user=loco", std::chrono::seconds(3)); },
                          "cannot connect");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace loco::runtime
