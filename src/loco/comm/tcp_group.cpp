// loco's own transport for the sealed data plane (group.h, connect_tcp; docs/security.md, "The
// data plane"): point-to-point messages between the ranks of a group over TCP, under the seal
// (sealed_group.cpp), in place of Gloo's. Gloo parses every frame's preamble before loco's seal
// is looked at, and its checks abort the process from its event loop (issue #69, H1): a stranger
// racing a peer to its listening port, or one frame replayed or with a forged length, ended a
// worker. Here nothing a peer sends is parsed before the connection has proven membership, and
// nothing it sends afterwards can do more than fail this group with PeerError.
//
// Forming (tcp_connect.cpp): every connection proves membership before anything else is read
// from it; a stranger's is closed and logged, and cannot take a peer's place.
//
// Messages. Frames of a 16-byte header (kind, 3 zero bytes, tag, length; little-endian), then for
// a data frame the payload. A message travels as Gloo's do: the receiver announces each posted
// receive (kReady: its tag and length), and the sender sends the data only once it is announced,
// matched in order per (peer, tag). So every data frame lands in a buffer the receiver posted, of
// the length it posted: a frame no receive announced, a length other than the announced one, an
// unknown kind or a nonzero pad fails the group with PeerError, and nothing is read past it. A
// message's tag picks its connection (tag mod connections): messages of one tag stay in order.
//
// One I/O thread per group moves every frame (poll() over its nonblocking sockets and a wake-up
// pipe). A wait that times out or is abandoned fails the whole group, and returns only once the
// I/O thread has stopped touching any buffer: after PeerError the group is unusable (group.h).
//
// It carries point-to-point messages only: a sealed group builds its collectives from them.
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "loco/comm/group.h"
#include "loco/comm/tcp_transport.h"
#include "loco/core/error.h"

namespace loco::comm {
namespace tcp_transport {  // named: unity builds compile it with gloo_group.cpp and sealed_group.cpp
namespace {

// Receives one peer may announce ahead of this rank's sends on one tag.
constexpr size_t kMaxAnnounced = 1 << 16;
constexpr size_t kHeaderBytes = 16;
constexpr unsigned char kReady = 1, kData = 2;

int64_t payload_bytes(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }


class TcpGroup final : public PostingGroupImpl {
 public:
  TcpGroup(std::shared_ptr<KeyValueStore> store, const GroupOptions& options) : options_(options) {
    auto links = form_links(*store, options);
    conns_.resize(links.size());
    for (size_t q = 0; q < links.size(); ++q) {
      conns_[q].resize(links[q].size());
      for (size_t c = 0; c < links[q].size(); ++c) {
        conns_[q][c].socket = std::move(links[q][c].socket);
        conns_[q][c].address = std::move(links[q][c].address);
      }
    }
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) throw PeerError("comm", fmt::format("group '{}': cannot make a pipe: {}", prefix(), errno_text()));
    wake_read_ = Socket(pipe_fds[0]);
    wake_write_ = Socket(pipe_fds[1]);
    set_nonblocking(wake_read_.fd);
    set_nonblocking(wake_write_.fd);
    io_ = std::thread([this] { io_loop(); });
  }

  ~TcpGroup() override {
    {
      std::unique_lock lock(mutex_);
      fail_locked("the group was closed");
      stopped_.wait(lock, [&] { return io_stopped_; });
    }
    if (io_.joinable()) io_.join();
  }

  int64_t rank() const override { return options_.rank; }
  int64_t size() const override { return options_.size; }
  std::string backend() const override { return "loco-tcp"; }

  CommStats all_reduce_sum(std::vector<torch::Tensor>&) override { throw point_to_point_only("an all-reduce"); }
  CommStats broadcast(torch::Tensor&, int64_t) override { throw point_to_point_only("a broadcast"); }
  CommStats all_gather(const torch::Tensor&, std::vector<torch::Tensor>&) override { throw point_to_point_only("an all-gather"); }

  std::vector<int64_t> closed_peers() const override {
    std::lock_guard lock(mutex_);
    std::vector<int64_t> closed;
    for (size_t q = 0; q < conns_.size(); ++q) {
      if (std::any_of(conns_[q].begin(), conns_[q].end(), [](const Connection& c) { return c.closed; })) {
        closed.push_back(static_cast<int64_t>(q));
      }
    }
    return closed;
  }

