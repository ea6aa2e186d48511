#include "loco/runtime/launch/link_check.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <future>
#include <latch>
#include <thread>

#include "loco/comm/encoding.h"
#include "loco/comm/key_value.h"
#include "loco/core/error.h"

namespace loco::runtime {

ExchangeMeasurement measure_exchange(const Islands& islands, const ExchangeCheck& check) {
  const auto m = static_cast<int64_t>(islands.size());
  LOCO_CHECK(m >= 2 && check.values >= 1 && check.rounds >= 1, "measure_exchange: {} ranks, {} values, {} rounds", m,
             check.values, check.rounds);
  auto store = std::make_shared<comm::MemoryKeyValueStore>();
  std::barrier start(m);
  std::vector<std::vector<double>> seconds(static_cast<size_t>(m));
  std::vector<ExchangeMeasurement> out(static_cast<size_t>(m));
  std::vector<std::exception_ptr> failures(static_cast<size_t>(m));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < m; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<size_t>(r);
      // A rank that fails leaves the barrier, so that none waits for it.
      int arrived = 0;
      try {
        islands.enter(i);
        comm::GroupOptions options;
        options.rank = r;
        options.size = m;
        options.host = islands.address(i);
        options.timeout = std::chrono::seconds(120);
        options.connections = check.connections;
        options.prefix = "exchange-check";
        auto group = comm::Group::connect(store, options);
        out[i].round_trip_s = group.link().round_trip_s;
        // Each rank's values from a generator of its own (the global one is shared by the rank threads).
        const auto input = torch::randn({check.values}, at::detail::createCPUGenerator(static_cast<uint64_t>(r) + 1)) * 1e-3;
        for (int round = 0; round <= check.rounds; ++round) {
          auto t = input.clone();
          start.arrive_and_wait();
          ++arrived;
          const auto begin = std::chrono::steady_clock::now();
          const auto stats = check.gloo_ring ? group.all_reduce_sum(t)
                                             : group.all_reduce_sum(t, comm::ReduceOptions{check.encoding, check.algorithm});
          if (round > 0) seconds[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
          out[i].bytes_sent = stats.bytes_sent;
          out[i].route = stats.route;
        }
      } catch (...) {
        failures[i] = std::current_exception();
      }
      if (arrived <= check.rounds) start.arrive_and_drop();  // this and every later round go on without it
      islands.leave();
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
  // A round lasts as long as its slowest rank; the median over rounds.
  std::vector<double> rounds;
  for (int k = 0; k < check.rounds; ++k) {
    double slowest = 0;
    for (const auto& s : seconds) slowest = std::max(slowest, s[static_cast<size_t>(k)]);
    rounds.push_back(slowest);
  }
  std::sort(rounds.begin(), rounds.end());
  ExchangeMeasurement result = out[0];
  result.median_s = rounds[rounds.size() / 2];
  return result;
}

void set_exchange(ExchangeCheck& check, const std::string& exchange, const std::string& algorithm) {
  check.gloo_ring = exchange == "gloo-ring";
  if (!check.gloo_ring) {
    const auto encoding = comm::parse_encoding(exchange);
    if (!encoding) {
      throw ConfigError("link-check", fmt::format("--exchange '{}' is not an encoding (fp32, bf16, fp8, e3m0, int8, int4) nor "
                                                  "gloo-ring", exchange));
    }
    check.encoding = *encoding;
  }
  if (algorithm == "gather") {
    check.algorithm = comm::ReduceAlgorithm::kGather;
  } else if (algorithm == "scatter") {
    check.algorithm = comm::ReduceAlgorithm::kScatter;
  } else if (algorithm == "ring") {
    check.algorithm = comm::ReduceAlgorithm::kRing;
  } else if (algorithm == "auto") {
    check.algorithm = comm::ReduceAlgorithm::kAuto;
  } else {
    throw ConfigError("link-check", fmt::format("--algorithm '{}' is not auto, gather, scatter or ring", algorithm));
  }
}

namespace {

using Clock = std::chrono::steady_clock;

void set_timeouts(int fd, double seconds) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void send_all(int fd, const void* data, size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n <= 0) throw Error("link", fmt::format("measuring the link: send: {}", n == 0 ? "closed" : std::strerror(errno)));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void receive_all(int fd, void* data, size_t size) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n <= 0) throw Error("link", fmt::format("measuring the link: receive: {}", n == 0 ? "closed" : std::strerror(errno)));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

// A socket closed when it goes out of scope, however the measurement ends.
struct Socket {
  int fd = -1;
  explicit Socket(int descriptor) : fd(descriptor) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
};

sockaddr_in socket_address(const std::string& host, int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &address.sin_addr);
  return address;
}

// The receiving end of measure_link, in island `to`: echoes `pings` pings, then times the bulk
// transfer (its last three quarters) and sends its rate back. Whatever it throws before it listens
// reaches the caller through `listening`.
double receive_measurement(const Islands& islands, size_t to, int64_t bulk_bytes, int pings, std::promise<int>& listening) {
  std::optional<Socket> server;
  try {
    islands.enter(to);
    server.emplace(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in address = socket_address(islands.address(to), 0);
    socklen_t length = sizeof address;
    if (server->fd < 0 || ::bind(server->fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(server->fd, 1) != 0 || ::getsockname(server->fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      throw Error("link", fmt::format("measuring the link: listen: {}", std::strerror(errno)));
    }
    listening.set_value(ntohs(address.sin_port));
  } catch (...) {
    listening.set_exception(std::current_exception());
    return 0;
  }
  pollfd wait{server->fd, POLLIN, 0};
  Socket peer(::poll(&wait, 1, 60000) == 1 ? ::accept4(server->fd, nullptr, nullptr, SOCK_CLOEXEC) : -1);
  if (peer.fd < 0) throw Error("link", "measuring the link: no connection within 60 s");
  set_timeouts(peer.fd, 120);
  const int on = 1;
  ::setsockopt(peer.fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  char byte = 0;
  for (int i = 0; i < pings; ++i) {
    receive_all(peer.fd, &byte, 1);
    send_all(peer.fd, &byte, 1);
  }
  std::vector<char> chunk(1 << 20);
  int64_t received = 0, at_quarter = -1;
  Clock::time_point quarter, end;
  while (received < bulk_bytes) {
    const ssize_t n = ::recv(peer.fd, chunk.data(),
                             static_cast<size_t>(std::min<int64_t>(bulk_bytes - received, static_cast<int64_t>(chunk.size()))), 0);
    if (n <= 0) throw Error("link", "measuring the link: the transfer broke off");
    received += n;
    end = Clock::now();
    if (at_quarter < 0 && received >= bulk_bytes / 4) at_quarter = received, quarter = end;
  }
  const double seconds = std::chrono::duration<double>(end - quarter).count();
  const double rate = seconds > 0 ? static_cast<double>(received - at_quarter) * 8 / seconds : INFINITY;
  send_all(peer.fd, &rate, sizeof rate);
  return rate;
}

// Counts a latch down once: when told, or at the latest when it goes out of scope, so that however
// a sender ends, no other sender waits for it forever.
struct Arrival {
  std::latch& latch;
  bool arrived = false;
  void arrive() {
    if (!arrived) latch.count_down(), arrived = true;
  }
  ~Arrival() { arrive(); }
};

// The sending end, in island `from`: `pings` round trips, then the bulk transfer; the receiver
// answers its rate. With several flows, every sender pings before any starts its transfer
// (`pinged`). Its socket closes on any error, which ends the receiver's wait at once.
LinkMeasurement send_measurement(const Islands& islands, size_t from, size_t to, int port, int64_t bulk_bytes, int pings,
                                 std::latch& pinged) {
  Arrival arrival{pinged};
  islands.enter(from);
  Socket socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  set_timeouts(socket.fd, 120);
  const sockaddr_in address = socket_address(islands.address(to), port);
  if (socket.fd < 0 || ::connect(socket.fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    throw Error("link", fmt::format("measuring the link: connect to {}: {}", islands.address(to), std::strerror(errno)));
  }
  const int on = 1;
  ::setsockopt(socket.fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  std::vector<double> trips;
  char byte = 'p';
  for (int i = 0; i < pings; ++i) {
    const auto start = Clock::now();
    send_all(socket.fd, &byte, 1);
    receive_all(socket.fd, &byte, 1);
    trips.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  arrival.arrive();
  pinged.wait();
  std::vector<char> chunk(1 << 20, 'x');
  for (int64_t sent = 0; sent < bulk_bytes;) {
    const auto n = static_cast<size_t>(std::min<int64_t>(bulk_bytes - sent, static_cast<int64_t>(chunk.size())));
    send_all(socket.fd, chunk.data(), n);
    sent += static_cast<int64_t>(n);
  }
  LinkMeasurement result;
  receive_all(socket.fd, &result.rate_bps, sizeof result.rate_bps);
  std::nth_element(trips.begin(), trips.begin() + static_cast<std::ptrdiff_t>(trips.size() / 2), trips.end());
  result.round_trip_s = trips[trips.size() / 2];
  result.bytes = bulk_bytes;
  return result;
}

}  // namespace

LinkMeasurement measure_link(const Islands& islands, size_t from, size_t to, int64_t bulk_bytes, int pings) {
  return measure_links(islands, {{from, to}}, bulk_bytes, pings).front();
}

std::vector<LinkMeasurement> measure_links(const Islands& islands, const std::vector<std::pair<size_t, size_t>>& flows,
                                           int64_t bulk_bytes, int pings) {
  LOCO_CHECK(!flows.empty(), "measure_links: no flows");
  for (const auto& [from, to] : flows) {
    LOCO_CHECK(from < islands.size() && to < islands.size() && from != to, "measure_link: islands {} and {} of {}", from, to, islands.size());
  }
  LOCO_CHECK(bulk_bytes >= 1024 && pings >= 1, "measure_link: {} bytes, {} pings", bulk_bytes, pings);
  // Each end on a thread of its own, so that the caller's namespace is untouched.
  const size_t n = flows.size();
  std::vector<std::promise<int>> listening(n);
  std::vector<std::future<double>> receivers;
  std::exception_ptr failure;
  const auto keep_first = [&](auto&& get) {
    try {
      get();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  };
  std::vector<int> ports(n, 0);
  for (size_t i = 0; i < n; ++i) {
    auto port = listening[i].get_future();
    receivers.push_back(std::async(std::launch::async, [&, i] {
      return receive_measurement(islands, flows[i].second, bulk_bytes, pings, listening[i]);
    }));
    keep_first([&] { ports[i] = port.get(); });
    if (failure) break;
  }
  std::vector<LinkMeasurement> results(n);
  if (!failure) {
    std::latch pinged(static_cast<std::ptrdiff_t>(n));
    std::vector<std::future<LinkMeasurement>> senders;
    for (size_t i = 0; i < n; ++i) {
      senders.push_back(std::async(std::launch::async, [&, i] {
        return send_measurement(islands, flows[i].first, flows[i].second, ports[i], bulk_bytes, pings, pinged);
      }));
    }
    for (size_t i = 0; i < n; ++i) keep_first([&] { results[i] = senders[i].get(); });
  }
  // A receiver whose sender failed ends when its connection closes, or at its own timeout.
  for (auto& receiver : receivers) keep_first([&] { receiver.get(); });
  if (failure) std::rethrow_exception(failure);
  return results;
}

}  // namespace loco::runtime
