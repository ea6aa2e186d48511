#include "loco/runtime/launch/islands.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <tuple>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <future>
#include <latch>
#include <map>
#include <optional>
#include <queue>
#include <set>

#include "loco/core/error.h"

namespace loco::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// The capability bits of this process's effective set (/proc/self/status, CapEff).
uint64_t effective_capabilities() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  }
  return 0;
}

constexpr int kCapNetAdmin = 12, kCapSysAdmin = 21;

int open_namespace(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("link", fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  return fd;
}

void set_namespace(int fd) {
  if (::setns(fd, CLONE_NEWNET) != 0) throw Error("link", fmt::format("setns: {}", std::strerror(errno)));
}

// A new, empty network namespace, held by the returned descriptor; the calling thread stays where it was.
int new_namespace(int original_fd) {
  if (::unshare(CLONE_NEWNET) != 0) {
    throw Error("link", fmt::format("cannot create a network namespace: {}", std::strerror(errno)));
  }
  const int fd = open_namespace("/proc/thread-self/ns/net");
  set_namespace(original_fd);
  return fd;
}

// The absolute path of iproute2's `ip` or `tc`, from the system's own folders and never from PATH:
// this runs as root, where a PATH entry writable by someone else would run their program.
std::string system_tool(const std::string& name) {
  for (const char* folder : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) {
    const std::string path = std::string(folder) + "/" + name;
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  throw Error("link", fmt::format("'{}' is not in /usr/sbin, /sbin, /usr/bin or /bin; hint: apt-get install iproute2", name));
}

// Runs argv (argv[0] one of the system's tools) inside the namespace `netns_fd`, with `pass_fd` (if
// >= 0) left open across exec so the command can name it as /proc/self/fd/N; throws Error with its
// stderr on failure.
void run_in(int netns_fd, std::vector<std::string> argv, int pass_fd = -1) {
  argv[0] = system_tool(argv[0]);
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw Error("link", fmt::format("pipe: {}", std::strerror(errno)));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(err_pipe[1], 2);
    if (pass_fd >= 0) ::fcntl(pass_fd, F_SETFD, 0);
    if (::setns(netns_fd, CLONE_NEWNET) != 0) ::_exit(126);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(err_pipe[1]);
  std::string err;
  char chunk[4096];
  for (ssize_t n; (n = ::read(err_pipe[0], chunk, sizeof chunk)) > 0;) err.append(chunk, static_cast<size_t>(n));
  ::close(err_pipe[0]);
  int raw = 0;
  if (pid < 0 || ::waitpid(pid, &raw, 0) != pid || !WIFEXITED(raw) || WEXITSTATUS(raw) != 0) {
    std::string command;
    for (const auto& a : argv) command += (command.empty() ? "" : " ") + a;
    const int code = pid > 0 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    throw Error("link", fmt::format("`{}` failed{}: {}", command,
                                    code == 127 ? " (is iproute2 installed? scripts/setup.sh installs it)" : "",
                                    err.empty() ? fmt::format("exit status {}", code) : err.substr(0, err.find_last_not_of('\n') + 1)));
  }
}

// Writes a sysctl of the namespace `netns_fd` (net sysctls belong to the writer's namespace).
void write_sysctl(int netns_fd, const std::string& path, const std::string& value) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setns(netns_fd, CLONE_NEWNET) != 0) ::_exit(1);
    const int fd = ::open(path.c_str(), O_WRONLY);
    const bool ok = fd >= 0 && ::write(fd, value.data(), value.size()) == static_cast<ssize_t>(value.size());
    ::_exit(ok ? 0 : 1);
  }
  int raw = 0;
  if (pid < 0 || ::waitpid(pid, &raw, 0) != pid || !WIFEXITED(raw) || WEXITSTATUS(raw) != 0) {
    throw Error("link", fmt::format("cannot set {} in an island", path));
  }
}

