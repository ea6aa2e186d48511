#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "test_util.h"

namespace loco {
namespace {

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
