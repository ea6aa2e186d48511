// DiPaCo's registry, the same suite on SQLite (a file in the run folder) and on a real PostgreSQL
// server (started and stopped by the suite on 127.0.0.1): published versions and reports survive
// a reopen (a restarted coordinator loses nothing), a second report of one path refuses,
// conflicting publications refuse, two connections see each other's commits; and each backend's
// own bad inputs (a file that is not a registry; a wrong password, no server) are named.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <fstream>
#include <set>

#include "loco/core/error.h"
#include "loco/runtime/dipaco/registry.h"
#include "loco/runtime/store/sql.h"
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
  // A plain connection to the same database: what anyone who can write it could do.
  std::unique_ptr<sql::Connection> raw() {
    if (GetParam() == "sqlite") return sql::open_sqlite(dir_.path() / "dipaco.sqlite", std::chrono::seconds(10));
    return sql::open_postgres(conninfo_, std::chrono::seconds(10));
  }
  // Another, empty registry on the same backend.
  std::unique_ptr<Registry> open_other() {
    if (GetParam() == "sqlite") return open_sqlite_registry(dir_.path() / "other.sqlite");
    return open_postgres_registry(server_->fresh_database());
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
    registry->record_report({"L1.M0", 1, 3, 1200.0, "reports/p1/L1.M0.3.safetensors"});
    registry->record_report({"L1.M0", 1, 2, 800.5, "reports/p1/L1.M0.2.safetensors"});
    registry->record_report({"L1.M0", 2, 2, 800.0, "reports/p2/L1.M0.2.safetensors"});
  }
  auto registry = open();
  EXPECT_EQ(registry->latest_version("L1.M0"), 1);
  EXPECT_EQ(registry->latest_version("embed"), 0);
  EXPECT_EQ(registry->module_file("L1.M0", 1), "modules/L1.M0/v1.safetensors");
  const auto phase1 = registry->reports("L1.M0", 1);
  ASSERT_EQ(phase1.size(), 2u);
  EXPECT_EQ(phase1[0].path, 2);  // by path
  EXPECT_EQ(phase1[0].weight, 800.5);
  EXPECT_EQ(phase1[1].file, "reports/p1/L1.M0.3.safetensors");
  EXPECT_EQ(registry->reports("L1.M0", 2).size(), 1u);
  EXPECT_TRUE(registry->reports("L2.M0", 1).empty());
}

TEST_P(RegistryTest, DuplicatesAndConflictsAreRefused) {
  auto registry = open();
  registry->publish_module("L2.M1", 4, "modules/L2.M1/a.safetensors");
  expect_error<DataError>([&] { registry->publish_module("L2.M1", 4, "modules/L2.M1/b.safetensors"); },
                          "module L2.M1 version 4 is already published as modules/L2.M1/a.safetensors, not modules/L2.M1/b.safetensors");
  expect_error<DataError>([&] { registry->module_file("L2.M1", 5); }, "module L2.M1 version 5 was never published");
  registry->record_report({"L2.M1", 7, 0, 1.0, "reports/x.safetensors"});
  expect_error<DataError>([&] { registry->record_report({"L2.M1", 7, 0, 1.0, "reports/y.safetensors"}); },
                          "path 0 already reported for module L2.M1 in phase 7");
  // The refused writes left nothing behind, and the registry still works.
  EXPECT_EQ(registry->reports("L2.M1", 7).at(0).file, "reports/x.safetensors");
  EXPECT_EQ(registry->module_file("L2.M1", 4), "modules/L2.M1/a.safetensors");
  registry->record_report({"L2.M1", 7, 1, 1.0, "reports/z.safetensors"});
  EXPECT_EQ(registry->reports("L2.M1", 7).size(), 2u);
}