std::array<uint8_t, 6> island_mac(size_t island) {
  return {0x02, 0x4c, 0x4f, 0x00, static_cast<uint8_t>(island >> 8), static_cast<uint8_t>(island & 0xff)};
}

std::string mac_text(const std::array<uint8_t, 6>& mac) {
  return fmt::format("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]);
}

// tc's arguments for a token bucket of `rate_bps`: a burst of 2 ms at the rate, but at least 96 KiB,
// and a queue of 100 ms at the rate (a router's buffer) beyond it. The burst holds a whole TCP
// segmentation-offload packet (64 KiB and headers): with less, tbf cuts each into frames of
// the MTU, and the relay, which carries about 30,000 frames a second whatever their size, then
// fell short of the rate with many flows (8 flows of 100 Mbit/s got 77-80 Mbit/s each, frames
// up to 330 ms late; with 96 KiB: bench/results/relay.txt).
std::vector<std::string> tbf_arguments(const std::string& device, double rate_bps) {
  const double bytes_per_s = rate_bps / 8;
  const auto burst = static_cast<int64_t>(std::max(98304.0, bytes_per_s * 0.002));
  const auto limit = static_cast<int64_t>(std::max(65536.0, bytes_per_s * 0.1)) + burst;
  return {"tc", "qdisc", "add", "dev", device, "root", "tbf", "rate", fmt::format("{}bit", static_cast<int64_t>(rate_bps)),
          "burst", std::to_string(burst), "limit", std::to_string(limit)};
}

}  // namespace

void check_network_privileges() {
  const uint64_t caps = effective_capabilities();
  const bool net_admin = caps & (uint64_t{1} << kCapNetAdmin), sys_admin = caps & (uint64_t{1} << kCapSysAdmin);
  if (net_admin && sys_admin) return;
  throw Error("link", fmt::format("emulated links need root: creating network namespaces and shaping their links takes "
                                  "CAP_SYS_ADMIN and CAP_NET_ADMIN, and this process lacks {}; run as root (sudo), or "
                                  "leave out --link to train over this machine's own network",
                                  net_admin ? "CAP_SYS_ADMIN" : sys_admin ? "CAP_NET_ADMIN" : "both"));
}

Islands::Islands(const std::vector<LinkSpec>& links)
    : links_(links), cut_(std::make_unique<std::atomic<bool>[]>(links.size())),
      segments_(std::make_unique<std::atomic<int64_t>[]>(links.size())) {
  LOCO_CHECK(!links_.empty() && links_.size() < 65000, "islands: {} links", links_.size());
  check_network_privileges();
  std::vector<double> cores;
  for (const auto& link : links_) cores.push_back(link.cpu);
  cpu_ = std::make_unique<CpuShares>(cores);
  try {
    original_fd_ = open_namespace("/proc/thread-self/ns/net");
    hub_fd_ = new_namespace(original_fd_);
    for (size_t i = 0; i < links_.size(); ++i) island_fds_.push_back(new_namespace(original_fd_));
    for (size_t i = 0; i < links_.size(); ++i) set_up_island(i);
    // The relay's sockets are opened in the hub, where the hub ends of the veths are.
    set_namespace(hub_fd_);
    for (size_t i = 0; i < links_.size(); ++i) {
      // Protocol 0: no frame is queued before bind() ties the socket to its own hub end.
      const int fd = ::socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
      if (fd < 0) throw Error("link", fmt::format("packet socket: {}", std::strerror(errno)));
      sockets_.push_back(fd);
      const int on = 1, buffer = 64 << 20;
      // Frames carry their offload state (a virtio_net_hdr): a TCP segment offloaded as one large
      // frame crosses the relay as one, and keeps its pending checksum.
      // Each frame is stamped with the kernel's receive time (SO_TIMESTAMPNS), so that a frame
      // waiting in the socket while the relay is busy is held for its delay from its arrival.
      if (::setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &on, sizeof on) != 0 ||
          ::setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &on, sizeof on) != 0 ||
          ::setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on) != 0) {
        throw Error("link", fmt::format("packet socket options: {}", std::strerror(errno)));
      }
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer);
      ::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer);
      sockaddr_ll address{};
      address.sll_family = AF_PACKET;
      address.sll_protocol = htons(ETH_P_ALL);
      address.sll_ifindex = static_cast<int>(::if_nametoindex(fmt::format("hub{}", i).c_str()));
      if (address.sll_ifindex == 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
        throw Error("link", fmt::format("cannot bind the relay to hub{}: {}", i, std::strerror(errno)));
      }
    }
    set_namespace(original_fd_);
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) throw Error("link", fmt::format("eventfd: {}", std::strerror(errno)));
    // A relay thread per core (at most 4): a frame's send carries the receiving island's network
    // stack with it (veth delivers in the sender's context), so one thread caps every island's
    // traffic at what one core processes (an fp32 all-reduce among 8 islands at 300 Mbit/s fell
    // a second behind; `loco link-check --ranks 8`, docs/slow-links.md).
    const size_t most = std::max<size_t>(1, std::min<size_t>(4, links_.size()));
    const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, most);
    for (size_t t = 0; t < threads; ++t) relays_.emplace_back([this, t, threads] { relay(t, threads); });
  } catch (...) {
    stop_relays();
    if (original_fd_ >= 0) ::setns(original_fd_, CLONE_NEWNET);
    for (int fd : sockets_) ::close(fd);
    for (int fd : island_fds_) ::close(fd);
    for (int fd : {hub_fd_, original_fd_, wake_fd_}) {
      if (fd >= 0) ::close(fd);
    }
    throw;
  }
}

