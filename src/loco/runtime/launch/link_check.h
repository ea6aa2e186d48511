// `loco link-check`: measurements across emulated islands (islands.h).
//   measure_link(s)    the round trip of small TCP messages and the steady rate of a bulk transfer,
//                      one flow or several at once
//   measure_exchange   how long one all-reduce takes (`--ranks M`, and bench/wan.sh's transport
//                      line): M ranks, each a thread of this process inside island r's network
//                      namespace, with a Group over Gloo between their island addresses; each round
//                      starts on every rank at once (an in-process barrier, so no rank's lateness
//                      is counted as the link's)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loco/comm/group.h"
#include "loco/runtime/launch/islands.h"

namespace loco::runtime {

// Measurements across one emulated link (`loco link-check`, and the tests): the median round trip
// of small TCP messages, and the steady rate of a bulk TCP transfer from one island to another.
struct LinkMeasurement {
  double round_trip_s = 0;     // median of `pings`
  double rate_bps = 0;         // bits/s over the transfer's last three quarters (past slow start)
  int64_t bytes = 0;
};
LinkMeasurement measure_link(const Islands& islands, size_t from, size_t to, int64_t bulk_bytes, int pings = 20);
// Several transfers at once, each (from, to) its own connection: every flow's pings first, then all
// the bulk transfers together (the relay carries them side by side). One result per flow, in order.
std::vector<LinkMeasurement> measure_links(const Islands& islands, const std::vector<std::pair<size_t, size_t>>& flows,
                                           int64_t bulk_bytes, int pings = 20);


struct ExchangeCheck {
  int64_t values = 327'680;                    // fp32 values all-reduced (a fragment of bench/streaming.toml's model)
  comm::Encoding encoding = comm::Encoding::kFp32;
  // kAuto: the group's own choice. kRing with fp32 here means Gloo's own ring all-reduce (what
  // loco used before its direct algorithms), for comparison.
  comm::ReduceAlgorithm algorithm = comm::ReduceAlgorithm::kAuto;
  bool gloo_ring = false;                      // Gloo's ring all-reduce of fp32 (the former transport)
  int rounds = 5;                              // timed rounds, after one untimed
  int64_t connections = 1;
};

struct ExchangeMeasurement {
  double round_trip_s = 0;  // the group's own measurement at connect
  double median_s = 0;      // of the timed rounds, on the slowest rank of each
  int64_t bytes_sent = 0;   // by rank 0 in one round
  std::string route;        // what carried it
};

// Sets the check's encoding from `exchange` (fp32, bf16, fp8, e3m0, int8, int4, or gloo-ring) and
// its algorithm from `algorithm` (auto, gather, scatter, ring). Throws ConfigError naming a bad one.
void set_exchange(ExchangeCheck& check, const std::string& exchange, const std::string& algorithm);

// Runs the check on islands 0..M−1 (M = islands.size()). Throws Error or PeerError on failure.
ExchangeMeasurement measure_exchange(const Islands& islands, const ExchangeCheck& check);

}  // namespace loco::runtime
