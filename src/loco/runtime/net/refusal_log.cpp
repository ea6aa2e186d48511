#include "loco/runtime/net/refusal_log.h"

#include <iterator>

namespace loco::runtime {

std::optional<RefusalLog::Line> RefusalLog::admit(const std::string& address, Clock::time_point now) {
  if (!window_open_ || now - window_ >= interval_) {
    window_ = now;
    window_open_ = true;
    lines_in_window_ = 0;
  }
  auto it = by_address_.find(address);
  if (it == by_address_.end()) {
    if (by_address_.size() >= addresses_) {
      // Forget the addresses not logged within the interval; what they had pending is told as
      // refusals from elsewhere.
      for (auto old = by_address_.begin(); old != by_address_.end();) {
        const bool stale = !old->second.logged || now - old->second.last >= interval_;
        if (stale) untold_ += old->second.since;
        old = stale ? by_address_.erase(old) : std::next(old);
      }
    }
    if (by_address_.size() >= addresses_) {
      ++untold_;
      return std::nullopt;
    }
    it = by_address_.emplace(address, Address{}).first;
  }
  auto& a = it->second;
  ++a.since;
  if (a.logged && now - a.last < interval_) return std::nullopt;
  if (lines_in_window_ >= lines_) return std::nullopt;  // its count waits for its next line
  ++lines_in_window_;
  Line line{a.since, untold_};
  a.last = now;
  a.logged = true;
  a.since = 0;
  untold_ = 0;
  return line;
}

}  // namespace loco::runtime
