// The environment variables loco reads, all read here (docs/configuration.md lists them).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace loco {

struct Environment {
  std::optional<std::filesystem::path> cache_dir;    // LOCO_CACHE: npm downloads of `loco prepare`
  std::optional<std::filesystem::path> home;         // HOME: default cache under ~/.cache/loco
  // Loco processes sharing this host's cores (each takes cores / this many threads):
  // LOCO_LOCAL_PROCESSES, else torchrun's LOCAL_WORLD_SIZE, else the tasks of this Slurm step on
  // this node (SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID), else SLURM_NTASKS_PER_NODE, else 1.
  int64_t local_processes = 1;
  bool local_processes_set = false;       // one of those variables said it
  bool local_processes_from_launcher = false;  // ... LOCO_LOCAL_PROCESSES or LOCAL_WORLD_SIZE (not Slurm's)
  // SLURM_CPUS_PER_TASK: the cores Slurm gave each task, used as its threads when set.
  std::optional<int64_t> cpus_per_task;
  std::optional<std::filesystem::path> spm_library;  // LOCO_SPM_LIBRARY: path of libloco_spm.so
  bool check_only = false;  // LOCO_CHECK_ONLY (any non-empty value): commands parse and load their config, then exit
  // LOCO_WORKER_EXECUTABLE: the `loco` binary `loco launch` starts its workers with (default: its
  // own), e.g. plain workers under a launcher built with ThreadSanitizer (scripts/tsan.sh).
  std::optional<std::filesystem::path> worker_executable;
  // Read by `loco worker` when its flags do not say; the first two as torchrun / Slurm set them:
  std::optional<int64_t> rank;               // RANK, else SLURM_PROCID
  std::optional<int64_t> world_size;         // WORLD_SIZE, else SLURM_NTASKS
  // LOCO_COORDINATOR: HOST:PORT of `loco coordinator`. Not torchrun's MASTER_ADDR:MASTER_PORT,
  // where torchrun's own rendezvous store listens.
  std::optional<std::string> coordinator;
};

// The tasks on node `node` in Slurm's compressed per-node list ("2(x3),1": two on each of the first
// three nodes, one on the fourth); ConfigError naming `variable` when the text is malformed or has
// no such node.
int64_t slurm_tasks_on_node(std::string_view list, int64_t node, std::string_view variable);

// The cores this process may run on (its CPU affinity: a cgroup, taskset or Slurm's binding), at least 1.
int64_t usable_cores();

// Reads the variables now. A malformed number (LOCO_LOCAL_PROCESSES not an integer >= 1, RANK not
// an integer >= 0, ...) throws ConfigError naming the variable.
Environment read_environment();

// A file that `variable` names for loco to run or load (LOCO_WORKER_EXECUTABLE, LOCO_SPM_LIBRARY):
// its canonical path, when no one but this user and root could have changed it: it and every
// folder above it owned by one of them and writable by no group or other user (a folder with the
// sticky bit, as /tmp, excepted above the file). Otherwise ConfigError naming the variable and the
// part that is not: a process run as root, for `loco launch --link`, must not run or load what
// another user could have put there.
std::filesystem::path trusted_file(const std::filesystem::path& path, std::string_view variable);

}  // namespace loco
