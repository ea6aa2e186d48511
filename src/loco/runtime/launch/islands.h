// Emulated islands for `loco launch --link`: each process of a run (the coordinator, each worker)
// on a host of its own, a Linux network namespace, joined to the others by a link with a set rate
// and one-way delay, so that a run on one machine crosses a WAN-like network.
//
// How a link is made (docs/slow-links.md):
//   island (its own netns)          hub (a netns)                     other islands
//   wan0 10.77.0.k --- veth --- hubK  <-- loco's relay thread --> hubJ --- veth --- wan0 ...
//   - rate: the kernel's token bucket filter (tbf) on both ends of each veth, so an island's upload
//     is shaped as it leaves wan0 and its download as it leaves hubK toward it;
//   - delay: this kernel has no netem (nor fq or etf, which could hold packets by timestamp), so a
//     relay in userspace carries every frame from one island's hub end to another's, holding it
//     (delay(from) + delay(to)) / 2 first: two islands with delay d see a one-way delay of d.
//     It switches frames by the islands' fixed MAC addresses and floods broadcasts (ARP).
// The namespaces are anonymous, held only by this object's descriptors (and by the processes in
// them): when the launcher exits, is interrupted or is killed, the kernel removes them with their
// links and addresses, so no run can leave a stale set-up behind. Creating them needs
// CAP_SYS_ADMIN and CAP_NET_ADMIN (root); without them, an Error says so. An island whose link
// sets cpu=C also gets C cores of the machine's CPU of its own (cpu_shares.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loco/runtime/config/config.h"
#include "loco/runtime/config/links.h"
#include "loco/runtime/launch/cpu_shares.h"

namespace loco::runtime {

// Throws Error("[link] ...") unless this process may create network namespaces and configure
// links (CAP_SYS_ADMIN and CAP_NET_ADMIN in its effective set).
void check_network_privileges();

class Islands {
 public:
  // Creates one island per link (island i at address(i)), the hub, and starts the relay.
  // Blocks for the set-up (a few `ip`/`tc` commands per island); throws Error on failure, leaving
  // nothing behind.
  explicit Islands(const std::vector<LinkSpec>& links);
  ~Islands();  // stops the relay and lets go of the namespaces (the kernel removes them)
  Islands(const Islands&) = delete;
  Islands& operator=(const Islands&) = delete;

  size_t size() const { return links_.size(); }
  const LinkSpec& link(size_t island) const { return links_[island]; }
  std::string address(size_t island) const;  // "10.77.0.<island + 1>"
  // A descriptor of the island's network namespace, for setns(2) in a child before exec.
  int netns_fd(size_t island) const { return island_fds_[island]; }
  // Where a process started in the island writes its pid to take the island's CPU share
  // (cpu_shares.h); "" when its link sets none.
  std::string cpu_procs_file(size_t island) const { return cpu_->procs_file(island); }
  // Moves the calling thread into the island's namespace (sockets it opens from then on live
  // there), or back to the namespace it came from.
  void enter(size_t island) const;
  void leave() const;
  // Frames the relay carried, and dropped because a queue was full (tbf's, a socket's or the relay's).
  int64_t frames_relayed() const { return frames_relayed_.load(); }
  int64_t bytes_relayed() const { return bytes_relayed_.load(); }  // of the frames relayed, headers included
  int64_t frames_dropped() const { return frames_dropped_.load(); }
  // The longest a frame waited in the relay's socket before the relay read it (its backlog: held
  // for its delay from its arrival all the same), and the latest it left after it was due.
  double relay_backlog_s() const { return relay_backlog_s_.load(); }
  double relay_late_s() const { return relay_late_s_.load(); }
  // Cuts an island's link, as a pulled cable or a failed route would: from then on every frame to
  // or from it is dropped (counted in frames_cut, not frames_dropped), the frames already held for
  // their delay included, until it is restored. Its sockets see nothing: no reset, no error.
  void set_cut(size_t island, bool cut);
  bool cut(size_t island) const { return cut_[island].load(); }
  int64_t frames_cut() const { return frames_cut_.load(); }
  // Frames the relay altered as an attacker on the path (LinkSpec::tamper: segments to island 0,
  // a launch's coordinator, whose control plane is signed apart, are neither counted nor altered).
  int64_t frames_tampered() const { return frames_tampered_.load(); }
  // Why the relay stopped carrying frames ("" while it runs): the links are down from then on.
  std::string relay_error() const;

  // What the user sees at start: how rate and delay are emulated, each distinct link once.
  std::string describe() const;

 private:
  void set_up_island(size_t island);
  void relay(size_t first, size_t stride);  // the frames from islands first, first + stride, ...
  void stop_relays();  // tells every relay thread to end, and joins them
  int64_t held_limit(size_t island) const;
  bool drops_cut(size_t from, size_t to);  // whether a frame between them meets a cut link (counted)
  // LinkSpec::tamper: counts a data segment from `from` to `to` (not island 0) and alters the one
  // `from`'s link names.
  void tamper(size_t from, size_t to, char* frame, size_t size);

  std::vector<LinkSpec> links_;
  std::unique_ptr<CpuShares> cpu_;  // the islands' CPU groups (none without cpu=)
  int original_fd_ = -1, hub_fd_ = -1;
  std::vector<int> island_fds_;
  std::vector<int> sockets_;   // the relay's packet sockets, one per island's hub end
  int wake_fd_ = -1;           // an eventfd that stops the relay
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> frames_relayed_{0}, bytes_relayed_{0}, frames_dropped_{0}, frames_cut_{0}, frames_tampered_{0};
  std::unique_ptr<std::atomic<bool>[]> cut_;  // one per island: set_cut
  std::unique_ptr<std::atomic<int64_t>[]> segments_;  // one per island: data segments of 4 KiB or more it sent
  std::atomic<double> relay_backlog_s_{0}, relay_late_s_{0};
  mutable std::mutex error_mutex_;
  std::string relay_error_;
  std::vector<std::thread> relays_;  // each relays the frames from every relays_.size()-th island
};

}  // namespace loco::runtime
