#include "loco/core/environment.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <cstdlib>
#include <string_view>

#include "loco/core/error.h"

namespace loco {
namespace {

std::optional<std::filesystem::path> path_variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::filesystem::path(value);
}

// The integer in variable `name`, if set; ConfigError unless it is an integer >= `minimum`.
std::optional<int64_t> integer_variable(const char* name, int64_t minimum) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  const std::string_view text(value);
  int64_t parsed = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  if (ec != std::errc() || end != text.data() + text.size() || parsed < minimum) {
    throw ConfigError("env", fmt::format("{} must be an integer >= {}, got '{}'", name, minimum, text));
  }
  return parsed;
}

}  // namespace

Environment read_environment() {
  Environment env;
  env.cache_dir = path_variable("LOCO_CACHE");
  env.home = path_variable("HOME");
  env.spm_library = path_variable("LOCO_SPM_LIBRARY");
  env.check_only = path_variable("LOCO_CHECK_ONLY").has_value();
  env.worker_executable = path_variable("LOCO_WORKER_EXECUTABLE");
  auto local = integer_variable("LOCO_LOCAL_PROCESSES", 1);
  if (!local) local = integer_variable("LOCAL_WORLD_SIZE", 1);  // torchrun
  if (!local) local = integer_variable("SLURM_NTASKS_PER_NODE", 1);
  env.local_processes = local.value_or(1);
  env.rank = integer_variable("RANK", 0);
  if (!env.rank) env.rank = integer_variable("SLURM_PROCID", 0);
  env.world_size = integer_variable("WORLD_SIZE", 1);
  if (!env.world_size) env.world_size = integer_variable("SLURM_NTASKS", 1);
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') env.master_addr = addr;
  env.master_port = integer_variable("MASTER_PORT", 1);
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
