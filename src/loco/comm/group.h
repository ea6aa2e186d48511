// Group: loco's one interface to collective communication. Algorithms see only this; c10d and its
// camelCase API stay inside comm (gloo_group.cpp).
//
// A Group is a small handle (copies share one connection) over a backend:
//   - Group::single(): a world of one rank. Every operation completes locally and moves no bytes,
//     so single-process code takes exactly the path multi-process code takes (MLX's pattern).
//   - Group::connect(): `size` ranks meet through a KeyValueStore and talk over TCP: Gloo's
//     (c10d's ProcessGroupGloo) with an open data plane, loco's own transport under a sealed one
//     (connect_tcp). Each membership epoch of a run gets a fresh Group.
//
// Every operation blocks until it completes on this rank, is bounded by GroupOptions::timeout, and
// returns what it cost: payload bytes sent and received by this rank as the wire carries them (the
// algorithm's traffic, not the tensor's size; transport headers excluded), wall time, and how many
// ranks took part (PCCL's lesson: results say who participated and what moved).
//
// Failures: a peer that dies, hangs past the timeout or breaks the protocol raises PeerError
// (recoverable: the runtime's recovery loop handles it); after a PeerError the Group is unusable
// and must be replaced. Misuse (a wrong shape, a rank out of range) raises InternalError.
//
// Not thread-safe: one thread at a time issues a Group's operations (it may be a background
// thread), in the same order on every rank. bytes_sent() may be read from any thread.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loco/comm/encoding.h"
#include "loco/comm/key_value.h"

