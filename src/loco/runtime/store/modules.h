// DiPaCo's module files (docs/dipaco.md, "Where state lives"): two safetensors files per module
// version, RUN/modules/<module>/v<version>.safetensors holding the module's global copy θ_m
// ("param.<name>"), which every path task through it reads, and v<version>.outer.safetensors
// holding its outer optimizer's state ("outer.<name>"), which only the module's next step reads;
// each with metadata naming the module, its version and the plan's fingerprint (model/paths.h).
// Written atomically, the outer state first, so a version whose parameters file exists is
// complete; whoever records the version (the run's database) does so only after the write
// returned. (Files of older runs hold both in the parameters file; they are read as they are.)
// Knows nothing of the model: names and tensors only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "loco/runtime/store/safetensors.h"

namespace loco::runtime {

struct ModuleVersion {
  std::string module;      // "embed", "L1.M0", ... (letters, digits, '.', '_', '-')
  int64_t version = 0;     // outer steps the module has taken
  std::string plan;        // PathPlan::fingerprint() of the plan it belongs to
  NamedTensors parameters;   // θ_m by parameter name
  NamedTensors outer_state;  // the outer optimizer's state by name
};

// RUN/modules/<module>/v<version>.safetensors. Throws DataError for a name that is not safe in a
// path (empty, '/', "..", other characters) or a negative version.
std::filesystem::path module_file(const std::filesystem::path& run_dir, const std::string& module, int64_t version);
// RUN/modules/<module>/v<version>.outer.safetensors (the same checks).
std::filesystem::path module_outer_file(const std::filesystem::path& run_dir, const std::string& module, int64_t version);

// Writes atomically (Error naming the file on failure, a full disk included; an older version is
// never touched).
void save_module(const std::filesystem::path& run_dir, const ModuleVersion& module);

// Reads and verifies (each file's checksum, then that it is `module` at `version` of plan `plan`);
// the outer state only `with_outer_state` (a path task needs the parameters alone). Throws
// DataError naming the file and what does not match (another plan or model, another module or
// version, a corrupt or missing file, a link, a file over `max_bytes`: load_checksummed_safetensors).
ModuleVersion load_module(const std::filesystem::path& run_dir, const std::string& module, int64_t version,
                          const std::string& plan, uint64_t max_bytes, bool with_outer_state = true);

}  // namespace loco::runtime