  std::unique_ptr<Posted> post_send(const torch::Tensor& tensor, int64_t peer, int64_t tag) override {
    auto op = make_op(tensor, peer, tag, /*sending=*/true);
    std::lock_guard lock(mutex_);
    check_open(peer, tag);
    throw_if_failed();
    sends_[{peer, tag}].push_back(op);
    match(peer, tag);
    wake();
    return std::make_unique<Waiting>(*this, op);
  }
  std::unique_ptr<Posted> post_recv(torch::Tensor& tensor, int64_t peer, int64_t tag) override {
    auto op = make_op(tensor, peer, tag, /*sending=*/false);
    std::lock_guard lock(mutex_);
    check_open(peer, tag);
    throw_if_failed();
    receives_[{peer, tag}].push_back(op);
    Out ready;
    header(ready.header, kReady, tag, static_cast<uint64_t>(op->bytes));
    connection(peer, tag).out.push_back(std::move(ready));
    wake();
    return std::make_unique<Waiting>(*this, op);
  }

 private:
  struct Op {
    torch::Tensor tensor;  // keeps the buffer alive while the I/O thread may touch it
    unsigned char* data = nullptr;
    int64_t bytes = 0, peer = 0, tag = 0;
    bool sending = false, done = false;
    Clock::time_point begin = Clock::now();
  };
  // One frame (or its part not yet written) to write on a connection.
  struct Out {
    std::array<unsigned char, kHeaderBytes> header{};
    std::shared_ptr<Op> op;  // a data frame's: its payload follows, and it completes the send
    uint64_t written = 0;    // of the header and payload together
  };
  struct Connection {
    Socket socket;
    std::string address;
    std::deque<Out> out;
    std::array<unsigned char, kHeaderBytes> header{};
    size_t header_read = 0;
    std::shared_ptr<Op> reading;  // the receive whose payload is coming in
    uint64_t payload_read = 0;
    bool closed = false;  // the peer closed it (or it failed)
  };

  // A posted operation's wait (see Posted): bounded by the group's timeout from when it begins.
  class Waiting final : public Posted {
   public:
    Waiting(TcpGroup& group, std::shared_ptr<Op> op) : group_(group), op_(std::move(op)) {}
    CommStats wait() override { return group_.wait(*op_); }

   private:
    TcpGroup& group_;
    std::shared_ptr<Op> op_;
  };

  std::string prefix() const { return options_.prefix; }

  Error point_to_point_only(const char* what) const {
    return InternalError("comm", fmt::format("group '{}': loco's transport carries point-to-point messages only, and {} "
                                             "is built from them by the sealed group above it", prefix(), what));
  }

  std::shared_ptr<Op> make_op(const torch::Tensor& tensor, int64_t peer, int64_t tag, bool sending) const {
    LOCO_CHECK(peer >= 0 && peer < size() && peer != rank(), "a message to or from rank {} in a group of {} (this is rank {})",
               peer, size(), rank());
    LOCO_CHECK(tag >= 0 && tag <= INT32_MAX, "a message tag of {} does not fit the frame's 32 bits", tag);
    LOCO_CHECK(tensor.is_contiguous() && tensor.device().is_cpu(), "a message's tensor must be a contiguous CPU tensor");
    auto op = std::make_shared<Op>();
    op->tensor = tensor;
    op->data = static_cast<unsigned char*>(tensor.data_ptr());
    op->bytes = payload_bytes(tensor);
    op->peer = peer;
    op->tag = tag;
    op->sending = sending;
    return op;
  }

  static void header(std::array<unsigned char, kHeaderBytes>& h, unsigned char kind, int64_t tag, uint64_t length) {
    h.fill(0);
    h[0] = kind;
    put32(h.data() + 4, static_cast<uint32_t>(tag));
    put64(h.data() + 8, length);
  }

  Connection& connection(int64_t peer, int64_t tag) {
    auto& list = conns_[static_cast<size_t>(peer)];
    return list[static_cast<size_t>(tag) % list.size()];
  }

  // ---- moving messages --------------------------------------------------------------------------

