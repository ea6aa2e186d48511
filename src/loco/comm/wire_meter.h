// What this process's TCP sockets have actually carried, read from the kernel (TCP_INFO): the
// check on the byte accounting that Group reports, used by tests and benchmarks.
#pragma once

#include <cstdint>

namespace loco::comm {

struct WireCounters {
  int64_t sent = 0;      // payload bytes written to TCP sockets of this process (acked or queued)
  int64_t received = 0;  // payload bytes received on them
};

// Sums the counters over every TCP socket this process has open now. Sockets closed since an
// earlier reading drop out of the sum, so compare readings taken while the same sockets are open.
WireCounters read_wire_counters();

}  // namespace loco::comm
