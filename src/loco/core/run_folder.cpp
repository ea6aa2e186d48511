#include "loco/core/run_folder.h"

#include <fmt/format.h>

#include "loco/core/error.h"

namespace loco {

namespace fs = std::filesystem;

bool RunFolder::unstarted() const {
  std::error_code error;
  for (fs::directory_iterator it(dir_, error), end; !error && it != end; it.increment(error)) {
    if (it->path() != join_token()) return false;
  }
  return !error && fs::is_directory(dir_, error);
}

void RunFolder::check_new_run(std::string_view module) const {
  std::error_code error;
  if (!fs::exists(dir_, error)) return;
  if (!fs::is_directory(dir_, error)) {
    throw ConfigError(module, fmt::format("run.dir {} exists and is not a folder; choose another --run.dir", dir_.string()));
  }
  if (!fs::is_empty(dir_, error) && !unstarted()) {
    throw ConfigError(module, fmt::format("run.dir {} already holds a run; pass --resume to continue it, or choose another "
                                          "--run.dir (nothing was overwritten)", dir_.string()));
  }
}

}  // namespace loco
