#include "loco/core/environment.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <cstdlib>
#include <string_view>

#include "loco/core/error.h"

namespace loco {
namespace {

std::optional<std::string> text_variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<std::filesystem::path> path_variable(const char* name) {
  auto value = text_variable(name);
  if (!value) return std::nullopt;
  return std::filesystem::path(*value);
}

// The integer in variable `name`, if set; ConfigError unless it is an integer >= `minimum`.
std::optional<int64_t> integer_variable(const char* name, int64_t minimum) {
  const auto value = text_variable(name);
  if (!value) return std::nullopt;
  const std::string_view text(*value);
  int64_t parsed = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  if (ec != std::errc() || end != text.data() + text.size() || parsed < minimum) {
    throw ConfigError("env", fmt::format("{} must be an integer >= {}, got '{}'", name, minimum, text));
  }
  return parsed;
}

// This Slurm step's tasks on this node, when srun started this process.
std::optional<int64_t> slurm_step_tasks_here() {
  const auto list = text_variable("SLURM_STEP_TASKS_PER_NODE");
  if (!list) return std::nullopt;
  return slurm_tasks_on_node(*list, integer_variable("SLURM_NODEID", 0).value_or(0), "SLURM_STEP_TASKS_PER_NODE");
}

}  // namespace

int64_t slurm_tasks_on_node(std::string_view list, int64_t node, std::string_view variable) {
  const auto malformed = [&](std::string_view why) {
    return ConfigError("env", fmt::format("{}='{}' {} (Slurm writes e.g. '2(x3),1')", variable, list, why));
  };
  int64_t first = 0;  // the first node the current entry covers
  std::optional<int64_t> found;
  for (std::string_view rest = list; !rest.empty();) {
    const auto comma = rest.find(',');
    const std::string_view entry = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    int64_t tasks = 0, repeat = 1;
    auto [end, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), tasks);
    std::string_view tail(end, static_cast<size_t>(entry.data() + entry.size() - end));
    if (ec != std::errc() || tasks < 1) throw malformed("is not a list of task counts");
    if (!tail.empty()) {
      if (tail.size() < 4 || tail.substr(0, 2) != "(x" || tail.back() != ')') throw malformed("is not a list of task counts");
      const auto count = tail.substr(2, tail.size() - 3);
      auto [stop, error] = std::from_chars(count.data(), count.data() + count.size(), repeat);
      if (error != std::errc() || stop != count.data() + count.size() || repeat < 1) throw malformed("has a bad repeat count");
    }
    if (!found && node < first + repeat) found = tasks;  // the rest is still checked
    first += repeat;
  }
  if (!found) throw malformed(fmt::format("has no node {} (SLURM_NODEID)", node));
  return *found;
}

int64_t usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max<int64_t>(1, ::sysconf(_SC_NPROCESSORS_ONLN));
}

Environment read_environment() {
  Environment env;
  env.cache_dir = path_variable("LOCO_CACHE");
  env.home = path_variable("HOME");
  env.spm_library = path_variable("LOCO_SPM_LIBRARY");
  env.check_only = path_variable("LOCO_CHECK_ONLY").has_value();
  env.worker_executable = path_variable("LOCO_WORKER_EXECUTABLE");
  auto local = integer_variable("LOCO_LOCAL_PROCESSES", 1);
  if (!local) local = integer_variable("LOCAL_WORLD_SIZE", 1);  // torchrun
  env.local_processes_from_launcher = local.has_value();
  if (!local) local = slurm_step_tasks_here();
  if (!local) local = integer_variable("SLURM_NTASKS_PER_NODE", 1);
  env.local_processes = local.value_or(1);
  env.local_processes_set = local.has_value();
  env.cpus_per_task = integer_variable("SLURM_CPUS_PER_TASK", 1);
  env.rank = integer_variable("RANK", 0);
  if (!env.rank) env.rank = integer_variable("SLURM_PROCID", 0);
  env.world_size = integer_variable("WORLD_SIZE", 1);
  if (!env.world_size) env.world_size = integer_variable("SLURM_NTASKS", 1);
  env.coordinator = text_variable("LOCO_COORDINATOR");
  return env;
}

std::filesystem::path trusted_file(const std::filesystem::path& path, std::string_view variable) {
  std::error_code error;
  const auto resolved = std::filesystem::canonical(path, error);
  if (error) throw ConfigError("env", fmt::format("{}={}: {}", variable, path.string(), error.message()));
  const uid_t me = ::geteuid();
  for (auto part = resolved;; part = part.parent_path()) {
    struct stat s {};
    if (::stat(part.c_str(), &s) != 0) {
      throw ConfigError("env", fmt::format("{}={}: {}: {}", variable, path.string(), part.string(), std::strerror(errno)));
    }
    const bool sticky_folder = S_ISDIR(s.st_mode) && (s.st_mode & S_ISVTX) != 0 && part != resolved;
    std::string why;
    if (s.st_uid != me && s.st_uid != 0) why = fmt::format("belongs to another user (uid {})", s.st_uid);
    else if ((s.st_mode & (S_IWGRP | S_IWOTH)) != 0 && !sticky_folder) why = "is writable by other users";
    if (!why.empty()) {
      throw ConfigError("env", fmt::format("{}={} is not used: {} {} (loco runs or loads this file, so it and every "
                                           "folder above it must be yours or root's, and writable by no one else)",
                                           variable, path.string(), part.string(), why));
    }
    if (part == part.root_path()) break;
  }
  return resolved;
}

}  // namespace loco
