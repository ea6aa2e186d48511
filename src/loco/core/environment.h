// The environment variables loco reads, all read here (docs/configuration.md lists them).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

namespace loco {

struct Environment {
  std::optional<std::filesystem::path> cache_dir;    // LOCO_CACHE: npm downloads of `loco prepare`
  std::optional<std::filesystem::path> home;         // HOME: default cache under ~/.cache/loco
  int64_t local_processes = 1;                       // LOCO_LOCAL_PROCESSES: loco processes sharing the cores
  std::optional<std::filesystem::path> spm_library;  // LOCO_SPM_LIBRARY: path of libloco_spm.so
};

// Reads the variables now. A malformed LOCO_LOCAL_PROCESSES (not an integer >= 1) throws
// ConfigError naming it.
Environment read_environment();

}  // namespace loco
