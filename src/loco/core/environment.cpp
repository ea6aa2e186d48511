#include "loco/core/environment.h"

#include <charconv>
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

}  // namespace

Environment read_environment() {
  Environment env;
  env.cache_dir = path_variable("LOCO_CACHE");
  env.home = path_variable("HOME");
  env.spm_library = path_variable("LOCO_SPM_LIBRARY");
  if (const char* value = std::getenv("LOCO_LOCAL_PROCESSES"); value != nullptr && *value != '\0') {
    const std::string_view text(value);
    int64_t parsed = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed);
    if (ec != std::errc() || end != text.data() + text.size() || parsed < 1) {
      throw ConfigError("env", fmt::format("LOCO_LOCAL_PROCESSES must be an integer >= 1, got '{}'", text));
    }
    env.local_processes = parsed;
  }
  return env;
}

}  // namespace loco