void Islands::stop_relays() {
  stopping_ = true;
  const uint64_t one = 1;
  if (wake_fd_ >= 0 && ::write(wake_fd_, &one, sizeof one) < 0) {
  }
  for (auto& relay : relays_) relay.join();
  relays_.clear();
}

Islands::~Islands() {
  stop_relays();
  for (int fd : sockets_) ::close(fd);
  for (int fd : island_fds_) ::close(fd);
  ::close(hub_fd_);
  ::close(original_fd_);
  ::close(wake_fd_);
}

void Islands::set_up_island(size_t i) {
  const std::string hub_end = fmt::format("hub{}", i), fd_path = fmt::format("/proc/self/fd/{}", island_fds_[i]);
  const int island = island_fds_[i];
  run_in(hub_fd_, {"ip", "link", "add", hub_end, "type", "veth", "peer", "name", "wan0", "netns", fd_path}, island);
  run_in(hub_fd_, {"ip", "link", "set", hub_end, "promisc", "on", "up"});
  run_in(island, {"ip", "link", "set", "lo", "up"});
  run_in(island, {"ip", "link", "set", "wan0", "address", mac_text(island_mac(i))});
  run_in(island, {"ip", "addr", "add", address(i) + "/16", "dev", "wan0"});
  run_in(island, {"ip", "link", "set", "wan0", "up"});
  if (links_[i].rate_bps > 0) {
    run_in(island, tbf_arguments("wan0", links_[i].rate_bps));   // its upload
    run_in(hub_fd_, tbf_arguments(hub_end, links_[i].rate_bps)); // its download
  }
  // A host tuned for a long, fast link: TCP buffers large enough for its bandwidth-delay product,
  // and no return to slow start after an idle spell (a DiLoCo round leaves a connection idle for
  // minutes; Linux's default would restart each exchange at 10 segments per round trip).
  write_sysctl(island, "/proc/sys/net/ipv4/tcp_rmem", "4096 131072 67108864");
  write_sysctl(island, "/proc/sys/net/ipv4/tcp_wmem", "4096 16384 67108864");
  write_sysctl(island, "/proc/sys/net/ipv4/tcp_slow_start_after_idle", "0");
}

std::string Islands::address(size_t island) const {
  const size_t host = island + 1;  // 10.77.0.1 onward, in 10.77.0.0/16
  return fmt::format("10.77.{}.{}", host / 256, host % 256);
}

