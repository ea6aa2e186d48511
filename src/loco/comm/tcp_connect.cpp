// Forming loco's transport (tcp_transport.h): the proven connections of one rank's group.
//
// Each rank listens on GroupOptions::host and publishes "host port" under "<prefix>/tcp/<rank>"
// in the store. For every pair the higher rank dials the lower one, GroupOptions::connections
// times. Every connection opens with a handshake of fixed sizes, each read bounded by
// kProofTimeout: the dialer's hello (a greeting, its rank, the connection's index, the group's size
// and a fresh nonce), the acceptor's answer (its rank, its fresh nonce and a proof), then the
// dialer's proof. A proof is HMAC(K', side, both ranks, the index, the data plane, both nonces)
// under K' = HMAC(K, "transport"), K the sealed group's key: bound to the group's name and the
// run's secret, so a connection from a stranger, another run or another epoch fails it. A
// connection that does not prove membership in time is closed and logged with its address, and the
// listener goes on waiting for the true peer until the group's timeout: whoever dials first cannot
// take a rank's place. A dialer whose peer does not prove itself goes on to its other peers, so
// that each of them can name it too.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "loco/comm/seal.h"
#include "loco/comm/tcp_transport.h"
#include "loco/core/crypto.h"
#include "loco/core/error.h"

namespace loco::comm::tcp_transport {

void note(const GroupOptions& options, const std::string& line) {
  if (options.log) {
    options.log(line);
  } else {
    fmt::print(stderr, "comm: {}\n", line);
  }
}

namespace {

// How long a connection may take to prove membership once it is open (or to answer the proof).
constexpr Duration kProofTimeout{5000};
// Handshakes in progress on one listener at once: more connections are closed as they come.
constexpr size_t kMaxPendingHandshakes = 32;
constexpr std::array<unsigned char, 8> kGreeting = {'L', 'O', 'C', 'O', 'T', 'C', 'P', '1'};
constexpr size_t kHelloBytes = 8 + 4 + 4 + 4 + sealing::kNonceBytes;
constexpr size_t kProofBytes = 32;
constexpr size_t kAnswerBytes = 8 + 4 + sealing::kNonceBytes + kProofBytes;

std::string address_of(const sockaddr_storage& a) {
  char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
  ::getnameinfo(reinterpret_cast<const sockaddr*>(&a), sizeof a, host, sizeof host, port, sizeof port,
                NI_NUMERICHOST | NI_NUMERICSERV);
  return fmt::format("{}:{}", host, port);
}

// Waits until `fd` is ready for `events` or `deadline` passes (false).
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, kAbortPoll.count())));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

