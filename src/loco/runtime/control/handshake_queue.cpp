#include "loco/runtime/control/handshake_queue.h"

#include <algorithm>

namespace loco::runtime::detail {

void HandshakeQueue::push(uint64_t id, const std::string& address, std::function<void()> start) {
  waiting_[id] = std::move(start);
  if (trusted(address)) {
    trusted_order_.push_back(id);
  } else {
    strangers_[address].push_back(id);
  }
}

void HandshakeQueue::remove(uint64_t id) {
  waiting_.erase(id);
  if (waiting_.empty()) {  // what is left in the orders is closed connections' ids
    trusted_order_.clear();
    strangers_.clear();
  }
}

uint64_t HandshakeQueue::take_first(std::deque<uint64_t>& ids) {
  while (!ids.empty()) {
    const uint64_t id = ids.front();
    ids.pop_front();
    if (waiting_.count(id) > 0) return id;
  }
  return 0;
}

std::function<void()> HandshakeQueue::pop() {
  uint64_t id = take_first(trusted_order_);
  // The strangers in turn: the first address after the one served last, around.
  while (id == 0 && !strangers_.empty()) {
    auto next = strangers_.upper_bound(last_);
    if (next == strangers_.end()) next = strangers_.begin();
    last_ = next->first;
    id = take_first(next->second);
    if (next->second.empty()) strangers_.erase(next);
  }
  if (id == 0) return {};
  auto start = std::move(waiting_.at(id));
  remove(id);
  return start;
}

void HandshakeQueue::trust(const std::string& address, Clock::time_point now) {
  trusted_[address] = now;
  if (trusted_.size() > kTrustedAddresses) {
    trusted_.erase(std::min_element(trusted_.begin(), trusted_.end(),
                                    [](const auto& a, const auto& b) { return a.second < b.second; }));
  }
}

}  // namespace loco::runtime::detail
