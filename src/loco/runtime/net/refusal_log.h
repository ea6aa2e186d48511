// Which refused requests the coordinator logs (docs/security.md, "Signed requests"): a stranger's
// flood must not fill stderr and push the run's own events out of the status page's timeline.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace loco::runtime {

// At most one line per address every `interval`, counting that address's refusals since its last
// line; and at most `lines` lines in all per interval, whatever the number of addresses: refusals
// past that are counted and told with the next line that is logged. At most `addresses` addresses
// are remembered; when that is full, those not logged within the last interval are forgotten (their
// pending counts go to the next line's `elsewhere`), and refusals from addresses past the bound are
// only counted there.
class RefusalLog {
 public:
  using Clock = std::chrono::steady_clock;
  struct Line {
    int64_t from_address = 1;  // refusals from this address told by this line (it included)
    int64_t elsewhere = 0;     // refusals from other addresses not logged since the last line
  };

  explicit RefusalLog(Clock::duration interval = std::chrono::seconds(10), int64_t lines = 20, size_t addresses = 4096)
      : interval_(interval), lines_(lines), addresses_(addresses) {}

  // A refused request from `address` at `now`: the line to log, or nullopt when not to log one now.
  // Not thread-safe: the caller holds its lock.
  std::optional<Line> admit(const std::string& address, Clock::time_point now);

 private:
  struct Address {
    Clock::time_point last{};  // when a line for it was last logged
    bool logged = false;
    int64_t since = 0;  // refusals since then
  };
  Clock::duration interval_;
  int64_t lines_;
  size_t addresses_;
  std::map<std::string, Address> by_address_;
  Clock::time_point window_{};
  bool window_open_ = false;
  int64_t lines_in_window_ = 0;
  int64_t untold_ = 0;  // refusals not logged and not counted for an address that will tell them
};

}  // namespace loco::runtime