// Whoever can write the database could name any file for workers to read or delete: the registry
// takes and gives out only names inside the run folder's own folders.
TEST_P(RegistryTest, FileNamesOutsideTheRunFolderAreRefused) {
  auto registry = open();
  for (const std::string bad : {"/dev/zero", "../outside.safetensors", "modules/../../x.safetensors", "modules/m/v0",
                                "reports/m/v0.safetensors", "modules//v0.safetensors", "modules/m/./v0.safetensors",
                                "modules/m/v 0.safetensors", "modules", ""}) {
    expect_error<DataError>([&] { registry->publish_module("m", 0, bad); }, "is not a module file in the run folder");
  }
  expect_error<DataError>([&] { registry->record_report({"m", 0, 0, 1.0, "/etc/passwd"}); },
                          "'/etc/passwd' is not an outer gradient file in the run folder (reports/NAME.safetensors)");
  EXPECT_FALSE(registry->latest_version("m").has_value()) << "nothing was written";
  registry->publish_module("m", 0, "modules/m/v0.safetensors");
  registry->record_report({"m", 0, 0, 1.0, "reports/m/phase0/P0-w.safetensors"});
  // Rows rewritten behind the registry's back are refused when read.
  auto sql = raw();
  sql->query("UPDATE modules SET file = '/dev/zero'");
  sql->query("UPDATE reports SET file = 'reports/../../../home/someone/model.safetensors'");
  expect_error<DataError>([&] { registry->module_file("m", 0); }, "'/dev/zero' is not a module file");
  expect_error<DataError>([&] { registry->reports("m", 0); }, "is not an outer gradient file");
}

TEST_P(RegistryTest, TwoConnectionsSeeEachOthersCommits) {
  auto a = open();
  auto b = open();
  a->publish_module("embed", 0, "modules/embed/v0.safetensors");
  EXPECT_EQ(b->latest_version("embed"), 0);
  b->record_report({"embed", 0, 1, 2.0, "reports/r.safetensors"});
  expect_error<DataError>([&] { a->record_report({"embed", 0, 1, 2.0, "reports/r.safetensors"}); }, "already reported");
}

// The 2x2 example's layout: a shared embed, level 1's modules (paths 0, 1 | 2, 3) and level 2's
// (paths 0, 2 | 1, 3).
RunLayout two_by_two(int64_t phases) {
  return {"plan-2x2", phases,
          {{"L1.M0", "L2.M0", "embed"}, {"L1.M0", "L2.M1", "embed"}, {"L1.M1", "L2.M0", "embed"}, {"L1.M1", "L2.M1", "embed"}}};
}

std::vector<ModuleReport> path_reports(const RunLayout& layout, int64_t path, int64_t phase) {
  std::vector<ModuleReport> out;
  for (const auto& m : layout.path_modules.at(static_cast<size_t>(path))) {
    out.push_back({m, phase, path, 100.0 + static_cast<double>(path), fmt::format("reports/{}/phase{}/P{}.safetensors", m, phase, path)});
  }
  return out;
}

void publish_initial(Registry& registry) {
  for (const char* m : {"embed", "L1.M0", "L1.M1", "L2.M0", "L2.M1"}) registry.publish_module(m, 0, fmt::format("modules/{}/v0.safetensors", m));
}

