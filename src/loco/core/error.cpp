#include "loco/core/error.h"

namespace loco {

void fail_check(const char* condition, const char* file, int line, const std::string& message) {
  throw InternalError("bug", fmt::format("check failed: {} ({}:{}): {}", condition, file, line, message));
}

}  // namespace loco