// Reads or writes exactly `n` bytes of a nonblocking socket by `deadline`; false on EOF, an
// error or the deadline.
bool read_exact(int fd, unsigned char* data, size_t n, Clock::time_point deadline) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, data + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r == 0) {
      return false;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!wait_ready(fd, POLLIN, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}
bool write_all(int fd, const unsigned char* data, size_t n, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < n) {
    const ssize_t w = ::send(fd, data + sent, n - sent, MSG_NOSIGNAL);
    if (w > 0) {
      sent += static_cast<size_t>(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!wait_ready(fd, POLLOUT, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}

// The addresses `host` names, for listening (passive) or dialing `port`.
std::vector<sockaddr_storage> resolve(const std::string& host, const std::string& port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    throw PeerError("comm", fmt::format("cannot resolve '{}': {}", host, ::gai_strerror(rc)));
  }
  std::vector<sockaddr_storage> out;
  for (auto* a = found; a != nullptr; a = a->ai_next) {
    sockaddr_storage s{};
    std::memcpy(&s, a->ai_addr, a->ai_addrlen);
    out.push_back(s);
  }
  ::freeaddrinfo(found);
  return out;
}

socklen_t length_of(const sockaddr_storage& a) {
  return a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

class Former {
 public:
  explicit Former(const GroupOptions& options)
      : options_(options), key_(hmac_sha256(sealing::group_key(options.secret, options.prefix), "transport")),
        plane_(to_string(options.data_plane)) {
    conns_.resize(static_cast<size_t>(options.size));
    for (size_t q = 0; q < conns_.size(); ++q) {
      if (static_cast<int64_t>(q) != options.rank) conns_[q].resize(static_cast<size_t>(options.connections));
    }
  }

  std::vector<std::vector<Link>> form(KeyValueStore& store) {
    form_links(store);
    return std::move(conns_);
  }

 private:
  std::string prefix() const { return options_.prefix; }
  int64_t rank() const { return options_.rank; }
  int64_t size() const { return options_.size; }
  void note(const std::string& line) const { tcp_transport::note(options_, line); }


  void form_links(KeyValueStore& store) {
    const auto deadline = Clock::now() + options_.timeout;
    Socket listener = listen();
    sockaddr_storage bound{};
    socklen_t bound_length = sizeof bound;
    ::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&bound), &bound_length);
    const auto port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                                  : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    store.set(fmt::format("{}/tcp/{}", prefix(), rank()), fmt::format("{} {}", options_.host, port));

    // Accepting (from the higher ranks) runs beside dialing (the lower ones).
    std::exception_ptr accept_error;
    std::thread acceptor([&] {
      try {
        accept_all(listener, deadline);
      } catch (...) {
        accept_error = std::current_exception();
      }
    });
    // A peer that does not prove itself does not stop this rank from dialing the others, so that
    // each of them can name it too.
    std::exception_ptr dial_error;
    std::vector<int64_t> unproven;
    try {
      for (int64_t q = 0; q < rank(); ++q) {
        if (!dial(store, q, deadline)) unproven.push_back(q);
      }
    } catch (...) {
      dial_error = std::current_exception();
    }
    if (dial_error || !unproven.empty()) abandon_ = true;  // the acceptor stops at its next poll
    acceptor.join();
    if (dial_error) std::rethrow_exception(dial_error);
    if (!unproven.empty()) {
      throw PeerError("comm", fmt::format("group '{}' (rank {} of {}): rank(s) {} did not prove they hold the run's "
                                          "data-plane secret (a stranger, a worker of another run, or one with another "
                                          "join token or cluster.data_plane than '{}'): refused", prefix(), rank(), size(),
                                          fmt::join(unproven, ", "), plane_));
    }
    if (accept_error) std::rethrow_exception(accept_error);
    for (auto& list : conns_) {
      for (auto& c : list) {
        set_nonblocking(c.socket.fd);
        const int one = 1;
        ::setsockopt(c.socket.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      }
    }
  }

  Socket listen() {
    std::string why = "no address";
    for (const auto& a : resolve(options_.host, "0", true)) {
      Socket s(::socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (s.fd < 0) {
        why = errno_text();
        continue;
      }
      const int one = 1;
      ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(s.fd, reinterpret_cast<const sockaddr*>(&a), length_of(a)) != 0 || ::listen(s.fd, 128) != 0) {
        why = errno_text();
        continue;
      }
      set_nonblocking(s.fd);
      return s;
    }
    throw PeerError("comm", fmt::format("group '{}' (rank {} of {}): cannot listen on {}: {}", prefix(), rank(), size(),
                                        options_.host, why));
  }

  bool abandoned() const { return abandon_.load() || (options_.abort && options_.abort()); }

  std::string proof(const char* side, int64_t from, int64_t to, uint32_t index, std::string_view from_nonce,
                    std::string_view to_nonce) const {
    return hmac_sha256(key_, fmt::format("{}\n{}\n{}\n{}\n{}\n", side, from, to, index, plane_) + std::string(from_nonce) +
                                 std::string(to_nonce));
  }

  // The lower rank `q`'s connections, dialed: each proves itself and checks q's proof. False when
  // q's answer does not prove it (another secret or data plane: trying again would not help).
  bool dial(KeyValueStore& store, int64_t q, Clock::time_point deadline) {
    const auto key = fmt::format("{}/tcp/{}", prefix(), q);
    std::optional<std::string> where;
    while (!(where = store.get(key, std::min(kAbortPoll, std::max(Duration(0), left(deadline)))))) {
      if (abandoned()) throw PeerError("comm", fmt::format("group '{}': abandoned while rank {} had not arrived (a member failed)", prefix(), q));
      if (Clock::now() >= deadline) {
        throw PeerError("comm", fmt::format("group '{}': rank(s) {} did not arrive within {} s (this is rank {} of {})",
                                            prefix(), q, options_.timeout.count() / 1000.0, rank(), size()));
      }
    }
    const auto space = where->rfind(' ');
    if (space == std::string::npos) throw PeerError("comm", fmt::format("group '{}': rank {}'s address '{}' is malformed", prefix(), q, *where));
    const std::string host = where->substr(0, space), port = where->substr(space + 1);
    std::string last = "no try";
    for (uint32_t index = 0; index < static_cast<uint32_t>(options_.connections); ++index) {
      auto backoff = kAbortPoll;
      for (;;) {
        if (abandoned()) throw PeerError("comm", fmt::format("group '{}': abandoned while connecting to rank {} (a member failed)", prefix(), q));
        if (Clock::now() >= deadline) {
          throw PeerError("comm", fmt::format("group '{}' (rank {} of {}): cannot connect to rank {} at {}:{} within {} s: {}",
                                              prefix(), rank(), size(), q, host, port, options_.timeout.count() / 1000.0, last));
        }
        bool unproven = false;
        if (auto s = dial_once(host, port, q, index, deadline, last, unproven)) {
          conns_[static_cast<size_t>(q)][index].socket = std::move(*s);
          conns_[static_cast<size_t>(q)][index].address = fmt::format("{}:{}", host, port);
          break;
        }
        if (unproven) {
          note(fmt::format("group '{}' (rank {} of {}): rank {} at {}:{} {}", prefix(), rank(), size(), q, host, port, last));
          return false;
        }
        std::this_thread::sleep_for(std::min(backoff, std::max(Duration(0), left(deadline))));
        backoff = std::min(backoff * 2, Duration(2000));
      }
    }
    return true;
  }

  static Duration left(Clock::time_point deadline) {
    return std::chrono::duration_cast<Duration>(deadline - Clock::now());
  }

  std::optional<Socket> dial_once(const std::string& host, const std::string& port, int64_t q, uint32_t index,
                                  Clock::time_point deadline, std::string& why, bool& unproven) {
    for (const auto& a : resolve(host, port, false)) {
      Socket s(::socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (s.fd < 0) {
        why = errno_text();
        continue;
      }
      set_nonblocking(s.fd);
      if (::connect(s.fd, reinterpret_cast<const sockaddr*>(&a), length_of(a)) != 0 && errno != EINPROGRESS) {
        why = fmt::format("connect: {}", errno_text());
        continue;
      }
      const auto proof_deadline = std::min(deadline, Clock::now() + kProofTimeout);
      if (!wait_ready(s.fd, POLLOUT, proof_deadline)) {
        why = "connect: timed out";
        continue;
      }
      int error = 0;
      socklen_t error_length = sizeof error;
      ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &error, &error_length);
      if (error != 0) {
        why = fmt::format("connect: {}", std::strerror(error));
        continue;
      }
      const std::string nonce = random_bytes(sealing::kNonceBytes);
      std::array<unsigned char, kHelloBytes> hello{};
      std::copy(kGreeting.begin(), kGreeting.end(), hello.begin());
      put32(hello.data() + 8, static_cast<uint32_t>(rank()));
      put32(hello.data() + 12, index);
      put32(hello.data() + 16, static_cast<uint32_t>(size()));
      std::memcpy(hello.data() + 20, nonce.data(), nonce.size());
      std::array<unsigned char, kAnswerBytes> answer{};
      if (!write_all(s.fd, hello.data(), hello.size(), proof_deadline) ||
          !read_exact(s.fd, answer.data(), answer.size(), proof_deadline)) {
        why = "the handshake did not complete (closed, or no answer within 5 s)";
        continue;
      }
      const std::string their_nonce(reinterpret_cast<const char*>(answer.data() + 12), sealing::kNonceBytes);
      const std::string their_proof(reinterpret_cast<const char*>(answer.data() + 12 + sealing::kNonceBytes), kProofBytes);
      if (!std::equal(kGreeting.begin(), kGreeting.end(), answer.begin()) || get32(answer.data() + 8) != static_cast<uint32_t>(q) ||
          !same_secret(their_proof, proof("accept", q, rank(), index, their_nonce, nonce))) {
        why = "answered without proving it holds the run's data-plane secret (a stranger, a worker of another run, or "
              "one with another join token or cluster.data_plane than '" + plane_ + "')";
        unproven = true;
        return std::nullopt;
      }
      const auto mine = proof("connect", rank(), q, index, nonce, their_nonce);
      if (!write_all(s.fd, reinterpret_cast<const unsigned char*>(mine.data()), mine.size(), proof_deadline)) {
        why = "the handshake did not complete (closed while sending the proof)";
        continue;
      }
      return s;
    }
    return std::nullopt;
  }

  // The higher ranks' connections, accepted as each proves membership; a connection that does not
  // is closed and logged, and the wait goes on for the true one.
  void accept_all(Socket& listener, Clock::time_point deadline) {
    size_t expected = 0;
    for (int64_t q = rank() + 1; q < size(); ++q) expected += static_cast<size_t>(options_.connections);
    std::mutex mutex;
    std::condition_variable settled;
    size_t accepted = 0, pending = 0;
    std::set<int64_t> refused;  // ranks a connection claimed but did not prove
    std::set<int> proving;      // the sockets of the handshakes under way
    std::vector<std::thread> handshakes;
    // Ends the handshakes still under way (a stranger's, waiting for bytes that never come) at
    // once rather than after their 5 s, and waits for their threads.
    const auto finish = [&] {
      {
        std::lock_guard lock(mutex);
        for (int fd : proving) ::shutdown(fd, SHUT_RDWR);
      }
      for (auto& t : handshakes) t.join();
    };
    while (true) {
      {
        std::lock_guard lock(mutex);
        if (accepted == expected) break;
      }
      if (abandoned()) {
        abandon_ = true;
        finish();
        throw PeerError("comm", fmt::format("group '{}': abandoned while waiting for its peers to connect (a member failed)", prefix()));
      }
      if (Clock::now() >= deadline) {
        abandon_ = true;
        finish();
        std::vector<int64_t> missing;
        for (int64_t q = rank() + 1; q < size(); ++q) {
          const auto& list = conns_[static_cast<size_t>(q)];
          if (std::any_of(list.begin(), list.end(), [](const Link& c) { return c.socket.fd < 0; })) missing.push_back(q);
        }
        std::vector<int64_t> unproven, absent;
        for (int64_t q : missing) (refused.count(q) ? unproven : absent).push_back(q);
        if (!unproven.empty()) {
          throw PeerError("comm", fmt::format("group '{}' (rank {} of {}): rank(s) {} did not prove they hold the run's "
                                              "data-plane secret (a stranger, a worker of another run, or one with another "
                                              "join token or cluster.data_plane than '{}'): refused", prefix(), rank(),
                                              size(), fmt::join(unproven, ", "), plane_));
        }
        throw PeerError("comm", fmt::format("group '{}': rank(s) {} did not arrive within {} s (this is rank {} of {})",
                                            prefix(), fmt::join(absent, ", "), options_.timeout.count() / 1000.0, rank(),
                                            size()));
      }
      if (!wait_ready(listener.fd, POLLIN, std::min(deadline, Clock::now() + kAbortPoll))) continue;
      sockaddr_storage from{};
      socklen_t from_length = sizeof from;
      Socket s(::accept4(listener.fd, reinterpret_cast<sockaddr*>(&from), &from_length, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (s.fd < 0) continue;
      const auto address = address_of(from);
      {
        std::lock_guard lock(mutex);
        if (pending >= kMaxPendingHandshakes) {
          note(fmt::format("group '{}' (rank {}): a connection from {} closed unheard: {} others are proving membership "
                           "already", prefix(), rank(), address, pending));
          continue;
        }
        ++pending;
        proving.insert(s.fd);
      }
      handshakes.emplace_back([this, s = std::move(s), address, deadline, &mutex, &accepted, &pending, &refused,
                               &proving]() mutable {
        std::string why;
        int64_t claimed = -1;
        auto placed = accept_once(s, std::min(deadline, Clock::now() + kProofTimeout), why, claimed);
        std::lock_guard lock(mutex);
        --pending;
        proving.erase(s.fd);
        if (!placed) {
          if (claimed >= 0) refused.insert(claimed);
          note(fmt::format("group '{}' (rank {} of {}): a connection from {} {}: closed", prefix(), rank(), size(), address, why));
          return;
        }
        auto& slot = conns_[static_cast<size_t>(placed->first)][placed->second];
        if (slot.socket.fd >= 0) {
          note(fmt::format("group '{}' (rank {}): a second proven connection from {} for rank {}'s connection {}: closed",
                           prefix(), rank(), address, placed->first, placed->second));
          return;
        }
        slot.socket = std::move(s);
        slot.address = address;
        ++accepted;
      });
    }
    finish();
  }

  // One accepted connection's handshake: the (rank, index) it proved, or nullopt with `why`.
  std::optional<std::pair<int64_t, uint32_t>> accept_once(Socket& s, Clock::time_point deadline, std::string& why,
                                                          int64_t& claimed) {
    std::array<unsigned char, kHelloBytes> hello{};
    if (!read_exact(s.fd, hello.data(), hello.size(), deadline)) {
      why = "did not greet as a member within 5 s";
      return std::nullopt;
    }
    if (!std::equal(kGreeting.begin(), kGreeting.end(), hello.begin())) {
      why = "did not open with loco's greeting (no member of this run)";
      return std::nullopt;
    }
    const int64_t q = get32(hello.data() + 8);
    const uint32_t index = get32(hello.data() + 12);
    if (get32(hello.data() + 16) != static_cast<uint32_t>(size()) || q <= rank() || q >= size() ||
        index >= static_cast<uint32_t>(options_.connections)) {
      why = fmt::format("claimed rank {} (connection {}) of a group of {}, which this group has no place for", q, index,
                        get32(hello.data() + 16));
      return std::nullopt;
    }
    claimed = q;
    const std::string their_nonce(reinterpret_cast<const char*>(hello.data() + 20), sealing::kNonceBytes);
    const std::string nonce = random_bytes(sealing::kNonceBytes);
    std::array<unsigned char, kAnswerBytes> answer{};
    std::copy(kGreeting.begin(), kGreeting.end(), answer.begin());
    put32(answer.data() + 8, static_cast<uint32_t>(rank()));
    std::memcpy(answer.data() + 12, nonce.data(), nonce.size());
    const auto mine = proof("accept", rank(), q, index, nonce, their_nonce);
    std::memcpy(answer.data() + 12 + sealing::kNonceBytes, mine.data(), mine.size());
    std::array<unsigned char, kProofBytes> theirs{};
    if (!write_all(s.fd, answer.data(), answer.size(), deadline) || !read_exact(s.fd, theirs.data(), theirs.size(), deadline)) {
      why = fmt::format("claimed rank {} but closed, or did not prove it within 5 s", q);
      return std::nullopt;
    }
    if (!same_secret(std::string_view(reinterpret_cast<const char*>(theirs.data()), theirs.size()),
                     proof("connect", q, rank(), index, their_nonce, nonce))) {
      why = fmt::format("claimed rank {} but failed the membership proof (a stranger, a worker of another run, or one "
                        "with another join token or cluster.data_plane than '{}')", q, plane_);
      return std::nullopt;
    }
    return std::make_pair(q, index);
  }

  GroupOptions options_;
  std::string key_, plane_;
  std::atomic<bool> abandon_{false};
  std::vector<std::vector<Link>> conns_;  // by peer, then connection index (none for itself)
};

}  // namespace

std::vector<std::vector<Link>> form_links(KeyValueStore& store, const GroupOptions& options) {
  return Former(options).form(store);
}

}  // namespace loco::comm::tcp_transport
