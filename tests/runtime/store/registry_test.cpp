// DiPaCo's registry in SQLite: published versions and reports survive a reopen (a restarted
// coordinator loses nothing), a second report of one path refuses, conflicting publications
// refuse, two connections see each other's commits, and files that are not a registry are named.
#include <gtest/gtest.h>

#include <fstream>

#include "loco/core/error.h"
#include "loco/runtime/store/registry.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

using testing_util::expect_error;
using testing_util::TempDir;

TEST(RegistryTest, VersionsAndReportsSurviveAReopen) {
  TempDir dir;
  const auto file = dir.path() / "dipaco.sqlite";
  {
    auto registry = open_sqlite_registry(file);
    EXPECT_FALSE(registry->latest_version("L1.M0").has_value());
    registry->publish_module("L1.M0", 0, "modules/L1.M0/v0.safetensors");
    registry->publish_module("L1.M0", 1, "modules/L1.M0/v1.safetensors");
    registry->publish_module("L1.M0", 1, "modules/L1.M0/v1.safetensors");  // a retry: nothing changes
    registry->publish_module("embed", 0, "modules/embed/v0.safetensors");
    registry->record_report({"L1.M0", 1, 3, 1200.0, "reports/p1/L1.M0.3"});
    registry->record_report({"L1.M0", 1, 2, 800.0, "reports/p1/L1.M0.2"});
    registry->record_report({"L1.M0", 2, 2, 800.0, "reports/p2/L1.M0.2"});
  }
  auto registry = open_sqlite_registry(file);
  EXPECT_EQ(registry->latest_version("L1.M0"), 1);
  EXPECT_EQ(registry->latest_version("embed"), 0);
  EXPECT_EQ(registry->module_file("L1.M0", 1), "modules/L1.M0/v1.safetensors");
  const auto phase1 = registry->reports("L1.M0", 1);
  ASSERT_EQ(phase1.size(), 2u);
  EXPECT_EQ(phase1[0].path, 2);  // by path
  EXPECT_EQ(phase1[0].weight, 800.0);
  EXPECT_EQ(phase1[1].file, "reports/p1/L1.M0.3");
  EXPECT_EQ(registry->reports("L1.M0", 2).size(), 1u);
  EXPECT_TRUE(registry->reports("L2.M0", 1).empty());
}

TEST(RegistryTest, DuplicatesAndConflictsAreRefused) {
  TempDir dir;
  auto registry = open_sqlite_registry(dir.path() / "dipaco.sqlite");
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

TEST(RegistryTest, TwoConnectionsSeeEachOthersCommits) {
  TempDir dir;
  auto a = open_sqlite_registry(dir.path() / "dipaco.sqlite");
  auto b = open_sqlite_registry(dir.path() / "dipaco.sqlite");
  a->publish_module("embed", 0, "e0");
  EXPECT_EQ(b->latest_version("embed"), 0);
  b->record_report({"embed", 0, 1, 2.0, "r"});
  expect_error<DataError>([&] { a->record_report({"embed", 0, 1, 2.0, "r"}); }, "already reported");
}

TEST(RegistryTest, FilesThatAreNotARegistryAreNamed) {
  TempDir dir;
  const auto junk = dir.path() / "junk.sqlite";
  std::ofstream(junk) << std::string(4096, 'x');
  expect_error<DataError>([&] { open_sqlite_registry(junk); }, "is " + junk.string() + " a loco registry?");
  expect_error<DataError>([&] { open_sqlite_registry(dir.path() / "no" / "such" / "folder" / "r.sqlite"); }, "cannot open the registry");
}

}  // namespace
}  // namespace loco::runtime
