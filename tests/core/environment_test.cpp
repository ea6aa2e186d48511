#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "loco/core/environment.h"
#include "loco/core/error.h"
#include "test_util.h"

namespace loco {
namespace {

// Sets a variable for the scope of a test and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(Environment, ReadsVariablesAndDefaults) {
  ScopedEnv a("LOCO_LOCAL_PROCESSES", nullptr), b("LOCO_CACHE", "/tmp/cache"), c("LOCO_SPM_LIBRARY", "");
  auto env = read_environment();
  EXPECT_EQ(env.local_processes, 1);
  EXPECT_EQ(env.cache_dir, std::filesystem::path("/tmp/cache"));
  EXPECT_FALSE(env.spm_library.has_value()) << "an empty variable counts as unset";
  ScopedEnv d("LOCO_LOCAL_PROCESSES", "4");
  EXPECT_EQ(read_environment().local_processes, 4);
}

// Workers started by torchrun or Slurm, several to a host, split its cores as `loco launch`'s do
// (issue #48: each took every core, 87 tok/s against 2,200). loco's own variable wins.
TEST(Environment, TorchrunAndSlurmSayHowManyProcessesShareAHost) {
  ScopedEnv a("LOCO_LOCAL_PROCESSES", nullptr), b("LOCAL_WORLD_SIZE", nullptr), c("SLURM_NTASKS_PER_NODE", "6");
  EXPECT_EQ(read_environment().local_processes, 6);
  ScopedEnv d("LOCAL_WORLD_SIZE", "4");
  EXPECT_EQ(read_environment().local_processes, 4) << "torchrun's before Slurm's";
  ScopedEnv e("LOCO_LOCAL_PROCESSES", "2");
  EXPECT_EQ(read_environment().local_processes, 2) << "loco's own first";
  ScopedEnv f("LOCO_LOCAL_PROCESSES", nullptr), g("LOCAL_WORLD_SIZE", "zero");
  testing_util::expect_error<ConfigError>([] { read_environment(); }, "LOCAL_WORLD_SIZE");
}

TEST(Environment, MalformedProcessCountIsNamed) {
  for (const char* bad : {"0", "two", "3x", "-1"}) {
    ScopedEnv e("LOCO_LOCAL_PROCESSES", bad);
    testing_util::expect_error<ConfigError>([] { read_environment(); }, "LOCO_LOCAL_PROCESSES");
  }
}

TEST(Environment, TorchrunAndSlurmVariablesGiveRankAndCoordinator) {
  ScopedEnv a("RANK", nullptr), b("SLURM_PROCID", "3"), c("WORLD_SIZE", nullptr), d("SLURM_NTASKS", "8"),
      e("MASTER_ADDR", "node17"), f("MASTER_PORT", "29400");
  auto env = read_environment();
  EXPECT_EQ(env.rank, 3) << "Slurm's when torchrun's is absent";
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.master_addr, "node17");
  EXPECT_EQ(env.master_port, 29400);
  ScopedEnv g("RANK", "1"), h("WORLD_SIZE", "2");
  env = read_environment();
  EXPECT_EQ(env.rank, 1) << "torchrun's RANK wins over SLURM_PROCID";
  EXPECT_EQ(env.world_size, 2);
  ScopedEnv i("MASTER_PORT", "http");
  testing_util::expect_error<ConfigError>([] { read_environment(); }, "MASTER_PORT must be an integer >= 1, got 'http'");
}

TEST(Environment, AFileAVariableNamesToRunIsTrustedOnlyIfNoOtherUserCouldChangeIt) {
  namespace fs = std::filesystem;
  testing_util::TempDir dir;  // under /tmp: world-writable, with the sticky bit
  const auto folder = dir.path() / "bin";
  fs::create_directory(folder);
  const auto file = folder / "loco";
  std::ofstream(file) << "#!/bin/sh\n";
  fs::permissions(folder, fs::perms(0755));
  fs::permissions(file, fs::perms(0755));
  EXPECT_EQ(trusted_file(file, "LOCO_WORKER_EXECUTABLE"), fs::canonical(file));
  // Through a link, the file it leads to is what counts.
  fs::create_symlink(file, dir.path() / "link");
  EXPECT_EQ(trusted_file(dir.path() / "link", "LOCO_WORKER_EXECUTABLE"), fs::canonical(file));

  fs::permissions(folder, fs::perms(0777));  // anyone could put another file there
  testing_util::expect_error<ConfigError>([&] { trusted_file(file, "LOCO_WORKER_EXECUTABLE"); },
                                          "LOCO_WORKER_EXECUTABLE=" + file.string() + " is not used: " + folder.string() +
                                              " is writable by other users");
  fs::permissions(folder, fs::perms(0755));
  fs::permissions(file, fs::perms(0666));  // anyone could rewrite it
  testing_util::expect_error<ConfigError>([&] { trusted_file(file, "LOCO_SPM_LIBRARY"); }, "is writable by other users");
  testing_util::expect_error<ConfigError>([&] { trusted_file(folder / "missing", "LOCO_SPM_LIBRARY"); },
                                          "LOCO_SPM_LIBRARY=" + (folder / "missing").string());
}

}  // namespace
}  // namespace loco
