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

TEST(Environment, TorchrunAndSlurmVariablesGiveRankAndLocosOwnTheCoordinator) {
  ScopedEnv a("RANK", nullptr), b("SLURM_PROCID", "3"), c("WORLD_SIZE", nullptr), d("SLURM_NTASKS", "8"),
      e("MASTER_ADDR", "node17"), f("MASTER_PORT", "29400"), g("LOCO_COORDINATOR", nullptr);
  auto env = read_environment();
  EXPECT_EQ(env.rank, 3) << "Slurm's when torchrun's is absent";
  EXPECT_EQ(env.world_size, 8);
  EXPECT_FALSE(env.coordinator.has_value()) << "MASTER_PORT is torchrun's rendezvous store, not loco's coordinator";
  ScopedEnv h("RANK", "1"), i("WORLD_SIZE", "2"), j("LOCO_COORDINATOR", "node17:29500");
  env = read_environment();
  EXPECT_EQ(env.rank, 1) << "torchrun's RANK wins over SLURM_PROCID";
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.coordinator, "node17:29500");
  ScopedEnv k("RANK", "first");
  testing_util::expect_error<ConfigError>([] { read_environment(); }, "RANK must be an integer >= 0, got 'first'");
}

// Slurm says how many tasks of a step run on each node in a compressed list; srun's tasks on one
// node split its cores by their count there (not the job's total), and SLURM_CPUS_PER_TASK, when the
// job asked for it, is what each task was given.
TEST(Environment, SlurmsTasksPerNodeListGivesTheTasksOnThisNode) {
  EXPECT_EQ(slurm_tasks_on_node("4", 0, "V"), 4);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0, "V"), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2, "V"), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3, "V"), 1);
  EXPECT_EQ(slurm_tasks_on_node("1,3(x2)", 2, "V"), 3);
  testing_util::expect_error<ConfigError>([] { slurm_tasks_on_node("2(x3),1", 4, "V"); }, "V='2(x3),1' has no node 4");
  for (const char* bad : {"", "x", "2(x0)", "2(3)", "2(x3", "0", "2,,1", "2(x3)1"}) {
    testing_util::expect_error<ConfigError>([&] { slurm_tasks_on_node(bad, 0, "SLURM_STEP_TASKS_PER_NODE"); },
                                            "SLURM_STEP_TASKS_PER_NODE='" + std::string(bad) + "'");
  }

  ScopedEnv a("LOCO_LOCAL_PROCESSES", nullptr), b("LOCAL_WORLD_SIZE", nullptr), c("SLURM_NTASKS_PER_NODE", nullptr),
      d("SLURM_STEP_TASKS_PER_NODE", "3,1"), e("SLURM_NODEID", "1"), f("SLURM_CPUS_PER_TASK", nullptr);
  auto env = read_environment();
  EXPECT_EQ(env.local_processes, 1) << "node 1 of the step runs one task";
  EXPECT_FALSE(env.cpus_per_task.has_value());
  ScopedEnv g("SLURM_NODEID", "0"), h("SLURM_CPUS_PER_TASK", "16");
  env = read_environment();
  EXPECT_EQ(env.local_processes, 3);
  EXPECT_EQ(env.cpus_per_task, 16);
  EXPECT_FALSE(env.local_processes_from_launcher) << "Slurm's count splits the node; SLURM_CPUS_PER_TASK is each task's";
  ScopedEnv i("LOCAL_WORLD_SIZE", "4");  // torchrun inside one Slurm task: its workers split the task's 16
  EXPECT_TRUE(read_environment().local_processes_from_launcher);
  EXPECT_GE(usable_cores(), 1);
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