namespace loco::comm {

struct CommStats {
  int64_t bytes_sent = 0;      // payload bytes this rank sent
  int64_t bytes_received = 0;  // payload bytes this rank received
  double seconds = 0;          // wall time of the operation on this rank
  int64_t participants = 0;    // ranks that took part
  // How the data travelled: an all-reduce's algorithm ("gather", "scatter", "ring", "gloo-ring");
  // "" for other operations. += keeps the last one that is set.
  std::string route;
  // The group's round trip as it measured it when it connected (Group::link()); 0 = not measured.
  // += keeps the larger. What a sync took beyond its bytes is counted in these (loco report).
  double round_trip_s = 0;
  CommStats& operator+=(const CommStats& other);
};

// What the data plane proves and hides (docs/security.md, "The data plane"). kOpen: Gloo's TCP as
// it is, no credential and no integrity beyond TCP's checksum. kAuthenticated: when the group forms,
// every pair of ranks proves it holds the run's secret (a challenge and response over fresh nonces,
// bound to the group's name and both ranks), and every message then carries an AES-256-GCM tag
// over its bytes under a key of that pair and direction, with its tag and its count between the
// two as the nonce: an altered, injected, replayed or reordered message fails its receive with
// PeerError, as a dead peer's does. kEncrypted: the same, and the bytes travel encrypted.
enum class DataPlane { kOpen, kAuthenticated, kEncrypted };
const char* to_string(DataPlane plane);
// "open", "authenticated" or "encrypted"; ConfigError naming the choices otherwise.
DataPlane parse_data_plane(std::string_view text);

struct GroupOptions {
  int64_t rank = 0;
  int64_t size = 1;
  // Address this rank listens on and that its peers dial: 127.0.0.1 on one machine; across machines
  // an address the peers can reach (runtime picks the one that reaches the coordinator).
  std::string host = "127.0.0.1";
  Duration timeout = std::chrono::seconds(60);  // rendezvous and every operation
  std::string prefix = "group";                 // namespace of this group's keys in the store
  // TCP connections between each pair of ranks (Gloo devices, each a full mesh). Point-to-point
  // messages spread over them by tag, so that the pieces of an encoded all-reduce travel side by
  // side: one TCP stream over a long link is bound by its window and round trip, several are not.
  int64_t connections = 1;
  // Asked about every 100 ms while the rendezvous or an operation waits: true abandons the wait
  // with PeerError (elastic runs: the coordinator says a member of this group failed). Empty: never.
  std::function<bool()> abort;
  DataPlane data_plane = DataPlane::kOpen;
  // The run's data-plane secret (raw bytes, at least 32), which every rank must hold: required
  // unless data_plane is kOpen. Keys of the group and of each pair are derived from it.
  std::string secret;
  // Where loco's transport (connect_tcp) notes a connection it refused (a stranger's, with its
  // address): called from its handshake threads. Empty: standard error, as "comm: ...".
  std::function<void(const std::string&)> log;
  void validate() const;                        // ConfigError on nonsense
};

// How an all-reduce moves its data (PCCL's pattern: quantization is an option of the operation).
// With an encoding other than fp32, each rank's values are encoded before they are sent and
// received values are decoded and accumulated in fp32; with fp32 the values travel as they are.
// Two direct algorithms, both latency-aware: every receive of the whole operation is posted before
// anything is sent (Gloo sends a message only once its receiver has announced the buffer, so a
// receive posted late costs a round trip), a rank talks to every other rank at once, and the data
// travels in pieces of ReduceOptions::piece_bytes, pipelined and spread over the connections
// (E is the encoded size of the whole tensor, d the one-way delay):
//   kGather   every rank sends its encoded tensor to every other rank, and each sums the decoded
//             tensors in rank order: (M − 1) · E bytes sent per rank, 2d (the announcement, then
//             the data); each input is quantized once.
//   kScatter  the tensor is cut into M chunks of whole blocks; each rank sends each chunk to its
//             owner (an all-to-all); the owner sums the decoded chunks and its own fp32 values in
//             rank order, encodes the sum once and sends it to every other rank: 2 (M − 1) / M · E
//             bytes per rank, 3d (the second phase's buffers were announced at the start), and
//             every value is quantized at most twice, whatever M is (Streaming DiLoCo's "quantize
//             what is sent, accumulate in fp32").
//   kRing     (encoded only) ring reduce-scatter with decode-add-encode at every hop, then a ring
//             all-gather: the bytes of kScatter in 2 (M − 1) hops of a round trip each, and a
//             partial sum is re-encoded at up to M − 1 hops, so the error grows with M. Kept to
//             measure that against (loco-bench-comm).
//   kAuto     whichever of kGather and kScatter takes less time by the group's link model: its
//             measured round trip and the goodput its ranks measured in earlier all-reduces (the
//             least of theirs, which every rank learns with each all-reduce, so all choose alike).
//             kGather at M = 2 (the same bytes in fewer hops) and for tensors of fewer blocks than
//             ranks; kScatter for M > 2 until a goodput is known.
// Every algorithm ends with bit-identical values on every rank (they all decode the same bytes, in
// the same order), and with fp32 the sum is exactly Σ_r x_r added in rank order from zero.
enum class ReduceAlgorithm { kAuto, kGather, kScatter, kRing };
const char* to_string(ReduceAlgorithm algorithm);
struct ReduceOptions {
  Encoding encoding = Encoding::kFp32;
  ReduceAlgorithm algorithm = ReduceAlgorithm::kAuto;
  int64_t piece_bytes = 1 << 20;  // fp32 bytes per message (rounded down to whole blocks, at least one)
  Combine combine = Combine::kSum;  // wire_format.h
  int64_t trim = 1;               // kTrimmedMean: terms left out at each end
};

// A few numbers that travel with an all-reduce at no extra round trip (PCCL's lesson: the result
// says who took part): each rank brings `mine` (the same count on every rank) and learns every
// rank's. With `weights`, rank r's tensor enters the sum multiplied by weights(all)[r] (in fp32,
// as x·w; rank order as always); the function runs on every rank with the same input, so it must
// be a pure function of it. A rank weighted 0 is left out: its values are not added at all (one
// that is not finite is then no error, and does not reach the sum). What a Streaming DiLoCo sync
// needs besides its data (the tokens each worker trained, who is counted, its outer gradient's
// norm) rides here instead of costing a collective of its own.
struct Tally {
  std::vector<double> mine;  // in
  std::function<std::vector<double>(const std::vector<std::vector<double>>& all)> weights;  // in, optional
  std::vector<std::vector<double>> all;  // out: every rank's `mine`, in rank order
  std::vector<double> applied;           // out: the factors used (1 for every rank without `weights`)
  // Σ over ranks of all[r][i], added in rank order (identical on every rank).
  double sum(size_t i) const;
};

// What a group knows of its link, learned by its operations (Group::link()).
struct LinkEstimate {
  double round_trip_s = 0;  // measured when the group connected: the fastest rank's exchange with all
  double goodput_bps = 0;   // payload bits/s the slowest rank moved in the last all-reduce that showed it; 0 = not yet known
};

// A send or receive that was posted and moves in the background. wait() blocks until it is done
// (bounded by the group's timeout from when wait() was called, and its abort hook) and returns what
// it moved, or throws PeerError. A tensor given to a posted operation must not be touched until
// then.
class Posted {
 public:
  virtual ~Posted() = default;
  virtual CommStats wait() = 0;
};

// A backend. Implemented by gloo_group.cpp and the single-rank stand-in; users hold a Group.
// Implementations take CPU tensors that are contiguous (Group ensures it) and report bytes.
class GroupImpl {
 public:
  virtual ~GroupImpl() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t size() const = 0;
  virtual std::string backend() const = 0;
  virtual CommStats all_reduce_sum(std::vector<torch::Tensor>& tensors) = 0;
  virtual CommStats broadcast(torch::Tensor& tensor, int64_t root) = 0;
  virtual CommStats all_gather(const torch::Tensor& tensor, std::vector<torch::Tensor>& out) = 0;
  virtual CommStats send(const torch::Tensor& tensor, int64_t peer, int64_t tag) = 0;
  virtual CommStats recv(torch::Tensor& tensor, int64_t peer, int64_t tag) = 0;
  // Sends `out` to `to` while receiving `in` from `from` (a ring hop: both are in flight at once).
  virtual CommStats send_recv(const torch::Tensor& out, int64_t to, torch::Tensor& in, int64_t from, int64_t tag) = 0;
  // Posts a send or a receive and returns at once (see Posted).
  virtual std::unique_ptr<Posted> post_send(const torch::Tensor& tensor, int64_t peer, int64_t tag) = 0;
  virtual std::unique_ptr<Posted> post_recv(torch::Tensor& tensor, int64_t peer, int64_t tag) = 0;
  // Whether every message is sealed (DataPlane other than kOpen): Group then sums fp32 by its own
  // direct all-reduce, over sealed messages, instead of the backend's collective.
  virtual bool sealed() const { return false; }
  // The ranks that closed a connection to this one (their process ended, or they left the group);
  // empty where the backend cannot tell (Gloo).
  virtual std::vector<int64_t> closed_peers() const { return {}; }
};

// A backend whose blocking point-to-point operations are its posted ones, waited for at once
// (loco's transport, the sealed group).
class PostingGroupImpl : public GroupImpl {
 public:
  CommStats send(const torch::Tensor& tensor, int64_t peer, int64_t tag) override { return post_send(tensor, peer, tag)->wait(); }
  CommStats recv(torch::Tensor& tensor, int64_t peer, int64_t tag) override { return post_recv(tensor, peer, tag)->wait(); }
  // Both posted before either is waited for (a ring hop).
  CommStats send_recv(const torch::Tensor& out, int64_t to, torch::Tensor& in, int64_t from, int64_t tag) override {
    auto receiving = post_recv(in, from, tag);
    auto sending = post_send(out, to, tag);
    CommStats stats = sending->wait();
    stats += receiving->wait();
    return stats;
  }
};

class Group {
 public:
  // A world of one rank (rank 0, size 1).
  static Group single();
  // Joins the group `options` describes; blocks until all options.size ranks have arrived through
  // `store`, or throws PeerError after options.timeout naming the ranks still missing.
  static Group connect(std::shared_ptr<KeyValueStore> store, const GroupOptions& options);
  explicit Group(std::shared_ptr<GroupImpl> impl);

