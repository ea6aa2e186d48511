// The order in which the coordinator's HTTP server (http_server.h) does the costly step of its TLS
// handshakes: the key exchange and signature it answers a ClientHello with. A ClientHello costs
// its sender nothing (it can be sent again and again), so a flood of them keeps the server's CPU
// busy; served in arrival order, a member's new connection would wait behind the whole flood
// (measured: docs/benchmarks.md, "TLS handshake flood"). The server takes one handshake per turn
// of its I/O loop from this queue: first those from addresses that have made an authentic request
// (the run's members, most likely), then the others in turn by address, so that one address's
// flood delays another's handshake by one handshake per address waiting, not by the whole flood.
//
// Used on the server's I/O thread only: no locks.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace loco::runtime::detail {

// A TLS client's first flight is read record by record (a 5-byte header, then its payload) until
// its ClientHello is whole, before the server does any work for it; at most this many bytes.
inline constexpr size_t kMaxClientHello = 64 << 10;

// Of `bytes`, the records read so far: how many bytes to read next (the rest of a record's header
// or of its payload), 0 once the ClientHello is whole, or nullopt when they are not a ClientHello
// (a record that is no handshake record, or empty; a first record too short to name its message,
// or naming another; more than kMaxClientHello bytes).
std::optional<size_t> client_hello_missing(std::string_view bytes);

class HandshakeQueue {
 public:
  using Clock = std::chrono::steady_clock;
  // Addresses remembered as trusted; beyond, the one trusted longest ago is forgotten.
  static constexpr size_t kTrustedAddresses = 4096;

  // `start` does connection `id`'s handshake step when its turn comes.
  void push(uint64_t id, const std::string& address, std::function<void()> start);
  // Connection `id` closed while it waited (nothing if it was not waiting).
  void remove(uint64_t id);
  // The next handshake to take, out of the queue; empty when none waits.
  std::function<void()> pop();
  bool empty() const { return waiting_.empty(); }
  size_t size() const { return waiting_.size(); }

  // `address` made an authentic request at `now`: its handshakes go first from now on.
  void trust(const std::string& address, Clock::time_point now);
  bool trusted(const std::string& address) const { return trusted_.count(address) > 0; }

 private:
  // The first id in `ids` still waiting, out of both; 0 when none (ids start at 1).
  uint64_t take_first(std::deque<uint64_t>& ids);

  std::map<uint64_t, std::function<void()>> waiting_;  // by connection id
  std::deque<uint64_t> trusted_order_;                 // ids from trusted addresses, oldest first
  std::map<std::string, std::deque<uint64_t>> strangers_;  // the others' ids, by address
  std::string last_;                                   // the stranger address served last
  std::map<std::string, Clock::time_point> trusted_;
};

}  // namespace loco::runtime::detail
