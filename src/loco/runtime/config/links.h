// A link's description: its rate and one-way delay (`--link rate=100mbit,delay=50ms`, the config's
// [link] section), and a launch's plan of links for its islands. What `loco launch --link` emulates
// (runtime/launch/islands.h) and `loco simulate` models (runtime/simulate/simulate.h) are the same.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loco/runtime/config/config.h"

namespace loco::runtime {

// One island's link to the rest: rate in bits/s (0 = not shaped) and one-way delay in seconds;
// and the island's share of the machine's CPU, in cores (0 = no share of its own: the machine's
// cores as the scheduler gives them).
struct LinkSpec {
  double rate_bps = 0;
  double delay_s = 0;
  double cpu = 0;
  // > 0: an attacker on the path, for tests of the data plane (docs/security.md): the relay flips
  // one bit of the tamper-th TCP segment of 4 KiB or more of data that this island sends to
  // another worker's island (not the coordinator's), and keeps its checksum valid. 0 = the relay
  // alters nothing.
  int64_t tamper = 0;

  // "rate=100mbit,delay=50ms,cpu=0.45" (any key may be left out). Rates in tc's units: bit, kbit,
  // mbit, gbit (powers of 1000, bits per second), or bps, kbps, mbps, gbps (bytes per second);
  // delays in us, ms or s; cpu in cores (0.01 to 1024); tamper a count. Throws ConfigError naming
  // the bad part.
  static LinkSpec parse(const std::string& text);
  std::string describe() const;  // "100 Mbit/s, 50 ms one-way" (", 0.45 of a core" with a share)
  bool operator==(const LinkSpec&) const = default;
};

// "97.6 Mbit/s": a rate in bits/s with three significant digits.
std::string format_bandwidth(double bps);

// Parses a rate ("100mbit") or a delay ("50ms") alone; throws ConfigError naming `what`.
double parse_rate_bps(const std::string& text, const std::string& what);
double parse_delay_s(const std::string& text, const std::string& what);

// The links of a launch: `all` for every island (the coordinator's too), and per-worker ones.
// Each `--link` argument is a spec whose keys replace the default's, or "worker=R,<keys>" for
// worker R alone (its other keys taken from the default).
struct LinkPlan {
  LinkSpec all;
  std::vector<std::pair<int64_t, LinkSpec>> workers;  // (rank, its link)
  bool enabled = false;

  static LinkPlan parse(const std::vector<std::string>& arguments, int64_t world);
  // The config's [link] section, then `more` (the command line's --link arguments) over it.
  static LinkPlan from_config(const LinkSection& section, const std::vector<std::string>& more, int64_t world);
  LinkSpec for_worker(int64_t rank) const;
};

}  // namespace loco::runtime
