// loco's own transport under the sealed data plane (comm/tcp_group.cpp; issue #69, H1) with ranks
// as threads on 127.0.0.1: messages arrive whole and in order over several connections; strangers
// at a rank's listening port (first to dial, with garbage, silence, a forged greeting) are closed
// and logged and the true peer takes its place; frames an on-path attacker injects or replays
// (a length of 2^40, a short one, a kind no frame has, a data frame repeated) fail the group with
// PeerError, and the process lives on to form the next one.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "comm/rank_threads.h"
#include "loco/comm/group.h"
#include "loco/core/error.h"

namespace loco::comm {
namespace tcp_test {  // named: unity builds compile it with sealed_group_test.cpp
namespace {

using testing_util::run_ranks;
using namespace std::chrono_literals;

const std::string kSecret(32, 't');

GroupOptions options_of(int64_t rank, int64_t size, const std::string& prefix, Duration timeout = 10s) {
  GroupOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  o.prefix = prefix;
  o.data_plane = DataPlane::kAuthenticated;
  o.secret = kSecret;
  return o;
}

torch::Tensor values(int64_t seed, int64_t n) { return torch::arange(n, torch::kFloat32) * 0.5 + static_cast<double>(seed); }

// The notes a transport writes (its refusals), kept for the test to read.
struct Notes {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& line) {
      std::lock_guard lock(mutex);
      lines.push_back(line);
    };
  }
  size_t count(const std::string& text) {
    std::lock_guard lock(mutex);
    return static_cast<size_t>(std::count_if(lines.begin(), lines.end(), [&](const auto& l) { return l.find(text) != std::string::npos; }));
  }
};

int dial(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
  return fd;
}

int port_in(const std::string& value) { return std::stoi(value.substr(value.rfind(' ') + 1)); }

TEST(TcpGroupTest, MessagesArriveWholeAndInOrderOverSeveralConnections) {
  auto store = std::make_shared<MemoryKeyValueStore>();
  auto results = run_ranks<bool>(3, [&](int64_t rank) {
    auto options = options_of(rank, 3, "order");
    options.connections = 3;
    auto group = connect_tcp(store, options);
    EXPECT_EQ(group->backend(), "loco-tcp");
    // Every rank sends every other rank 4 messages on each of 5 tags (one of them empty), posted
    // all at once; each must land in its own receive, in order.
    std::vector<std::unique_ptr<Posted>> posted;
    std::vector<std::tuple<int64_t, int64_t, int64_t, torch::Tensor>> in;  // (from, tag, i, buffer)
    std::vector<torch::Tensor> out;
    for (int64_t q = 0; q < 3; ++q) {
      if (q == rank) continue;
      for (int64_t tag = 0; tag < 5; ++tag) {
        for (int64_t i = 0; i < 4; ++i) {
          auto& buffer = std::get<3>(in.emplace_back(q, tag, i, torch::empty({tag == 4 ? 0 : 1000 * (i + 1)})));
          posted.push_back(group->post_recv(buffer, q, tag));
        }
      }
    }
    for (int64_t q = 0; q < 3; ++q) {
      if (q == rank) continue;
      for (int64_t tag = 0; tag < 5; ++tag) {
        for (int64_t i = 0; i < 4; ++i) {
          out.push_back(values(rank * 100 + tag * 10 + i, tag == 4 ? 0 : 1000 * (i + 1)));
          posted.push_back(group->post_send(out.back(), q, tag));
        }
      }
    }
    for (auto& p : posted) p->wait();
    for (const auto& [from, tag, i, buffer] : in) {
      EXPECT_TRUE(torch::equal(buffer, values(from * 100 + tag * 10 + i, tag == 4 ? 0 : 1000 * (i + 1))))
          << "from " << from << " tag " << tag << " message " << i;
    }
    return true;
  });
  for (const auto& r : results) ASSERT_FALSE(r.error) << r.message();
}

// A rank whose group ends (its process killed: the kernel closes its sockets) is seen by the others
// as a closed peer while nothing was pending between them, and their group lives on for the rest.
TEST(TcpGroupTest, ThePeersOfARankThatClosedItsConnectionsSeeItClosed) {
  auto store = std::make_shared<MemoryKeyValueStore>();
  std::mutex mutex;
  std::condition_variable changed;
  bool closed = false;
  int formed = 0;
  auto results = run_ranks<bool>(3, [&](int64_t rank) {
    auto options = options_of(rank, 3, "closed");
    options.connections = 2;
    auto group = connect_tcp(store, options);
    EXPECT_TRUE(group->closed_peers().empty());
    {
      std::unique_lock lock(mutex);
      ++formed;
      changed.notify_all();
      changed.wait(lock, [&] { return formed == 3; });
    }
    if (rank == 2) {
      group.reset();
      std::lock_guard lock(mutex);
      closed = true;
      changed.notify_all();
      return true;
    }
    {
      std::unique_lock lock(mutex);
      changed.wait(lock, [&] { return closed; });
    }
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (group->closed_peers().empty() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
    EXPECT_EQ(group->closed_peers(), std::vector<int64_t>{2});
    // Ranks 0 and 1 still exchange.
    auto out = values(rank, 100), in = torch::empty({100});
    group->send_recv(out, 1 - rank, in, 1 - rank, 0);
    EXPECT_TRUE(torch::equal(in, values(1 - rank, 100)));
    return true;
  });
  for (const auto& r : results) ASSERT_FALSE(r.error) << r.message();
}

// Strangers reach rank 0's listening port before rank 1 does: one sends garbage, one a greeting
// that claims rank 1 and then a wrong proof, one nothing at all. Each is closed and logged with its
// address; rank 1 then takes its place, and the two exchange a message.
TEST(TcpGroupTest, StrangersFirstAtTheListeningPortCannotTakeARanksPlace) {
  auto store = std::make_shared<MemoryKeyValueStore>();
  Notes notes;
  std::atomic<bool> strangers_done{false};
  std::thread strangers([&] {
    const auto where = store->get("race/tcp/0", 10s);
    ASSERT_TRUE(where.has_value());
    const int port = port_in(*where);
    const int garbage = dial(port), forged = dial(port), silent = dial(port);
    const std::string junk(4096, '\xff');
    EXPECT_GT(::send(garbage, junk.data(), junk.size(), MSG_NOSIGNAL), 0);
    // A greeting as a member's: "LOCOTCP1", rank 1, connection 0, size 2, a nonce; then a proof of
    // 32 zero bytes after reading the answer (76 bytes).
    std::string hello = "LOCOTCP1";
    for (uint32_t v : {1u, 0u, 2u}) hello += std::string(reinterpret_cast<const char*>(&v), 4);
    hello += std::string(32, 'n');
    EXPECT_EQ(::send(forged, hello.data(), hello.size(), MSG_NOSIGNAL), static_cast<ssize_t>(hello.size()));
    char answer[76];
    size_t got = 0;
    while (got < sizeof answer) {
      const ssize_t r = ::recv(forged, answer + got, sizeof answer - got, 0);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    EXPECT_EQ(got, sizeof answer) << "rank 0 answers a greeting with its proof";
    const std::string proof(32, '\0');
    ::send(forged, proof.data(), proof.size(), MSG_NOSIGNAL);
    // Rank 0 closes the garbage and the forged one (reads return 0 or fail) before rank 1 comes.
    for (int fd : {garbage, forged}) {
      pollfd p{fd, POLLIN, 0};
      EXPECT_EQ(::poll(&p, 1, 6000), 1);
      char byte;
      EXPECT_LE(::recv(fd, &byte, 1, 0), 0) << "a stranger's connection was kept";
    }
    strangers_done = true;
    std::this_thread::sleep_for(200ms);
    for (int fd : {garbage, forged, silent}) ::close(fd);
  });
  auto results = run_ranks<torch::Tensor>(2, [&](int64_t rank) {
    auto options = options_of(rank, 2, "race");
    if (rank == 0) options.log = notes.sink();
    if (rank == 1) {
      while (!strangers_done) std::this_thread::sleep_for(10ms);
    }
    Group group(seal(connect_tcp(store, options), options));
    auto t = values(rank, 500);
    group.all_reduce_sum(t);
    return t;
  });
  strangers.join();
  for (const auto& r : results) ASSERT_FALSE(r.error) << r.message();
  EXPECT_TRUE(torch::allclose(*results[0].value, values(0, 500) + values(1, 500)));
  EXPECT_EQ(notes.count("did not open with loco's greeting"), 1u);
  EXPECT_EQ(notes.count("claimed rank 1 but failed the membership proof"), 1u);
  // The silent one is closed once the group has formed, rather than after its 5 s.
  EXPECT_EQ(notes.count("did not greet as a member"), 1u);
  EXPECT_EQ(notes.count("from 127.0.0.1:"), 3u) << "each refusal names its address";
}

// An on-path attacker between rank 1 (which dials) and rank 0: a relay that passes the handshake
// (rank 1's 52-byte greeting and 32-byte proof) as it is, then hands each frame rank 1 sends to
// `alter`, which may send other bytes instead.
class Relay {
 public:
  using Alter = std::function<std::string(const std::string& frame)>;
  Relay(int target, Alter alter) : target_(target), alter_(std::move(alter)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listener_, 4);
    socklen_t n = sizeof a;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &n);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }
  int port() const { return port_; }

 private:
  void run() {
    pollfd p{listener_, POLLIN, 0};
    while (!stop_ && ::poll(&p, 1, 100) == 0) {
    }
    if (stop_) return;
    const int from = ::accept(listener_, nullptr, nullptr);
    const int to = dial(target_);
    std::string upstream;  // from rank 1, not yet passed on
    size_t handshake = 52 + 32;
    while (!stop_) {
      pollfd fds[2] = {{from, POLLIN, 0}, {to, POLLIN, 0}};
      if (::poll(fds, 2, 100) <= 0) continue;
      char buffer[1 << 16];
      if (fds[1].revents) {
        const ssize_t r = ::recv(to, buffer, sizeof buffer, 0);
        if (r <= 0) break;
        ::send(from, buffer, static_cast<size_t>(r), MSG_NOSIGNAL);
      }
      if (fds[0].revents) {
        const ssize_t r = ::recv(from, buffer, sizeof buffer, 0);
        if (r <= 0) break;
        upstream.append(buffer, static_cast<size_t>(r));
      }
      if (handshake > 0 && !upstream.empty()) {  // passed on as it comes (the greeting waits for an answer)
        const size_t n = std::min(handshake, upstream.size());
        ::send(to, upstream.data(), n, MSG_NOSIGNAL);
        upstream.erase(0, n);
        handshake -= n;
      }
      while (handshake == 0 && upstream.size() >= 16) {
        uint64_t length = 0;
        std::memcpy(&length, upstream.data() + 8, 8);
        const size_t whole = 16 + (upstream[0] == 2 ? static_cast<size_t>(length) : 0);
        if (upstream.size() < whole) break;
        const auto sent = alter_(upstream.substr(0, whole));
        upstream.erase(0, whole);
        ::send(to, sent.data(), sent.size(), MSG_NOSIGNAL);
      }
    }
    ::close(from);
    ::close(to);
  }

  int target_, listener_ = -1, port_ = 0;
  Alter alter_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A store that gives rank 1 the relay's address for rank 0's.
class Detour final : public KeyValueStore {
 public:
  Detour(std::shared_ptr<KeyValueStore> inner, std::function<std::string(const std::string&)> rewrite)
      : inner_(std::move(inner)), rewrite_(std::move(rewrite)) {}
  void set(const std::string& k, const std::string& v) override { inner_->set(k, v); }
  std::optional<std::string> get(const std::string& k, Duration t) override {
    auto v = inner_->get(k, t);
    return v ? std::optional(rewrite_(*v)) : v;
  }
  int64_t add(const std::string& k, int64_t d) override { return inner_->add(k, d); }
  bool check(const std::vector<std::string>& k) override { return inner_->check(k); }
  bool remove(const std::string& k) override { return inner_->remove(k); }
  int64_t size() override { return inner_->size(); }

 private:
  std::shared_ptr<KeyValueStore> inner_;
  std::function<std::string(const std::string&)> rewrite_;
};

std::string header(unsigned char kind, uint32_t tag, uint64_t length) {
  std::string h(16, '\0');
  h[0] = static_cast<char>(kind);
  std::memcpy(h.data() + 4, &tag, 4);
  std::memcpy(h.data() + 8, &length, 8);
  return h;
}

// Two ranks form a sealed group through a relay that alters rank 1's frames with `alter`, then sum
// twice. Returns each rank's outcome.
std::vector<testing_util::RankResult<torch::Tensor>> attacked(const std::string& prefix, Relay::Alter alter) {
  auto store = std::make_shared<MemoryKeyValueStore>();
  std::unique_ptr<Relay> relay;
  std::mutex mutex;
  auto detour = std::make_shared<Detour>(store, [&](const std::string& v) {
    std::lock_guard lock(mutex);
    if (!relay) relay = std::make_unique<Relay>(port_in(v), alter);
    return fmt::format("127.0.0.1 {}", relay->port());
  });
  auto results = run_ranks<torch::Tensor>(2, [&](int64_t rank) {
    auto options = options_of(rank, 2, prefix, 5s);
    Group group(seal(connect_tcp(rank == 1 ? std::static_pointer_cast<KeyValueStore>(detour) : store, options), options));
    auto t = values(rank, 3000);
    group.all_reduce_sum(t);
    auto u = values(rank + 2, 3000);
    group.all_reduce_sum(u);
    return u;
  });
  relay.reset();
  return results;
}

void expect_refused(const std::vector<testing_util::RankResult<torch::Tensor>>& results, const std::string& said) {
  ASSERT_TRUE(results[0].error) << "rank 0 took an attacker's frame";
  EXPECT_NO_THROW(try { std::rethrow_exception(results[0].error); } catch (const PeerError&) {});
  EXPECT_NE(results[0].message().find(said), std::string::npos) << results[0].message();
}

TEST(TcpGroupTest, WithoutAttackTheRelayedRunPasses) {
  const auto results = attacked("clean", [](const std::string& frame) { return frame; });
  for (const auto& r : results) ASSERT_FALSE(r.error) << r.message();
  EXPECT_TRUE(torch::allclose(*results[0].value, values(2, 3000) + values(3, 3000)));
}

TEST(TcpGroupTest, AnInjectedFrameOfAHugeLengthFailsTheGroupNotTheProcess) {
  std::atomic<bool> once{false};
  const auto results = attacked("huge", [&](const std::string& frame) {
    if (frame[0] != 2 || once.exchange(true)) return frame;
    return header(2, 0, uint64_t{1} << 40) + frame;  // before the first data frame
  });
  expect_refused(results, "1099511627776 bytes");
}

TEST(TcpGroupTest, AFrameFourBytesShortFailsAtOnceRatherThanStalling) {
  std::atomic<bool> once{false};
  const auto start = std::chrono::steady_clock::now();
  const auto results = attacked("short", [&](const std::string& frame) {
    if (frame[0] != 2 || frame.size() < 20 || once.exchange(true)) return frame;
    uint64_t length = 0;
    std::memcpy(&length, frame.data() + 8, 8);
    auto cut = frame.substr(0, frame.size() - 4);  // its tag as it was, its length and payload 4 bytes short
    length -= 4;
    std::memcpy(cut.data() + 8, &length, 8);
    return cut;
  });
  expect_refused(results, "for a receive of");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s) << "refused when it came, not after the timeout";
}

TEST(TcpGroupTest, AFrameOfNoKnownKindFailsTheGroup) {
  std::atomic<bool> once{false};
  const auto results = attacked("kind", [&](const std::string& frame) {
    if (once.exchange(true)) return frame;
    return header(7, 0, 0) + frame;
  });
  expect_refused(results, "none of this transport's");
}

TEST(TcpGroupTest, ADataFrameReplayedFailsTheGroupNotTheProcess) {
  std::atomic<int> data{0};
  const auto results = attacked("replay", [&](const std::string& frame) {
    if (frame[0] == 2 && data++ == 2) return frame + frame;  // the third data frame, twice
    return frame;
  });
  ASSERT_TRUE(results[0].error) << "rank 0 took a replayed frame";
  EXPECT_NO_THROW(try { std::rethrow_exception(results[0].error); } catch (const PeerError&) {});
}

// After any of these, the process forms the next group as ever.
TEST(TcpGroupTest, AfterAnAttackTheNextGroupForms) {
  attacked("before", [](const std::string& frame) { return frame[0] == 2 ? header(2, 0, 3) + frame : frame; });
  auto store = std::make_shared<MemoryKeyValueStore>();
  auto results = run_ranks<torch::Tensor>(2, [&](int64_t rank) {
    auto options = options_of(rank, 2, "after");
    Group group(seal(connect_tcp(store, options), options));
    auto t = values(rank, 100);
    group.all_reduce_sum(t);
    return t;
  });
  for (const auto& r : results) ASSERT_FALSE(r.error) << r.message();
}

}  // namespace
}  // namespace tcp_test
}  // namespace loco::comm
