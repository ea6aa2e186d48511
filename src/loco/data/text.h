// What data's sources share (internal to data/): the module their errors name, and ASCII white
// space in plain text.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "loco/core/error.h"

namespace loco::data {

inline constexpr std::string_view kModule = "data";

[[noreturn]] inline void fail(const std::string& message) { throw DataError(kModule, message); }
[[noreturn]] inline void fail(const std::filesystem::path& file, const std::string& problem) {
  fail(file.string() + ": " + problem);
}

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

inline std::string_view trim_right(std::string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return trim_right(s);
}

}  // namespace loco::data