TEST_P(RegistryTest, TasksMoveTheRunPhaseByPhase) {
  auto registry = open();
  const auto layout = two_by_two(2);
  expect_error<DataError>([&] { registry->start(layout); }, "has no version 0");
  EXPECT_FALSE(registry->layout().has_value());  // the refused start left nothing
  publish_initial(*registry);
  registry->start(layout);
  registry->start(layout);  // a resumed launch: nothing changes
  expect_error<DataError>([&] { registry->start(two_by_two(3)); }, "a run's shape cannot change");
  EXPECT_EQ(registry->layout()->path_modules, layout.path_modules);
  EXPECT_FALSE(registry->finished());

  // Phase 0: one task per path, by path.
  for (int64_t p = 0; p < 4; ++p) {
    auto task = registry->lease(fmt::format("w{}", p % 2), 1000.0, 60.0);
    ASSERT_TRUE(task.has_value());
    EXPECT_EQ(*task, (TaskKey{TaskScope::kPath, p, "", 0}));
  }
  EXPECT_FALSE(registry->lease("w0", 1000.0, 60.0).has_value());  // nothing else is due
  EXPECT_TRUE(registry->holds({TaskScope::kPath, 0, "", 0}, "w0"));
  EXPECT_FALSE(registry->holds({TaskScope::kPath, 0, "", 0}, "w1"));
  EXPECT_TRUE(registry->version_needed("L1.M0", 0)) << "paths 0 and 1 of phase 0 read it";
  EXPECT_TRUE(registry->renew({TaskScope::kPath, 0, "", 0}, "w0", 1010.0, 60.0));
  EXPECT_FALSE(registry->renew({TaskScope::kPath, 0, "", 0}, "w1", 1010.0, 60.0));  // not its task
  expect_error<LeaseLost>([&] { registry->complete_path({TaskScope::kPath, 0, "", 0}, "w1", path_reports(layout, 0, 0), "paths/P/inner.safetensors"); },
                          "w1 no longer holds path 0 phase 0");
  // A report that leaves out a module is refused whole.
  auto partial = path_reports(layout, 0, 0);
  partial.pop_back();
  expect_error<DataError>([&] { registry->complete_path({TaskScope::kPath, 0, "", 0}, "w0", partial, "paths/P/inner.safetensors"); }, "must report each");
  EXPECT_TRUE(registry->reports("L1.M0", 0).empty());

  registry->complete_path({TaskScope::kPath, 0, "", 0}, "w0", path_reports(layout, 0, 0), "paths/P/inner.safetensors");
  registry->complete_path({TaskScope::kPath, 1, "", 0}, "w1", path_reports(layout, 1, 0), "paths/P/inner.safetensors");
  // L1.M0 has both of its paths' reports: its outer step is due; embed waits for all four.
  auto step = registry->lease("w0", 1020.0, 60.0);
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(*step, (TaskKey{TaskScope::kModuleStep, -1, "L1.M0", 0}));
  EXPECT_FALSE(registry->lease("w1", 1020.0, 60.0).has_value());

  // Path 2's lease runs out (its worker died): the next worker to ask takes it again.
  auto again = registry->lease("w9", 1070.0, 60.0);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, (TaskKey{TaskScope::kPath, 2, "", 0}));
  auto path3 = registry->lease("w1", 1070.0, 60.0);  // path 3's lease ran out too
  ASSERT_TRUE(path3.has_value());
  EXPECT_EQ(*path3, (TaskKey{TaskScope::kPath, 3, "", 0}));
  expect_error<LeaseLost>([&] { registry->complete_path(*again, "w0", path_reports(layout, 2, 0), "paths/P/inner.safetensors"); }, "its lease ran out");
  registry->complete_path(*again, "w9", path_reports(layout, 2, 0), "paths/P/inner.safetensors");
  for (const auto& row : registry->tasks()) {
    if (row.key == *again) EXPECT_EQ(row.leases, 2);
  }
  registry->complete_path(*path3, "w1", path_reports(layout, 3, 0), "paths/P/inner.safetensors");

  // Every module's step of phase 0; a path's next task is issued once all its modules are at v1.
  registry->complete_step(*step, "w0", "modules/L1.M0/v1.safetensors");
  std::set<std::string> stepped = {"L1.M0"};
  std::vector<TaskKey> phase1;
  while (auto task = registry->lease("w0", 1080.0, 60.0)) {
    if (task->scope == TaskScope::kPath) {
      phase1.push_back(*task);
      // Only paths whose modules have all stepped.
      for (const auto& m : layout.path_modules[static_cast<size_t>(task->path)]) EXPECT_TRUE(stepped.count(m)) << m;
      continue;
    }
    EXPECT_EQ(task->phase, 0);
    registry->complete_step(*task, "w0", fmt::format("modules/{}/v1.safetensors", task->module));
    stepped.insert(task->module);
  }
  EXPECT_EQ(stepped.size(), 5u);
  ASSERT_EQ(phase1.size(), 4u);
  EXPECT_EQ(registry->latest_version("embed"), 1);
  EXPECT_EQ(registry->reports("embed", 0).size(), 4u);

  // The last phase: the modules take their last step, and no phase 2 is issued.
  auto other = open();  // what one connection did, another continues
  for (const auto& task : phase1) other->complete_path(task, "w0", path_reports(layout, task.path, 1), "paths/P/inner.safetensors");
  while (auto task = other->lease("w1", 1090.0, 60.0)) {
    ASSERT_EQ(task->scope, TaskScope::kModuleStep);
    EXPECT_FALSE(other->finished());
    other->complete_step(*task, "w1", fmt::format("modules/{}/v2.safetensors", task->module));
  }
  EXPECT_TRUE(other->finished());
  EXPECT_FALSE(other->version_needed("L1.M0", 1)) << "no task is left to read it";
  EXPECT_EQ(other->latest_version("L2.M1"), 2);
  for (const auto& row : other->tasks()) EXPECT_EQ(row.state, TaskState::kDone) << describe(row.key);
}

