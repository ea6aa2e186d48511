#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "loco/core/command.h"
#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/run_folder.h"
#include "test_util.h"

namespace loco {
namespace {

using testing_util::expect_error;

TEST(Files, AtomicWriteReplacesAndLeavesNoTemporaries) {
  testing_util::TempDir dir;
  const auto path = dir.path() / "sub" / "file.txt";
  write_file_atomic(path, "first", "test");
  write_file_atomic(path, "second", "test");
  EXPECT_EQ(read_file(path, "test"), "second");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(path.parent_path())) ++entries;
  EXPECT_EQ(entries, 1);
}

// A link planted where the writer's temporary file was named before (the path, the host and the
// pid, all known to another user of the machine) is not written through; a checkpoint is its
// owner's alone.
TEST(Files, AtomicWriteFollowsNoPlantedLinkAndIsItsOwnersAlone) {
  testing_util::TempDir dir;
  const auto outside = dir.path() / "outside.txt", path = dir.path() / "run" / "checkpoint.bin";
  write_file_atomic(outside, "not yours", "test");
  fs::create_directories(path.parent_path());
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  fs::create_symlink(outside, fs::path(path.string() + fmt::format(".tmp.{}.{}", host, ::getpid())));
  write_file_atomic(path, "model", "test", Readers::kOwner);
  EXPECT_EQ(read_file(outside, "test"), "not yours");
  EXPECT_EQ(read_file(path, "test"), "model");
  EXPECT_FALSE(fs::is_symlink(path));
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  // Data, tokenizers and reports stay readable by others (a benchmark run as root, read by a user).
  const auto shared = dir.path() / "run" / "report.html";
  write_file_atomic(shared, "<p>", "test");
  EXPECT_EQ(fs::status(shared).permissions() & fs::perms::others_read, fs::perms::others_read);
}

// A run folder others write into (DiPaCo's, shared by its workers) may hold links planted at the
// names loco reads and deletes: a report folder linked to a folder outside the run was read and
// emptied by the outer step, and a report linked to /dev/zero took a worker to 1.6 GB (issue #49).
TEST(Files, ReadsAndDeletesUnderARunFolderFollowNoLink) {
  testing_util::TempDir dir;
  const auto run = dir.path() / "run", outside = dir.path() / "outside";
  fs::create_directories(run / "reports");
  fs::create_directories(outside);
  write_file_atomic(outside / "precious", "keep me", "test");
  write_file_atomic(run / "reports" / "r1", "report one", "test");
  EXPECT_EQ(read_file_beneath(run, "reports/r1", "test", 100), "report one");
  expect_error<DataError>([&] { read_file_beneath(run, "reports/r1", "test", 5); }, "10 bytes, more than the 5");

  fs::create_directory_symlink(outside, run / "linked");
  fs::create_symlink(outside / "precious", run / "reports" / "r2");
  fs::create_symlink("/dev/zero", run / "reports" / "zero");
  ASSERT_EQ(::mkfifo((run / "reports" / "pipe").c_str(), 0600), 0);
  for (const char* name : {"linked/precious", "reports/r2", "reports/zero"}) {
    testing_util::expect_error<DataError>([&] { read_file_beneath(run, name, "test", 1 << 30); },
                                          "links inside the run folder are not followed");
  }
  expect_error<DataError>([&] { read_file_beneath(run, "reports/pipe", "test", 1 << 30); }, "not a regular file");
  expect_error<DataError>([&] { read_file_beneath(run, "reports", "test", 1 << 30); }, "not a regular file");
  expect_error<DataError>([&] { read_file_beneath(run, "../outside/precious", "test", 1 << 30); }, "not a path inside the run folder");
  expect_error<DataError>([&] { read_file_beneath(run, outside / "precious", "test", 1 << 30); }, "not a path inside the run folder");
  expect_error<DataError>([&] { read_file_beneath(run, "reports/r9", "test", 1 << 30); }, "reports/r9: no such file");

  EXPECT_FALSE(remove_file_beneath(run, "linked/precious")) << "through a linked folder: nothing deleted";
  EXPECT_FALSE(remove_file_beneath(run, "../outside/precious"));
  EXPECT_TRUE(remove_file_beneath(run, "reports/r2")) << "the link itself goes";
  EXPECT_EQ(read_file(outside / "precious", "test"), "keep me") << "what it pointed to stays";
  EXPECT_FALSE(fs::exists(fs::symlink_status(run / "reports" / "r2")));
  EXPECT_TRUE(remove_file_beneath(run, "reports/r1"));
  EXPECT_FALSE(fs::exists(run / "reports" / "r1"));
  EXPECT_FALSE(remove_file_beneath(run, "reports/r1")) << "already gone";
}

TEST(Files, ReadMissingFileNamesIt) {
  testing_util::TempDir dir;
  testing_util::expect_error<DataError>([&] { read_file(dir.path() / "nope.bin", "test"); }, "nope.bin");
  testing_util::expect_error<DataError>([&] { read_file(dir.path(), "test"); }, "is a folder");
}

TEST(Files, WriteIntoUnwritablePlaceNamesIt) {
  // /proc is not writable, even for root: the error must name the path.
  testing_util::expect_error<Error>([&] { write_file_atomic("/proc/loco-test/x", "data", "test"); }, "/proc/loco-test");
}

TEST(Files, FullDiskIsReportedAsSuch) {
  // /dev/full answers every write with ENOSPC.
  LineAppender out("/dev/full", "test");
  testing_util::expect_error<Error>([&] { out.append("a line"); }, "disk is full");
}

// A link planted at a run folder's metrics.jsonl or lock is not written through (issue #69).
TEST(Files, NoAppenderOrLockFollowsAPlantedLink) {
  testing_util::TempDir dir;
  const auto outside = dir.path() / "outside.txt", run = dir.path() / "run";
  write_file_atomic(outside, "not yours", "test");
  fs::create_directories(run);
  fs::create_symlink(outside, run / "metrics.jsonl");
  fs::create_symlink(outside, run / "lock");
  expect_error<Error>([&] { LineAppender(run / "metrics.jsonl", "test"); }, "it is a symbolic link");
  expect_error<Error>([&] { RunLock::acquire(run, "test", "loco test"); }, "it is a symbolic link");
  // Nor the log of a tool loco runs (the refusal names the file, not the tool).
  fs::create_symlink(outside, run / "tool.log");
  expect_error<Error>([&] { run_command("test", std::chrono::seconds(10), {"true"}, run / "tool.log", "none"); },
                      (run / "tool.log").string() + " for `true`'s output: it is a symbolic link");
  EXPECT_EQ(read_file(outside, "test"), "not yours");
}

TEST(Files, LineAppenderAppendsWholeLines) {
  testing_util::TempDir dir;
  const auto path = dir.path() / "m.jsonl";
  {
    LineAppender out(path, "test");
    out.append("{\"a\":1}");
  }
  LineAppender again(path, "test");
  again.append("{\"b\":2}");
  EXPECT_EQ(read_file(path, "test"), "{\"a\":1}\n{\"b\":2}\n");
}

}  // namespace
}  // namespace loco
