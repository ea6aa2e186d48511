#include "loco/runtime/net/handshake_queue.h"

#include <algorithm>

namespace loco::runtime::detail {

std::optional<size_t> client_hello_missing(std::string_view bytes) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t at = 0, payload = 0, message = 0;  // message: the ClientHello's length with its header
  for (;;) {
    if (bytes.size() - at < 5) return 5 - (bytes.size() - at);
    const unsigned char* header = data + at;
    const size_t length = (size_t{header[3]} << 8) | header[4];
    if (header[0] != 22 || length == 0 || at + 5 + length > kMaxClientHello) return std::nullopt;
    if (bytes.size() - at - 5 < length) return length - (bytes.size() - at - 5);
    if (at == 0) {  // the first record's payload opens with the message's type (1) and length
      if (length < 4 || header[5] != 1) return std::nullopt;
      message = 4 + ((size_t{header[6]} << 16) | (size_t{header[7]} << 8) | header[8]);
    }
    payload += length;
    at += 5 + length;
    if (payload >= message) return 0;
  }
}

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