  int64_t rank() const { return impl_->rank(); }
  int64_t size() const { return impl_->size(); }
  std::string backend() const { return impl_->backend(); }
  // Whether both handles share one connection.
  bool same_as(const Group& other) const { return impl_ == other.impl_; }
  // The ranks that closed a connection to this one, as far as the backend can tell (loco's
  // transport: a killed process's connections close at once; Gloo's: not seen). Any thread.
  std::vector<int64_t> closed_peers() const { return impl_->closed_peers(); }

  // Element-wise sum across ranks, in place. Every rank ends with bit-identical tensors.
  CommStats all_reduce_sum(std::vector<torch::Tensor>& tensors);
  CommStats all_reduce_sum(torch::Tensor& tensor);
  // The sum with `options.encoding` on the wire, by a direct algorithm (see ReduceOptions), with
  // `tally`'s numbers carried along and its weights applied when given. `tensor` is fp32. With an
  // encoding, throws DataError, on every rank alike, when some rank's values are not finite (the
  // tensor is then left as it was).
  CommStats all_reduce_sum(torch::Tensor& tensor, const ReduceOptions& options, Tally* tally = nullptr);
  // Copies `root`'s tensor into every rank's `tensor` (same shape and dtype on every rank).
  CommStats broadcast(torch::Tensor& tensor, int64_t root);
  // out[r] = rank r's `tensor`, for every r (same shape and dtype on every rank).
  CommStats all_gather(const torch::Tensor& tensor, std::vector<torch::Tensor>& out);
  // Point to point; the receiver's tensor must match the sender's shape and dtype. `tag` tells
  // apart messages between the same two ranks.
  CommStats send(const torch::Tensor& tensor, int64_t peer, int64_t tag = 0);
  CommStats recv(torch::Tensor& tensor, int64_t peer, int64_t tag = 0);
  // Sends `out` to rank `to` while receiving `in` from rank `from`, both in flight at once (one
  // hop of a ring; a blocking send followed by a blocking recv would deadlock the ring).
  CommStats send_recv(const torch::Tensor& out, int64_t to, torch::Tensor& in, int64_t from, int64_t tag = 0);

