// Each emulated island's own share of the CPU (`--link cpu=C`, islands.h): islands stand for
// machines, and on one machine their processes would otherwise share its cores by the scheduler's
// luck, so that one worker races ahead and waits for the others at every synchronization (a wait
// no link causes). Each island with a share gets a control group of the kernel's CPU controller
// (cgroup v1, /sys/fs/cgroup/cpu) whose quota is C cores (cpu.cfs_quota_us = C x cpu.cfs_period_us),
// and the processes started in the island are placed in it (supervisor.h) before they run.
//
// The groups are named loco-<launcher pid>-<island> and removed when this object goes (their
// processes have exited by then); groups left by a launcher that was killed are removed by the next
// one that starts. Needs root; without the controller, an Error says so.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace loco::runtime {

class CpuShares {
 public:
  // `cores[i]` > 0: island i's share, in cores; 0: no group for it. Throws Error when a group
  // cannot be made (no cgroup v1 CPU controller, no privilege), leaving nothing behind.
  explicit CpuShares(const std::vector<double>& cores);
  ~CpuShares();
  CpuShares(const CpuShares&) = delete;
  CpuShares& operator=(const CpuShares&) = delete;

  // The file a process writes its pid into to join island i's group ("" when it has none).
  std::string procs_file(size_t island) const;
  // The root of the groups (where the kernel's CPU controller is mounted).
  static std::filesystem::path root();

 private:
  std::vector<std::filesystem::path> groups_;  // by island; empty: none
};

}  // namespace loco::runtime