std::string Islands::relay_error() const {
  std::lock_guard lock(error_mutex_);
  return relay_error_;
}

void Islands::enter(size_t island) const { set_namespace(island_fds_.at(island)); }
void Islands::leave() const { set_namespace(original_fd_); }

std::string Islands::describe() const {
  std::map<std::string, int> counts;
  std::vector<std::string> order;
  for (const auto& l : links_) {
    if (counts[l.describe()]++ == 0) order.push_back(l.describe());
  }
  std::string links;
  for (const auto& text : order) links += fmt::format("{}{} ({} island{})", links.empty() ? "" : "; ", text, counts[text], counts[text] > 1 ? "s" : "");
  return fmt::format("{} emulated islands, each in its own network namespace: {}. Rate: the kernel's tbf on both ends "
                     "of each island's link; delay: loco's relay holds each frame (delay(from) + delay(to)) / 2 in "
                     "userspace (this kernel has no netem){}",
                     links_.size(), links,
                     std::any_of(links_.begin(), links_.end(), [](const LinkSpec& l) { return l.cpu > 0; })
                         ? "; CPU: each worker island's share is a CPU control group's quota"
                         : "");
}

namespace {

// When a frame arrived: the kernel's receive stamp in `message` (SO_TIMESTAMPNS, on the wall clock),
// moved onto the steady clock; `now` without a stamp. A wait of over a second is taken as a second.
Clock::time_point arrival(msghdr& message, Clock::time_point now) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_TIMESTAMPNS) continue;
    timespec stamp{};
    std::memcpy(&stamp, CMSG_DATA(c), sizeof stamp);
    const auto wall = std::chrono::system_clock::now().time_since_epoch();
    const auto waited = wall - (std::chrono::seconds(stamp.tv_sec) + std::chrono::nanoseconds(stamp.tv_nsec));
    return now - std::clamp(std::chrono::duration_cast<Clock::duration>(waited), Clock::duration::zero(),
                            std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(1)));
  }
  return now;
}

// How long from now until `due` (never negative), as ppoll takes it.
timespec until(Clock::time_point due) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::max(Clock::duration::zero(), due - Clock::now())).count();
  return {static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
}

