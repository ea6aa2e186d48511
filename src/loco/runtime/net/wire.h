// JSON on the wire: what every HTTP endpoint of loco (the coordinator's, the status page's) uses to
// read a body from the network and to write an answer, whatever its messages mean.
#pragma once

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "loco/core/error.h"

namespace loco::runtime::wire {

// A request that breaks the protocol (answered with HTTP 400).
class ProtocolError : public Error {
 public:
  explicit ProtocolError(std::string_view message) : Error("protocol", message) {}
};

// How deep a message's JSON may nest arrays and objects (a summary's metrics are two levels).
constexpr size_t kMaxJsonDepth = 32;
// Whether `value` nests arrays and objects deeper than `limit` levels, found without recursion:
// nlohmann copies, compares and dumps a value recursively, one call per level, so a few hundred
// kilobytes of '[' would overflow the stack of whoever copies them.
bool nested_deeper_than(const nlohmann::json& value, size_t limit);

// `value` as a message's text. Strings that are not valid UTF-8 (a peer's, a path logged from a
// refused request) have their bad bytes replaced (U+FFFD) rather than failing the whole answer.
std::string to_wire(const nlohmann::json& value);

// `value` as the integer type T, for what comes off the network or out of a state file.
// nlohmann's get<T>() converts a float with a static_cast (undefined behaviour beyond T's range)
// and wraps a negative number into an unsigned type; this accepts only a JSON integer that T
// holds. Throws ProtocolError naming `what`.
template <class T>
T get_integer(const nlohmann::json& value, std::string_view what) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  const auto checked = [&](auto v) {
    if (!std::in_range<T>(v)) throw ProtocolError(fmt::format("{} is out of range, got {}", what, v));
    return static_cast<T>(v);
  };
  if (value.is_number_unsigned()) return checked(value.get<uint64_t>());
  if (value.is_number_integer()) return checked(value.get<int64_t>());
  throw ProtocolError(fmt::format("{} is not an integer", what));
}

// A JSON list of integers (get_integer for each).
template <class T>
std::vector<T> get_integers(const nlohmann::json& value, std::string_view what) {
  if (!value.is_array()) throw ProtocolError(fmt::format("{} is not a list", what));
  std::vector<T> out;
  out.reserve(value.size());
  for (const auto& v : value) out.push_back(get_integer<T>(v, what));
  return out;
}

}  // namespace loco::runtime::wire