  // Pairs this rank's sends to `peer` with `tag` with the receives `peer` announced, in order.
  void match(int64_t peer, int64_t tag) {
    auto& sends = sends_[{peer, tag}];
    auto& announced = announced_[{peer, tag}];
    while (!sends.empty() && !announced.empty() && !failed_) {
      auto op = sends.front();
      const uint64_t length = announced.front();
      sends.pop_front();
      announced.pop_front();
      if (length != static_cast<uint64_t>(op->bytes)) {
        fail_locked(fmt::format("rank {} announced a receive of {} bytes with tag {}, and this rank sends {}: the ranks "
                                "disagree on this operation's size or order", peer, length, tag, op->bytes));
        return;
      }
      Out data;
      header(data.header, kData, tag, length);
      data.op = std::move(op);
      connection(peer, tag).out.push_back(std::move(data));
    }
  }

  void wake() {
    const unsigned char byte = 1;
    [[maybe_unused]] const auto n = ::write(wake_write_.fd, &byte, 1);  // a full pipe wakes it already
  }

  void io_loop() {
    std::vector<pollfd> fds;
    std::vector<std::pair<int64_t, size_t>> which;  // fds[i + 1]'s connection
    std::unique_lock lock(mutex_);
    while (!failed_) {
      fds.assign(1, pollfd{wake_read_.fd, POLLIN, 0});
      which.clear();
      for (size_t q = 0; q < conns_.size(); ++q) {
        for (size_t c = 0; c < conns_[q].size(); ++c) {
          const auto& conn = conns_[q][c];
          fds.push_back({conn.socket.fd, static_cast<short>(POLLIN | (conn.out.empty() ? 0 : POLLOUT)), 0});
          which.emplace_back(static_cast<int64_t>(q), c);
        }
      }
      lock.unlock();
      const int n = ::poll(fds.data(), fds.size(), static_cast<int>(kAbortPoll.count()));
      lock.lock();
      if (failed_) break;
      if (n < 0 && errno != EINTR) {
        fail_locked(fmt::format("poll: {}", errno_text()));
        break;
      }
      if (fds[0].revents != 0) {
        unsigned char drain[256];
        while (::read(wake_read_.fd, drain, sizeof drain) > 0) {
        }
      }
      for (size_t i = 1; i < fds.size() && !failed_; ++i) {
        if (fds[i].revents == 0) continue;
        const auto [q, c] = which[i - 1];
        auto& conn = conns_[static_cast<size_t>(q)][c];
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_some(lock, q, conn);
        if (!failed_ && (fds[i].revents & POLLOUT)) write_some(lock, q, conn);
      }
      // A wait's own failure (a timeout, an abort) ends the loop at the top.
    }
    for (auto& list : conns_) {
      for (auto& conn : list) conn.socket.reset();
    }
    io_stopped_ = true;
    stopped_.notify_all();
    done_.notify_all();
  }

  // Runs a socket call with the group's lock released, so that posting and waiting threads (the
  // seal's crypto) go on meanwhile. Only this thread touches a connection's read state, its
  // socket and the front of its queue (a deque: the callers' push_back leaves it where it is).
  template <class Call>
  static ssize_t unlocked(std::unique_lock<std::mutex>& lock, Call&& call) {
    lock.unlock();
    const ssize_t r = call();
    const int error = errno;
    lock.lock();
    errno = error;
    return r;
  }

  void read_some(std::unique_lock<std::mutex>& lock, int64_t q, Connection& conn) {
    for (int reads = 0; reads < 64 && !failed_; ++reads) {
      if (conn.reading) {
        auto& op = *conn.reading;
        const auto want = static_cast<size_t>(std::min<uint64_t>(static_cast<uint64_t>(op.bytes) - conn.payload_read, 4 << 20));
        unsigned char* into = op.data + conn.payload_read;
        const ssize_t r = want == 0 ? 0 : unlocked(lock, [&] { return ::recv(conn.socket.fd, into, want, 0); });
        if (want > 0 && !received(q, conn, r)) return;
        if (want > 0) conn.payload_read += static_cast<uint64_t>(r);
        if (conn.payload_read == static_cast<uint64_t>(op.bytes)) {
          op.done = true;
          conn.reading.reset();
          done_.notify_all();
        }
        continue;
      }
      const ssize_t r = unlocked(lock, [&] {
        return ::recv(conn.socket.fd, conn.header.data() + conn.header_read, kHeaderBytes - conn.header_read, 0);
      });
      if (!received(q, conn, r)) return;
      conn.header_read += static_cast<size_t>(r);
      if (conn.header_read < kHeaderBytes) continue;
      conn.header_read = 0;
      frame(q, conn);
    }
  }

