#include "loco/runtime/launch/cpu_shares.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "loco/core/error.h"

namespace loco::runtime {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kPeriodUs = 100'000;

void write_value(const fs::path& file, const std::string& value) {
  std::ofstream out(file);
  out << value;
  out.flush();
  if (!out) throw Error("link", fmt::format("cannot write {} to {}: {}", value, file.string(), std::strerror(errno)));
}

// Removes the groups of launchers that are gone (killed before they could remove their own).
void remove_stale_groups(const fs::path& root) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const auto name = entry.path().filename().string();
    if (name.rfind("loco-", 0) != 0) continue;
    const auto pid = std::strtol(name.c_str() + 5, nullptr, 10);
    if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    fs::remove(entry.path(), ec);  // rmdir: refused while a process is in it
  }
}

}  // namespace

fs::path CpuShares::root() { return "/sys/fs/cgroup/cpu"; }

CpuShares::CpuShares(const std::vector<double>& cores) {
  bool any = false;
  for (double c : cores) any = any || c > 0;
  groups_.resize(cores.size());
  if (!any) return;
  if (!fs::exists(root() / "cpu.cfs_quota_us")) {
    throw Error("link", fmt::format("--link cpu=...: the kernel's CPU controller (cgroup v1) is not mounted at {}; leave "
                                    "cpu out to share the machine's cores as they come", root().string()));
  }
  remove_stale_groups(root());
  try {
    for (size_t i = 0; i < cores.size(); ++i) {
      if (cores[i] <= 0) continue;
      const auto group = root() / fmt::format("loco-{}-{}", ::getpid(), i);
      std::error_code ec;
      if (!fs::create_directory(group, ec) && ec) {
        throw Error("link", fmt::format("cannot make the CPU group {}: {} (needs root)", group.string(), ec.message()));
      }
      groups_[i] = group;
      write_value(group / "cpu.cfs_period_us", std::to_string(kPeriodUs));
      write_value(group / "cpu.cfs_quota_us", std::to_string(std::llround(cores[i] * kPeriodUs)));
    }
  } catch (...) {
    for (const auto& group : groups_) {
      std::error_code ec;
      if (!group.empty()) fs::remove(group, ec);
    }
    throw;
  }
}

CpuShares::~CpuShares() {
  for (const auto& group : groups_) {
    std::error_code ec;
    if (!group.empty()) fs::remove(group, ec);
  }
}

std::string CpuShares::procs_file(size_t island) const {
  return island < groups_.size() && !groups_[island].empty() ? (groups_[island] / "cgroup.procs").string() : "";
}

}  // namespace loco::runtime
