// The table of a run's configuration keys (internal to config/): each key's name, help, range and
// where its value lives in a RunConfig. One table drives parsing, command-line overrides, the saved
// TOML, the differences between two configs and the reference (config.cpp).
#pragma once

#include <functional>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "loco/runtime/config/config.h"

namespace loco::runtime::keys {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// An enum field, seen as one of its names.
struct EnumField {
  std::vector<std::string> names;
  std::function<std::string()> get;
  std::function<void(const std::string&)> set;
};

using FieldPtr = std::variant<int64_t*, double*, bool*, std::string*, EnumField>;

struct Field {
  std::string key;
  std::string help;
  FieldPtr value;
  double min = -kInf, max = kInf;
  bool min_exclusive = false;
  bool secret = false;  // never written (to_toml) nor shown (differences)
};

// The keys of `config`, each pointing into it. Ranges here are the first line of validation
// (validate()); components add cross-field checks.
std::vector<Field> table(RunConfig& config);

}  // namespace loco::runtime::keys