  // After a recv() of `r`: true when bytes came; false when there are none now (EAGAIN) or the
  // connection failed (the group then fails).
  bool received(int64_t q, Connection& conn, ssize_t r) {
    if (r > 0) return true;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    if (r == 0 && conn.header_read == 0 && !conn.reading) {
      // Between frames: a peer done with this group closes it (its last operation ended before
      // this rank's did). Only what is still to pass between the two fails.
      conn.socket.reset();
      conn.closed = true;
      if (pending_on(q, conn)) fail_locked(fmt::format("rank {} ({}) closed its connection", q, conn.address));
      return false;
    }
    conn.closed = true;
    fail_locked(r == 0 ? fmt::format("rank {} ({}) closed its connection in the middle of a frame", q, conn.address)
                       : fmt::format("rank {} ({}): {}", q, conn.address, errno_text()));
    return false;
  }

  // Whether anything is still to pass on `conn`, one of `peer`'s connections (the others carry
  // their own tags, and close after their last bytes).
  bool pending_on(int64_t peer, Connection& conn) {
    if (!conn.out.empty() || conn.reading) return true;
    for (const auto* queues : {&sends_, &receives_}) {
      for (const auto& [channel, ops] : *queues) {
        if (channel.first == peer && !ops.empty() && &connection(peer, channel.second) == &conn) return true;
      }
    }
    return false;
  }

  // A new operation on a connection its peer closed fails the group.
  void check_open(int64_t peer, int64_t tag) {
    const auto& conn = connection(peer, tag);
    if (conn.closed) fail_locked(fmt::format("rank {} ({}) had closed its connection", peer, conn.address));
  }

  // A whole header has come from rank `q`.
  void frame(int64_t q, Connection& conn) {
    const auto& h = conn.header;
    const unsigned char kind = h[0];
    const int64_t tag = get32(h.data() + 4);
    const uint64_t length = get64(h.data() + 8);
    if (h[1] != 0 || h[2] != 0 || h[3] != 0 || (kind != kReady && kind != kData)) {
      fail_locked(fmt::format("rank {} ({}) sent a frame that is none of this transport's (kind {}): refused", q, conn.address,
                              static_cast<int>(kind)));
      return;
    }
    if (&connection(q, tag) != &conn) {
      fail_locked(fmt::format("rank {} ({}) sent a frame with tag {} on another connection than that tag's: refused", q,
                              conn.address, tag));
      return;
    }
    if (kind == kReady) {
      auto& announced = announced_[{q, tag}];
      if (announced.size() >= kMaxAnnounced) {
        fail_locked(fmt::format("rank {} ({}) announced more than {} receives with tag {} ahead of this rank's sends", q,
                                conn.address, kMaxAnnounced, tag));
        return;
      }
      announced.push_back(length);
      match(q, tag);
      return;
    }
    auto& receives = receives_[{q, tag}];
    if (receives.empty()) {
      fail_locked(fmt::format("rank {} ({}) sent {} bytes with tag {} that no receive announced (a frame replayed or "
                              "injected on the way): refused", q, conn.address, length, tag));
      return;
    }
    if (length != static_cast<uint64_t>(receives.front()->bytes)) {
      fail_locked(fmt::format("rank {} ({}) sent {} bytes with tag {} for a receive of {} bytes (a frame altered on the "
                              "way, or the ranks disagree on this operation's size): refused", q, conn.address, length,
                              tag, receives.front()->bytes));
      return;
    }
    conn.reading = receives.front();
    receives.pop_front();
    conn.payload_read = 0;
    if (conn.reading->bytes == 0) {
      conn.reading->done = true;
      conn.reading.reset();
      done_.notify_all();
    }
  }