// A worker keeps its path: of a phase's paths, it is offered first the one it prefers (whose inner
// state it holds in memory), if open; otherwise, and without a preference, the lowest open path.
TEST_P(RegistryTest, AWorkerIsOfferedThePathItPrefers) {
  auto registry = open();
  const auto layout = two_by_two(2);
  publish_initial(*registry);
  registry->start(layout);
  for (int64_t p = 0; p < 4; ++p) {
    auto task = registry->lease(fmt::format("w{}", 3 - p), 10.0, 60.0);  // path 0 by w3, ..., path 3 by w0
    ASSERT_TRUE(task.has_value());
    EXPECT_EQ(*task, (TaskKey{TaskScope::kPath, p, "", 0})) << "no path has a previous phase yet";
  }
  for (int64_t p = 0; p < 4; ++p) {
    registry->complete_path({TaskScope::kPath, p, "", 0}, fmt::format("w{}", 3 - p), path_reports(layout, p, 0),
                            "paths/P/inner.safetensors");
  }
  std::vector<TaskKey> given_back;  // phase 1's paths, issued as their modules step
  while (auto task = registry->lease("w9", 20.0, 60.0)) {
    if (task->scope == TaskScope::kPath) {
      given_back.push_back(*task);
      continue;
    }
    registry->complete_step(*task, "w9", fmt::format("modules/{}/v1.safetensors", task->module));
  }
  ASSERT_EQ(given_back.size(), 4u);
  for (const auto& task : given_back) registry->release(task, "w9");
  auto leased = [&](const std::string& holder, int64_t preferred) {
    auto task = registry->lease(holder, 30.0, 60.0, preferred);
    return task && task->scope == TaskScope::kPath && task->phase == 1 ? task->path : int64_t{-1};
  };
  EXPECT_EQ(leased("w2", 1), 1);
  EXPECT_EQ(leased("w0", 3), 3);
  EXPECT_EQ(leased("w8", -1), 0) << "without a preference, the lowest open path";
  EXPECT_EQ(leased("w3", 0), 2) << "path 0 is taken: the lowest open one";
}

// Discriminative re-routing before phase 1: no path task of phase 1 until every module reached
// version 1 and the route task completed; then every path's.
TEST_P(RegistryTest, ARouteTaskGatesItsPhase) {
  auto registry = open();
  publish_initial(*registry);
  auto layout = two_by_two(3);
  layout.reroute_phase = 1;
  registry->start(layout);
  expect_error<DataError>([&] { open()->start(two_by_two(3)); }, "a run's shape cannot change");
  std::vector<TaskKey> phase0;
  for (int64_t p = 0; p < 4; ++p) phase0.push_back(*registry->lease("w", 10.0, 60.0));
  for (const auto& task : phase0) registry->complete_path(task, "w", path_reports(layout, task.path, 0), "paths/P/inner.safetensors");
  int64_t steps = 0;
  while (auto task = registry->lease("w", 20.0, 60.0)) {
    if (task->scope == TaskScope::kRoute) {
      EXPECT_EQ(steps, 5) << "re-routing before every module stepped";
      EXPECT_EQ(task->phase, 1);
      EXPECT_FALSE(registry->lease("w", 20.0, 60.0).has_value()) << "a phase 1 task before the re-routing";
      registry->complete_route(*task, "w", "routing/phase1");
      break;
    }
    ASSERT_EQ(task->scope, TaskScope::kModuleStep);
    ++steps;
    registry->complete_step(*task, "w", fmt::format("modules/{}/v1.safetensors", task->module));
  }
  EXPECT_EQ(registry->task_result({TaskScope::kRoute, -1, "", 1}), "routing/phase1");
  std::set<int64_t> paths;
  while (auto task = registry->lease("w", 30.0, 60.0)) {
    EXPECT_EQ(task->scope, TaskScope::kPath);
    EXPECT_EQ(task->phase, 1);
    paths.insert(task->path);
  }
  EXPECT_EQ(paths, (std::set<int64_t>{0, 1, 2, 3}));
}

