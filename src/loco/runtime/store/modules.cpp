#include "loco/runtime/store/modules.h"

#include <fmt/format.h>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/run_folder.h"

namespace loco::runtime {
namespace {

constexpr const char* kParam = "param.";
constexpr const char* kOuter = "outer.";

}  // namespace

std::filesystem::path module_file(const std::filesystem::path& run_dir, const std::string& module, int64_t version) {
  if (module.size() > 128 || !plain_file_name(module)) {
    throw DataError("dipaco", fmt::format("module name '{}' is not a safe file name (letters, digits, '.', '_', '-')", module));
  }
  if (version < 0) throw DataError("dipaco", fmt::format("module {}: version {} is negative", module, version));
  return RunFolder(run_dir).module_version(module, version);
}

std::filesystem::path module_outer_file(const std::filesystem::path& run_dir, const std::string& module, int64_t version) {
  return module_file(run_dir, module, version).replace_extension(".outer.safetensors");
}

void save_module(const std::filesystem::path& run_dir, const ModuleVersion& module) {
  const auto path = module_file(run_dir, module.module, module.version);
  const std::map<std::string, std::string> metadata = {{"loco.module", module.module},
                             {"loco.module_version", std::to_string(module.version)},
                             {"loco.plan", module.plan}};
  NamedTensors parameters, outer;
  for (const auto& [name, tensor] : module.parameters) parameters.emplace_back(kParam + name, tensor);
  for (const auto& [name, tensor] : module.outer_state) outer.emplace_back(kOuter + name, tensor);
  std::filesystem::create_directories(path.parent_path());
  save_safetensors(module_outer_file(run_dir, module.module, module.version), outer, metadata);
  save_safetensors(path, parameters, metadata);  // last: once it exists, the version is complete
}

namespace {

// One of a version's files, checked to be `module` at `version` of `plan`; its tensors into `out`.
void read_module_file(const std::filesystem::path& run_dir, const std::filesystem::path& path, const std::string& module,
                      int64_t version, const std::string& plan, uint64_t max_bytes, ModuleVersion& out) {
  if (!std::filesystem::exists(path)) {
    throw DataError("dipaco", fmt::format("{}: module {} version {} was never saved (missing file)", path.string(), module, version));
  }
  auto file = load_checksummed_safetensors(run_dir, path.lexically_relative(run_dir), max_bytes);
  auto meta = [&](const char* key) {
    auto it = file.metadata.find(key);
    if (it == file.metadata.end()) throw DataError("dipaco", fmt::format("{}: not a module file (no {} in its metadata)", path.string(), key));
    return it->second;
  };
  if (meta("loco.module") != module || meta("loco.module_version") != std::to_string(version)) {
    throw DataError("dipaco", fmt::format("{}: holds module {} version {}, not {} version {}", path.string(), meta("loco.module"),
                                          meta("loco.module_version"), module, version));
  }
  if (meta("loco.plan") != plan) {
    throw DataError("dipaco", fmt::format("{}: module of another plan or model ({}), this run's is {}", path.string(),
                                          meta("loco.plan"), plan));
  }
  for (auto& [name, tensor] : file.tensors) {
    if (name.starts_with(kParam)) {
      out.parameters.emplace_back(name.substr(std::string(kParam).size()), std::move(tensor));
    } else if (name.starts_with(kOuter)) {
      out.outer_state.emplace_back(name.substr(std::string(kOuter).size()), std::move(tensor));
    } else {
      throw DataError("dipaco", fmt::format("{}: tensor '{}' is neither a parameter nor outer state", path.string(), name));
    }
  }
}

}  // namespace

ModuleVersion load_module(const std::filesystem::path& run_dir, const std::string& module, int64_t version,
                          const std::string& plan, uint64_t max_bytes, bool with_outer_state) {
  const auto path = module_file(run_dir, module, version);
  ModuleVersion out{module, version, plan, {}, {}};
  read_module_file(run_dir, path, module, version, plan, max_bytes, out);
  if (out.parameters.empty()) throw DataError("dipaco", fmt::format("{}: a module file without parameters", path.string()));
  const auto outer = module_outer_file(run_dir, module, version);
  if (!with_outer_state) {
    out.outer_state.clear();
  } else if (out.outer_state.empty()) {  // (an older run's parameters file holds it already)
    read_module_file(run_dir, outer, module, version, plan, max_bytes, out);
  }
  return out;
}

}  // namespace loco::runtime