  void write_some(std::unique_lock<std::mutex>& lock, int64_t q, Connection& conn) {
    while (!conn.out.empty() && !failed_) {
      auto& out = conn.out.front();
      const uint64_t payload = out.op ? static_cast<uint64_t>(out.op->bytes) : 0;
      const uint64_t total = kHeaderBytes + payload;
      ssize_t w;
      if (out.written < kHeaderBytes) {
        iovec parts[2] = {{out.header.data() + out.written, kHeaderBytes - out.written},
                          {out.op ? out.op->data : nullptr, static_cast<size_t>(payload)}};
        msghdr message{};
        message.msg_iov = parts;
        message.msg_iovlen = payload > 0 ? 2 : 1;
        w = unlocked(lock, [&] { return ::sendmsg(conn.socket.fd, &message, MSG_NOSIGNAL); });
      } else {
        const uint64_t at = out.written - kHeaderBytes;
        const auto n = static_cast<size_t>(std::min<uint64_t>(payload - at, 4 << 20));
        w = unlocked(lock, [&] { return ::send(conn.socket.fd, out.op->data + at, n, MSG_NOSIGNAL); });
      }
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        fail_locked(fmt::format("rank {} ({}): {}", q, conn.address, errno_text()));
        return;
      }
      out.written += static_cast<uint64_t>(w);
      if (out.written < total) continue;
      if (out.op) {
        out.op->done = true;
        done_.notify_all();
      }
      conn.out.pop_front();
    }
  }

  // ---- waiting and failing ----------------------------------------------------------------------

  CommStats wait(Op& op) {
    const auto begin = Clock::now();
    const auto deadline = begin + options_.timeout;
    std::unique_lock lock(mutex_);
    while (!op.done && !failed_) {
      done_.wait_until(lock, std::min(deadline, Clock::now() + kAbortPoll));
      if (op.done || failed_) break;
      if (options_.abort) {
        lock.unlock();
        bool abort = false;
        try {
          abort = options_.abort();
        } catch (const std::exception&) {  // a hook that fails cannot say: the wait goes on to its timeout
        }
        lock.lock();
        if (abort && !op.done) fail_locked("abandoned: a member of this group failed");
      }
      if (!op.done && Clock::now() >= deadline) {
        fail_locked(fmt::format("timed out after {:.1f} s", std::chrono::duration<double>(Clock::now() - begin).count()));
      }
    }
    if (op.done) return op.sending ? CommStats{op.bytes, 0, 0, 2} : CommStats{0, op.bytes, 0, 2};
    stopped_.wait(lock, [&] { return io_stopped_; });  // no buffer is touched after this
    const double elapsed = std::chrono::duration<double>(Clock::now() - op.begin).count();
    throw PeerError("comm", fmt::format("{} {} bytes {} rank {} in group '{}' (rank {} of {}) failed after {:.1f} s: {}",
                                        op.sending ? "sending" : "receiving", op.bytes, op.sending ? "to" : "from", op.peer,
                                        prefix(), rank(), size(), elapsed, failure_));
  }

  void throw_if_failed() const {
    if (failed_) throw PeerError("comm", fmt::format("group '{}' (rank {} of {}) failed before: {}", prefix(), rank(), size(), failure_));
  }

  void fail_locked(const std::string& why) {
    if (!failed_) {
      failed_ = true;
      failure_ = why;
    }
    if (wake_write_.fd >= 0) wake();
    done_.notify_all();
  }

  GroupOptions options_;
  std::vector<std::vector<Connection>> conns_;  // by peer, then connection index (none for itself)

  mutable std::mutex mutex_;  // guards everything below, and the connections once the I/O thread runs
  std::condition_variable done_, stopped_;
  bool failed_ = false, io_stopped_ = false;
  std::string failure_;
  using Channel = std::pair<int64_t, int64_t>;  // (peer, tag)
  std::map<Channel, std::deque<std::shared_ptr<Op>>> sends_, receives_;  // posted, not yet under way
  std::map<Channel, std::deque<uint64_t>> announced_;                    // the peer's receives' lengths
  Socket wake_read_, wake_write_;
  std::thread io_;
};

}  // namespace
}  // namespace tcp_transport

std::shared_ptr<GroupImpl> connect_tcp(std::shared_ptr<KeyValueStore> store, const GroupOptions& options) {
  options.validate();
  LOCO_CHECK(options.data_plane != DataPlane::kOpen, "loco's transport is for a sealed data plane (it proves membership)");
  return std::make_shared<tcp_transport::TcpGroup>(std::move(store), options);
}

}  // namespace loco::comm