// A phase deadline of 5 s: path 3 is late, so the modules it shares step at the deadline with the
// reports that arrived; its own late reports are left out, and once all its modules stepped its late
// task is cancelled and its next phase issued.
TEST_P(RegistryTest, APhaseDeadlineStepsWithTheReportsThatArrived) {
  auto registry = open();
  publish_initial(*registry);
  const auto layout = two_by_two(2);
  registry->start(layout);
  std::vector<TaskKey> phase0;
  for (int64_t p = 0; p < 4; ++p) phase0.push_back(*registry->lease("w", 0.0, 60.0));
  for (int64_t p = 0; p < 3; ++p) {
    EXPECT_TRUE(registry->complete_path(phase0[p], "w", path_reports(layout, p, 0), "paths/P/inner.safetensors", 10.0, 5.0).empty());
  }
  // L1.M0 (paths 0, 1) and L2.M0 (0, 2) have all their reports; L1.M1, L2.M1 and embed wait for path 3.
  std::set<std::string> due;
  while (auto task = registry->lease("w", 12.0, 60.0)) due.insert(task->module);
  EXPECT_EQ(due, (std::set<std::string>{"L1.M0", "L2.M0"}));
  std::set<std::string> at_deadline;
  while (auto task = registry->lease("w", 15.5, 60.0)) {
    ASSERT_EQ(task->scope, TaskScope::kModuleStep);
    at_deadline.insert(task->module);
  }
  EXPECT_EQ(at_deadline, (std::set<std::string>{"L1.M1", "L2.M1", "embed"}));
  EXPECT_EQ(registry->reports("embed", 0).size(), 3u);
  // Path 3 reports now: every one of its modules' phase has closed.
  const auto late = registry->complete_path(phase0[3], "w", path_reports(layout, 3, 0), "paths/P/inner.safetensors", 16.0, 5.0);
  EXPECT_EQ(std::set<std::string>(late.begin(), late.end()), (std::set<std::string>{"L1.M1", "L2.M1", "embed"}));
  EXPECT_EQ(registry->reports("embed", 0).size(), 3u) << "a late report counted";
  for (const auto& m : {"L1.M0", "L2.M0", "L1.M1", "L2.M1", "embed"}) {
    registry->complete_step({TaskScope::kModuleStep, -1, m, 0}, "w", fmt::format("modules/{}/v1.safetensors", m));
  }
  std::set<int64_t> next;
  while (auto task = registry->lease("w", 17.0, 60.0)) next.insert(task->path);
  EXPECT_EQ(next, (std::set<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(registry->latest_path_result(3, 1)->first, 0);

  // Had path 3 still been training when its modules stepped, its task would have been cancelled.
  auto other = open_other();
  publish_initial(*other);
  other->start(layout);
  std::vector<TaskKey> tasks;
  for (int64_t p = 0; p < 4; ++p) tasks.push_back(*other->lease("w", 0.0, 60.0));
  for (int64_t p = 0; p < 3; ++p) other->complete_path(tasks[p], "w", path_reports(layout, p, 0), "paths/P/inner.safetensors", 10.0, 5.0);
  while (auto task = other->lease("w", 20.0, 60.0)) {
    if (task->scope == TaskScope::kModuleStep) other->complete_step(*task, "w", fmt::format("modules/{}/v1.safetensors", task->module));
  }
  expect_error<LeaseLost>([&] { other->complete_path(tasks[3], "w", path_reports(layout, 3, 0), "paths/P/inner.safetensors", 21.0, 5.0); },
                          "cancelled");
  EXPECT_FALSE(other->latest_path_result(3, 1).has_value());
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

// libpq quotes what it cannot read of a malformed connection string, password and all: the error
// names the problem without it.
TEST(PostgresRegistryTest, AMalformedConnectionStringIsNamedWithoutItsPassword) {
  for (const std::string conninfo : {"postgresql://loco:hunter2secret%zz@127.0.0.1:1/db",
                                     "postgresql://loco:hunter2secret@[::1/db",
                                     "postgresql://loco:hunter2%2Dsecret@127.0.0.1:1/db?sslmode=bogus%zz",
                                     "host=127.0.0.1 port=1 password='hunter2secret' dbname",
                                     // as a URI's parameter (issue #49: libpq quoted it whole)
                                     "postgresql://loco@127.0.0.1:1/db?password=hunter2secret%zz",
                                     "postgresql://127.0.0.1:1/db?sslmode=require&password=hunter2secret&x=%zz"}) {
    try {
      open_postgres_registry(conninfo, std::chrono::seconds(3));
      ADD_FAILURE() << "connected with " << conninfo;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("cannot connect"), std::string::npos) << message;
      EXPECT_EQ(message.find("hunter2"), std::string::npos) << "the password leaked: " << message;
    }
  }
}

}  // namespace
}  // namespace loco::runtime
