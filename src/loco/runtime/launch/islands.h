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
// CAP_SYS_ADMIN and CAP_NET_ADMIN (root); without them, an Error says so.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loco/runtime/config/config.h"

namespace loco::runtime {

// One island's link to the rest: rate in bits/s (0 = not shaped) and one-way delay in seconds.
struct LinkSpec {
  double rate_bps = 0;
  double delay_s = 0;

  // "rate=100mbit,delay=50ms" (either key may be left out). Rates in tc's units: bit, kbit, mbit,
  // gbit (powers of 1000, bits per second), or bps, kbps, mbps, gbps (bytes per second); delays in
  // us, ms or s. Throws ConfigError naming the bad part.
  static LinkSpec parse(const std::string& text);
  std::string describe() const;  // "100 Mbit/s, 50 ms one-way"
  bool operator==(const LinkSpec&) const = default;
};

// "97.6 Mbit/s": a rate in bits/s with three significant digits.
std::string format_bandwidth(double bps);

// Parses a rate ("100mbit") or a delay ("50ms") alone; throws ConfigError naming `what`.
double parse_rate_bps(const std::string& text, const std::string& what);
double parse_delay_s(const std::string& text, const std::string& what);

// The links of a launch: `all` for every island (the coordinator's too), and per-worker ones.
// Each `--link` argument is a spec whose keys replace the default's, or "worker=R,<keys>" for
// worker R alone (its other keys taken from the default).
struct LinkPlan {
  LinkSpec all;
  std::vector<std::pair<int64_t, LinkSpec>> workers;  // (rank, its link)
  bool enabled = false;

  static LinkPlan parse(const std::vector<std::string>& arguments, int64_t world);
  // The config's [link] section, then `more` (the command line's --link arguments) over it.
  static LinkPlan from_config(const LinkSection& section, const std::vector<std::string>& more, int64_t world);
  LinkSpec for_worker(int64_t rank) const;
};

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
  // Moves the calling thread into the island's namespace (sockets it opens from then on live
  // there), or back to the namespace it came from.
  void enter(size_t island) const;
  void leave() const;
  // Frames the relay carried, and dropped because a queue was full (tbf's, a socket's or the relay's).
  int64_t frames_relayed() const { return frames_relayed_.load(); }
  int64_t frames_dropped() const { return frames_dropped_.load(); }
  // The longest a frame waited in the relay's socket before the relay read it (its backlog: held
  // for its delay from its arrival all the same), and the latest it left after it was due.
  double relay_backlog_s() const { return relay_backlog_s_.load(); }
  double relay_late_s() const { return relay_late_s_.load(); }
  // Why the relay stopped carrying frames ("" while it runs): the links are down from then on.
  std::string relay_error() const;

  // What the user sees at start: how rate and delay are emulated, each distinct link once.
  std::string describe() const;

 private:
  void set_up_island(size_t island);
  void relay();
  int64_t held_limit(size_t island) const;

  std::vector<LinkSpec> links_;
  int original_fd_ = -1, hub_fd_ = -1;
  std::vector<int> island_fds_;
  std::vector<int> sockets_;   // the relay's packet sockets, one per island's hub end
  int wake_fd_ = -1;           // an eventfd that stops the relay
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> frames_relayed_{0}, frames_dropped_{0};
  std::atomic<double> relay_backlog_s_{0}, relay_late_s_{0};
  mutable std::mutex error_mutex_;
  std::string relay_error_;
  std::thread relay_;
};

// Measurements across one emulated link (`loco link-check`, and the tests): the median round trip
// of small TCP messages, and the steady rate of a bulk TCP transfer from one island to another.
struct LinkMeasurement {
  double round_trip_s = 0;     // median of `pings`
  double rate_bps = 0;         // bits/s over the transfer's last three quarters (past slow start)
  int64_t bytes = 0;
};
LinkMeasurement measure_link(const Islands& islands, size_t from, size_t to, int64_t bulk_bytes, int pings = 20);
// Several transfers at once, each (from, to) its own connection: every flow's pings first, then all
// the bulk transfers together (the relay carries them side by side). One result per flow, in order.
std::vector<LinkMeasurement> measure_links(const Islands& islands, const std::vector<std::pair<size_t, size_t>>& flows,
                                           int64_t bulk_bytes, int pings = 20);

}  // namespace loco::runtime
