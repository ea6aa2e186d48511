#include "loco/runtime/tasks/task.h"

#include <fmt/format.h>

#include <array>

namespace loco::runtime {
namespace {

constexpr std::array<std::string_view, 5> kStateNames = {"open", "waiting", "leased", "done", "cancelled"};
constexpr std::array<std::string_view, 5> kScopeNames = {"model", "fragment", "path", "step", "route"};

template <class Enum, size_t N>
std::optional<Enum> parse_name(const std::array<std::string_view, N>& names, std::string_view text) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == text) return static_cast<Enum>(i);
  }
  return std::nullopt;
}

}  // namespace

std::string_view to_string(TaskState state) { return kStateNames.at(static_cast<size_t>(state)); }
std::optional<TaskState> parse_task_state(std::string_view text) { return parse_name<TaskState>(kStateNames, text); }

bool legal_transition(TaskState from, TaskState to) {
  switch (from) {
    case TaskState::kOpen: return to == TaskState::kLeased || to == TaskState::kDone || to == TaskState::kCancelled;
    case TaskState::kWaiting: return to == TaskState::kOpen || to == TaskState::kLeased || to == TaskState::kCancelled;
    case TaskState::kLeased: return to == TaskState::kDone || to == TaskState::kOpen || to == TaskState::kCancelled;
    case TaskState::kDone:
    case TaskState::kCancelled: return false;
  }
  return false;
}

std::string_view to_string(TaskScope scope) { return kScopeNames.at(static_cast<size_t>(scope)); }
std::optional<TaskScope> parse_task_scope(std::string_view text) { return parse_name<TaskScope>(kScopeNames, text); }

std::string describe(const TaskKey& task) {
  switch (task.scope) {
    case TaskScope::kPath: return fmt::format("path {} phase {}", task.path, task.phase);
    case TaskScope::kModuleStep: return fmt::format("outer step of {} phase {}", task.module, task.phase);
    case TaskScope::kRoute: return fmt::format("re-routing before phase {}", task.phase);
    case TaskScope::kModel: return fmt::format("the model, version {}", task.phase);
    case TaskScope::kFragment: return fmt::format("a fragment, version {}", task.phase);
  }
  return "?";
}

}  // namespace loco::runtime
