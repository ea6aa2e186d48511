// How long one all-reduce takes across emulated islands (`loco link-check --ranks M`, and
// bench/wan.sh's transport line): M ranks, each a thread of this process inside island r's
// network namespace, with a Group over Gloo between their island addresses; each round starts on
// every rank at once (an in-process barrier, so no rank's lateness is counted as the link's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loco/comm/group.h"
#include "loco/runtime/launch/islands.h"

namespace loco::runtime {

struct ExchangeCheck {
  int64_t values = 0;                          // fp32 values all-reduced
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

// Runs the check on islands 0..M−1 (M = islands.size()). Throws Error or PeerError on failure.
ExchangeMeasurement measure_exchange(const Islands& islands, const ExchangeCheck& check);

}  // namespace loco::runtime
