// The run configuration (runtime/config/config.h): the bytes are a TOML file, then optionally,
// after a NUL byte, command-line overrides ("section.key=value"), one a line. parse_config,
// apply_override and validate must accept them or throw ConfigError; a config they accept must
// survive to_toml and parse_config again unchanged (config.h promises parse_config(to_toml(c)) == c).
#include <fmt/ranges.h>

#include "fuzz.h"
#include "loco/runtime/config/config.h"

namespace {

using namespace loco::runtime;
using loco::fuzz::finding;

void check_round_trip(const RunConfig& config, const char* what) {
  const std::string toml = to_toml(config);
  RunConfig again;
  try {
    again = parse_config(toml, "to_toml");
  } catch (const std::exception& e) {
    finding(fmt::format("{}: its own to_toml() is refused: {}\n{}", what, e.what(), toml));
  }
  if (const auto diff = differences(config, again); !diff.empty()) {
    finding(fmt::format("{}: to_toml/parse_config changes {}", what, fmt::join(diff, "; ")));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = loco::fuzz::bytes_of(data, size);
  const size_t nul = bytes.find('\0');
  const std::string toml = bytes.substr(0, nul);
  loco::fuzz::expect_refusal("parse_config", [&] {
    RunConfig config = parse_config(toml, "fuzz.toml");
    check_round_trip(config, "parse_config");
    if (nul == std::string::npos) return;
    size_t start = nul + 1;
    while (start <= bytes.size()) {
      size_t end = bytes.find('\n', start);
      if (end == std::string::npos) end = bytes.size();
      apply_override(config, bytes.substr(start, end - start));
      start = end + 1;
    }
    resolve_defaults(config);
    validate(config);
    check_round_trip(config, "apply_override");
  });
  return 0;
}
