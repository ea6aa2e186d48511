#include "loco/runtime/net/wire.h"

namespace loco::runtime::wire {

std::string to_wire(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool nested_deeper_than(const nlohmann::json& value, size_t limit) {
  std::vector<std::pair<const nlohmann::json*, size_t>> pending = {{&value, 0}};
  while (!pending.empty()) {
    const auto [node, depth] = pending.back();
    pending.pop_back();
    if (!node->is_structured()) continue;
    if (depth >= limit) return true;
    for (const auto& child : *node) pending.emplace_back(&child, depth + 1);
  }
  return false;
}

}  // namespace loco::runtime::wire