void record_max(std::atomic<double>& slot, double value) {
  double seen = slot.load(std::memory_order_relaxed);
  while (value > seen && !slot.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

// The bytes the relay holds for frames from `island` at most: what its link carries in its longest
// delay plus 100 ms (a router's buffer), from 1 MiB to 256 MiB; an unshaped link counts as 10
// Gbit/s. Beyond it frames are dropped, as a full router drops them, and TCP sends them again.
int64_t Islands::held_limit(size_t island) const {
  double longest = 0;
  for (const auto& link : links_) longest = std::max(longest, (links_[island].delay_s + link.delay_s) / 2);
  const double bytes_per_s = (links_[island].rate_bps > 0 ? links_[island].rate_bps : 10e9) / 8;
  return static_cast<int64_t>(std::clamp(bytes_per_s * (longest + 0.1), double{1 << 20}, double{256 << 20}));
}

// The relay: frames from each island's hub end, held for the pair's delay from the kernel's
// receive stamp, then sent out of the destination's hub end (through its tbf). A min-heap by due
// time keeps each pair's order (equal delays, increasing arrival) and lets a short delay overtake a
// long one, as on separate links.
void Islands::set_cut(size_t island, bool cut) {
  LOCO_CHECK(island < links_.size(), "islands: no island {}", island);
  cut_[island] = cut;
}

bool Islands::drops_cut(size_t from, size_t to) {
  if (!cut_[from] && !cut_[to]) return false;
  ++frames_cut_;
  return true;
}

namespace {

// Every frame the relay reads starts with a struct virtio_net_hdr (linux/virtio_net.h, which C++
// cannot include: a member is named `class`).
constexpr size_t kVirtioHeader = 10;

// LinkSpec::tamper's attacker. The offset in `frame` (a virtio_net_hdr, then Ethernet, IPv4, TCP)
// of the 16-bit word in the middle of its TCP payload, counted from the TCP header as the checksum
// counts; 0 unless it is an IPv4 TCP segment of at least kTamperBytes of payload.
constexpr size_t kTamperBytes = 4096;
size_t tamper_target(const uint8_t* b, size_t size) {
  const size_t ip = kVirtioHeader + 14;
  if (size < ip + 40 || b[kVirtioHeader + 12] != 0x08 || b[kVirtioHeader + 13] != 0x00) return 0;
  const size_t ip_header = static_cast<size_t>(b[ip] & 0x0f) * 4;
  if ((b[ip] >> 4) != 4 || ip_header < 20 || b[ip + 9] != IPPROTO_TCP) return 0;
  const size_t tcp = ip + ip_header;
  if (tcp + 20 > size) return 0;
  const size_t tcp_header = static_cast<size_t>(b[tcp + 12] >> 4) * 4;
  if (tcp_header < 20 || tcp + tcp_header + kTamperBytes > size) return 0;
  return tcp + ((tcp_header + (size - tcp - tcp_header) / 2) & ~size_t{1});
}

// Flips one bit of the word at `word` and keeps the segment valid, as an attacker would: a checksum
// the sender left to be completed (VIRTIO_NET_HDR_F_NEEDS_CSUM) is completed over the altered
// bytes on the way; a complete one is updated as RFC 1624 says, HC' = ~(~HC + ~m + m').
void flip_bit(uint8_t* b, size_t word) {
  const auto read16 = [&](size_t at) { return static_cast<uint32_t>(b[at] << 8 | b[at + 1]); };
  const uint32_t before = read16(word);
  b[word + 1] ^= 0x01;
  if (b[0] & 1) return;
  const size_t checksum = kVirtioHeader + 14 + static_cast<size_t>(b[kVirtioHeader + 14] & 0x0f) * 4 + 16;
  uint32_t sum = (~read16(checksum) & 0xffff) + (~before & 0xffff) + read16(word);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  b[checksum] = static_cast<uint8_t>((~sum >> 8) & 0xff);
  b[checksum + 1] = static_cast<uint8_t>(~sum & 0xff);
}

}  // namespace

void Islands::tamper(size_t from, size_t to, char* bytes, size_t size) {
  if (links_[from].tamper <= 0 || to == 0) return;
  auto* frame = reinterpret_cast<uint8_t*>(bytes);
  const size_t word = tamper_target(frame, size);
  if (word > 0 && ++segments_[from] == links_[from].tamper) {
    flip_bit(frame, word);
    ++frames_tampered_;
  }
}

void Islands::relay(size_t first, size_t stride) {
  // The links should not slow down when training keeps every core busy: the relay runs ahead of
  // ordinary threads where it may (as root it may; without, it keeps its priority).
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), -10);
  struct Frame {
    Clock::time_point due;
    uint64_t sequence;
    size_t from, to;
    std::string bytes;  // virtio_net_hdr + the Ethernet frame
    bool operator>(const Frame& other) const { return std::tie(due, sequence) > std::tie(other.due, other.sequence); }
  };
  std::priority_queue<Frame, std::vector<Frame>, std::greater<>> held;
  std::vector<int64_t> held_bytes(sockets_.size(), 0), limits;
  for (size_t i = 0; i < sockets_.size(); ++i) limits.push_back(held_limit(i));
  uint64_t sequence = 0;
  std::vector<pollfd> fds(sockets_.size(), pollfd{-1, 0, 0});  // a negative fd is not polled
  for (size_t i = first; i < sockets_.size(); i += stride) fds[i] = {sockets_[i], POLLIN, 0};
  fds.push_back({wake_fd_, POLLIN, 0});
  std::string buffer(1 << 18, '\0');
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(timespec))];
  const auto send_frame = [&](const Frame& frame) {
    if (drops_cut(frame.from, frame.to)) return;
    record_max(relay_late_s_, std::chrono::duration<double>(Clock::now() - frame.due).count());
    const bool sent = ::send(sockets_[frame.to], frame.bytes.data(), frame.bytes.size(), MSG_DONTWAIT) >= 0;
    (sent ? frames_relayed_ : frames_dropped_) += 1;
    if (sent) bytes_relayed_ += static_cast<int64_t>(frame.bytes.size());
  };
  while (!stopping_) {
    const timespec timeout = held.empty() ? timespec{} : until(held.top().due);
    if (::ppoll(fds.data(), fds.size(), held.empty() ? nullptr : &timeout, nullptr) < 0 && errno != EINTR) {
      std::lock_guard lock(error_mutex_);
      relay_error_ = fmt::format("the relay's ppoll failed: {}", std::strerror(errno));
      return;
    }
    for (size_t from = 0; from < sockets_.size(); ++from) {
      if (fds[from].revents & (POLLERR | POLLHUP | POLLNVAL)) {
        // A pending socket error (e.g. the device went down) is read, which clears it; a socket
        // that is closed or gone ends the relay rather than spin on it.
        int error = 0;
        socklen_t length = sizeof error;
        if ((fds[from].revents & POLLNVAL) || ::getsockopt(sockets_[from], SOL_SOCKET, SO_ERROR, &error, &length) != 0) {
          std::lock_guard lock(error_mutex_);
          relay_error_ = fmt::format("hub{}'s packet socket failed", from);
          return;
        }
        ++frames_dropped_;
      }
      if (!(fds[from].revents & POLLIN)) continue;
      for (int frames = 0; frames < 256; ++frames) {
        iovec io{buffer.data(), buffer.size()};
        msghdr message{};
        message.msg_iov = &io;
        message.msg_iovlen = 1;
        message.msg_control = control;
        message.msg_controllen = sizeof control;
        const ssize_t n = ::recvmsg(sockets_[from], &message, MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0) break;
        if (static_cast<size_t>(n) > buffer.size() || static_cast<size_t>(n) < kVirtioHeader + 14) {
          ++frames_dropped_;
          continue;
        }
        const auto now = Clock::now();
        const auto arrived = arrival(message, now);
        record_max(relay_backlog_s_, std::chrono::duration<double>(now - arrived).count());
        const auto* destination = reinterpret_cast<const uint8_t*>(buffer.data() + kVirtioHeader);
        const auto hold = [&](size_t to) {
          if (drops_cut(from, to)) return;
          const double delay = (links_[from].delay_s + links_[to].delay_s) / 2;
          if (delay > 0 && held_bytes[from] + n > limits[from]) return void(++frames_dropped_);  // the queue is full
          tamper(from, to, buffer.data(), static_cast<size_t>(n));  // only a frame that goes on
          Frame frame{arrived + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay)), sequence++,
                      from, to, std::string(buffer.data(), static_cast<size_t>(n))};
          if (delay <= 0) {
            send_frame(frame);
          } else {
            held_bytes[from] += n;
            held.push(std::move(frame));
          }
        };
        if (destination[0] & 1) {  // broadcast or multicast: every other island
          for (size_t to = 0; to < sockets_.size(); ++to) {
            if (to != from) hold(to);
          }
        } else if (destination[0] == 0x02 && destination[1] == 0x4c && destination[2] == 0x4f && destination[3] == 0) {
          const size_t to = (size_t{destination[4]} << 8) | destination[5];
          if (to < sockets_.size() && to != from) hold(to);
        }
      }
    }
    const auto now = Clock::now();
    while (!held.empty() && held.top().due <= now) {
      send_frame(held.top());
      held_bytes[held.top().from] -= static_cast<int64_t>(held.top().bytes.size());
      held.pop();
    }
  }
}

}  // namespace loco::runtime