  // Payload bytes this group's operations have sent so far, all threads together: updated as each
  // operation completes (a bucket, a ring hop), so a caller can see when bytes moved.
  int64_t bytes_sent() const { return counters_->bytes_sent.load(); }
  // The group's link as its operations measured it (read from the thread that issues them).
  LinkEstimate link() const { return counters_->link; }
  // The algorithm kAuto picks for an all-reduce of `bytes` encoded bytes in `encoding`: a gather
  // at M = 2; at M > 2, for fp32 the faster by the link estimate (both are the rank-order sum, bit
  // for bit), and for any other encoding a scatter, whatever the link: an encoded sum's bits depend
  // on the route (a gather quantizes each rank's values once, a scatter its partial sums again),
  // and a choice by measured time would make training depend on timing (a resumed run would not
  // repeat an uninterrupted one).
  ReduceAlgorithm choose(int64_t bytes, Encoding encoding = Encoding::kFp32) const;

 private:
  struct Counters {
    std::atomic<int64_t> bytes_sent{0};
    LinkEstimate link;         // touched only by the thread issuing operations
    double measured_bps = 0;   // this rank's last goodput measurement, told to the others with the next all-reduce
  };
  class Exchange;
  template <class F>
  CommStats timed(F&& operation);
  void measure_round_trip();
  CommStats reduce_ring(torch::Tensor& flat, Encoding encoding, Tally* tally);
  // A sealed group's sum of fp32 tensors: by the direct all-reduce, its messages sealed.
  CommStats all_reduce_sealed(std::vector<torch::Tensor>& tensors);

  std::shared_ptr<GroupImpl> impl_;
  std::shared_ptr<Counters> counters_ = std::make_shared<Counters>();
};

// Makes the process groups of one run: loco's one place that forms a Group from a run's settings.
// Every group meets through the same store, under "epoch/<n>" for membership epoch n, with the
// same address and timeout. A fixed run makes the group of its one epoch; an elastic run one for
// each epoch the coordinator convenes, with `abort` polled while it waits. A factory without a
// store (local()) makes only groups of one: `loco train`, and an elastic strategy before its first
// round.
class GroupFactory {
 public:
  GroupFactory(std::shared_ptr<KeyValueStore> store, std::string host, Duration timeout, int64_t connections = 1);
  static GroupFactory local();

  // Blocks until the `size` ranks of `epoch` have met (see Group::connect); throws PeerError when
  // one does not come within the timeout or `abort` says so.
  Group make(int64_t epoch, int64_t rank, int64_t size, std::function<bool()> abort = {}) const;
  // Every group it makes from now on seals its messages so (GroupOptions::data_plane, secret).
  void set_data_plane(DataPlane plane, std::string secret);
  DataPlane data_plane() const { return data_plane_; }

 private:
  std::shared_ptr<KeyValueStore> store_;
  std::string host_;
  Duration timeout_;
  int64_t connections_ = 1;
  DataPlane data_plane_ = DataPlane::kOpen;
  std::string secret_;
};

// The Gloo backend (gloo_group.cpp): exposed for Group::connect and tests.
// PyTorch's c10d flight recorder (LibTorch 2.5 and later) keeps the last 2,000 collectives of the
// process with a captured stack trace each, and in 2.11 updates its table of process groups
// outside its lock (FlightRecorder::recordWithResetEnabled): several groups running collectives
// from different threads at once crash the process (seen on a GPU machine: loco's group tests run
// their ranks as threads). loco accounts for its collectives itself, so the recorder is turned off
// (TORCH_FR_BUFFER_SIZE=0) unless the user set TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE.
// connect_gloo calls it; main() calls it first, before any thread could read the environment.
void turn_off_flight_recorder();

std::shared_ptr<GroupImpl> connect_gloo(std::shared_ptr<KeyValueStore> store, const GroupOptions& options);

// loco's own transport (tcp_group.cpp), under a sealed data plane in place of Gloo's: point-to-
// point messages only, over connections that prove membership before anything else is read from
// them (a stranger's is closed and logged, and cannot take a peer's place), in frames that land only
// in the receives this rank posted, of the length it posted. A frame that breaks that fails the
// group with PeerError, never the process. Needs options.secret (data_plane other than kOpen).
std::shared_ptr<GroupImpl> connect_tcp(std::shared_ptr<KeyValueStore> store, const GroupOptions& options);

// The sealed data plane (sealed_group.cpp) over `inner`, a group of the same ranks: runs the
// membership proof with every peer (PeerError naming a rank that fails it, within the group's
// timeout) and returns a GroupImpl whose every message is sealed as options.data_plane says.
// `tamper`, for tests only, is applied to each sealed message before it is sent, as an on-path
// attacker would alter it.
using Tamper = std::function<void(torch::Tensor& sealed, int64_t peer, int64_t tag)>;
std::shared_ptr<GroupImpl> seal(std::shared_ptr<GroupImpl> inner, const GroupOptions& options, Tamper tamper = {});

}  // namespace loco::comm
