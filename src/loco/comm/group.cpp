#include "loco/comm/group.h"

#include <chrono>

#include "loco/comm/codec_kernels.h"
#include "loco/core/error.h"

namespace loco::comm {
namespace {

using Clock = std::chrono::steady_clock;

// The world of one rank: nothing to exchange.
class SingleGroup final : public GroupImpl {
 public:
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 1; }
  std::string backend() const override { return "single"; }
  CommStats all_reduce_sum(std::vector<torch::Tensor>&) override { return {0, 0, 0, 1}; }
  CommStats broadcast(torch::Tensor&, int64_t) override { return {0, 0, 0, 1}; }
  CommStats all_gather(const torch::Tensor& tensor, std::vector<torch::Tensor>& out) override {
    out = {tensor.clone()};
    return {0, 0, 0, 1};
  }
  CommStats send(const torch::Tensor&, int64_t, int64_t) override {
    throw InternalError("comm", "send in a group of one rank: there is no peer");
  }
  CommStats recv(torch::Tensor&, int64_t, int64_t) override {
    throw InternalError("comm", "recv in a group of one rank: there is no peer");
  }
  CommStats send_recv(const torch::Tensor&, int64_t, torch::Tensor&, int64_t, int64_t) override {
    throw InternalError("comm", "send_recv in a group of one rank: there is no peer");
  }
  std::unique_ptr<Posted> post_send(const torch::Tensor&, int64_t, int64_t) override {
    throw InternalError("comm", "post_send in a group of one rank: there is no peer");
  }
  std::unique_ptr<Posted> post_recv(torch::Tensor&, int64_t, int64_t) override {
    throw InternalError("comm", "post_recv in a group of one rank: there is no peer");
  }
};

// Backends take contiguous CPU tensors. A tensor that is neither is staged through a contiguous
// CPU copy and written back after the operation (CUDA tensors cross host memory this way).
struct Staged {
  explicit Staged(torch::Tensor& original) : original_(original) {
    needs_copy_ = !original.device().is_cpu() || !original.is_contiguous();
    staged = needs_copy_ ? original.to(torch::kCPU).contiguous() : original;
  }
  void write_back() {
    if (needs_copy_) original_.copy_(staged);
  }
  torch::Tensor staged;

 private:
  torch::Tensor& original_;
  bool needs_copy_ = false;
};

void check_peer(const GroupImpl& impl, int64_t peer, const char* what) {
  if (peer < 0 || peer >= impl.size() || peer == impl.rank()) {
    throw InternalError("comm", fmt::format("{}: peer {} is not another rank of this group of {} (this is rank {})",
                                            what, peer, impl.size(), impl.rank()));
  }
}

}  // namespace

template <class F>
CommStats Group::timed(F&& operation) {
  const auto start = Clock::now();
  CommStats stats = operation();
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  counters_->bytes_sent += stats.bytes_sent;
  return stats;
}

CommStats& CommStats::operator+=(const CommStats& other) {
  bytes_sent += other.bytes_sent;
  bytes_received += other.bytes_received;
  seconds += other.seconds;
  participants = std::max(participants, other.participants);
  return *this;
}

void GroupOptions::validate() const {
  if (size < 1) throw ConfigError("comm", fmt::format("group size must be >= 1, got {}", size));
  if (rank < 0 || rank >= size) throw ConfigError("comm", fmt::format("rank {} is outside [0, {})", rank, size));
  if (timeout.count() <= 0) throw ConfigError("comm", "the group timeout must be positive");
  if (host.empty()) throw ConfigError("comm", "the group's listen host must not be empty");
  if (connections < 1 || connections > 64) {
    throw ConfigError("comm", fmt::format("connections per peer must be in [1, 64], got {}", connections));
  }
}

Group::Group(std::shared_ptr<GroupImpl> impl) : impl_(std::move(impl)) { LOCO_CHECK(impl_ != nullptr, "null group"); }

Group Group::single() { return Group(std::make_shared<SingleGroup>()); }

Group Group::connect(std::shared_ptr<KeyValueStore> store, const GroupOptions& options) {
  options.validate();
  if (options.size == 1) return single();
  return Group(connect_gloo(std::move(store), options));
}

GroupFactory::GroupFactory(std::shared_ptr<KeyValueStore> store, std::string host, Duration timeout, int64_t connections)
    : store_(std::move(store)), host_(std::move(host)), timeout_(timeout), connections_(connections) {}

GroupFactory GroupFactory::local() { return GroupFactory(nullptr, "127.0.0.1", std::chrono::seconds(60)); }

Group GroupFactory::make(int64_t epoch, int64_t rank, int64_t size, std::function<bool()> abort) const {
  LOCO_CHECK(store_ != nullptr || size == 1, "a local group factory cannot make a group of {} ranks", size);
  if (store_ == nullptr) return Group::single();
  GroupOptions options;
  options.rank = rank;
  options.size = size;
  options.host = host_;
  options.timeout = timeout_;
  options.connections = connections_;
  options.prefix = fmt::format("epoch/{}", epoch);
  options.abort = std::move(abort);
  return Group::connect(store_, options);
}

CommStats Group::all_reduce_sum(std::vector<torch::Tensor>& tensors) {
  return timed([&] {
    std::vector<Staged> staged;
    staged.reserve(tensors.size());
    std::vector<torch::Tensor> inputs;
    for (auto& t : tensors) inputs.push_back(staged.emplace_back(t).staged);
    CommStats stats = impl_->all_reduce_sum(inputs);
    for (auto& s : staged) s.write_back();
    return stats;
  });
}

CommStats Group::all_reduce_sum(torch::Tensor& tensor) {
  std::vector<torch::Tensor> one{tensor};
  return all_reduce_sum(one);
}

CommStats Group::broadcast(torch::Tensor& tensor, int64_t root) {
  if (root < 0 || root >= size()) {
    throw InternalError("comm", fmt::format("broadcast: root {} outside the group of {}", root, size()));
  }
  return timed([&] {
    Staged staged(tensor);
    CommStats stats = impl_->broadcast(staged.staged, root);
    staged.write_back();
    return stats;
  });
}

CommStats Group::all_gather(const torch::Tensor& tensor, std::vector<torch::Tensor>& out) {
  return timed([&] { return impl_->all_gather(tensor.to(torch::kCPU).contiguous(), out); });
}

CommStats Group::send(const torch::Tensor& tensor, int64_t peer, int64_t tag) {
  check_peer(*impl_, peer, "send");
  return timed([&] { return impl_->send(tensor.to(torch::kCPU).contiguous(), peer, tag); });
}

CommStats Group::recv(torch::Tensor& tensor, int64_t peer, int64_t tag) {
  check_peer(*impl_, peer, "recv");
  return timed([&] {
    Staged staged(tensor);
    CommStats stats = impl_->recv(staged.staged, peer, tag);
    staged.write_back();
    return stats;
  });
}

const char* to_string(ReduceAlgorithm algorithm) {
  switch (algorithm) {
    case ReduceAlgorithm::kAuto: return "auto";
    case ReduceAlgorithm::kGather: return "gather";
    case ReduceAlgorithm::kScatter: return "scatter";
    case ReduceAlgorithm::kRing: return "ring";
  }
  return "?";
}

CommStats Group::all_reduce_sum(torch::Tensor& tensor, const ReduceOptions& options) {
  LOCO_CHECK(tensor.scalar_type() == torch::kFloat32, "an encoded all-reduce takes fp32, got {}",
             c10::toString(tensor.scalar_type()));
  if (options.encoding == Encoding::kFp32) return all_reduce_sum(tensor);
  const auto start = Clock::now();  // the whole operation, encoding and decoding included
  Staged staged(tensor);
  auto flat = staged.staged.view({-1});
  // One number first: how many values are not finite, on all ranks together. Every rank then
  // refuses alike, instead of one rank refusing to encode while the others wait for its bytes.
  // (One vector pass: torch's isfinite makes several passes and temporaries, and cost more than
  // the whole encoded exchange.)
  const int64_t mine = kernels::count_not_finite(flat.data_ptr<float>(), flat.numel());
  auto not_finite = torch::full({1}, static_cast<double>(mine), torch::kFloat64);
  CommStats stats = all_reduce_sum(not_finite);
  if (not_finite.item<double>() > 0) {
    throw DataError("comm", fmt::format("all-reduce in {}: {} value(s) are NaN or Inf across the group ({} on this rank); "
                                        "they have no encoding (an outer gradient that is not finite means training "
                                        "diverged; hint: lower optim.lr or outer.lr)", to_string(options.encoding),
                                        static_cast<int64_t>(not_finite.item<double>()), mine));
  }
  if (size() == 1) {
    flat.copy_(decode(encode(flat, options.encoding), options.encoding, flat.numel()));
  } else {
    // Scatter and ring need a whole block per chunk; a tensor of fewer blocks than ranks is gathered.
    const bool chunks_fit = (flat.numel() + kEncodingBlock - 1) / kEncodingBlock >= size();
    auto algorithm = options.algorithm;
    if (algorithm == ReduceAlgorithm::kAuto) algorithm = size() > 2 ? ReduceAlgorithm::kScatter : ReduceAlgorithm::kGather;
    if (!chunks_fit) algorithm = ReduceAlgorithm::kGather;
    switch (algorithm) {
      case ReduceAlgorithm::kScatter: stats += reduce_scatter(flat, options.encoding); break;
      case ReduceAlgorithm::kRing: stats += reduce_ring(flat, options.encoding); break;
      default: stats += reduce_gather(flat, options.encoding); break;
    }
  }
  staged.write_back();
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

CommStats Group::reduce_gather(torch::Tensor& flat, Encoding encoding) {
  std::vector<torch::Tensor> all;
  CommStats stats = all_gather(encode(flat, encoding), all);
  flat.zero_();
  for (const auto& encoded : all) decode_add(encoded, encoding, flat);
  return stats;
}

namespace {

// Chunk c (taken modulo M) of a flat tensor cut into M runs of whole encoding blocks, so that
// encoding a chunk is encoding its blocks.
struct Chunks {
  torch::Tensor flat;
  int64_t m;
  torch::Tensor operator()(int64_t c) const {
    const int64_t n = flat.numel(), blocks = (n + kEncodingBlock - 1) / kEncodingBlock;
    c = ((c % m) + m) % m;
    const int64_t begin = std::min(n, c * blocks / m * kEncodingBlock);
    const int64_t end = std::min(n, (c + 1) * blocks / m * kEncodingBlock);
    return flat.narrow(0, begin, end - begin);
  }
};

// The scatter sends a chunk in pieces of this many values (1 MB of fp32; whole blocks), so that
// encoding, sending and decoding overlap and the pieces spread over the connections.
constexpr int64_t kScatterPiece = 1024 * kEncodingBlock;

torch::Tensor encoded_buffer(Encoding encoding, const torch::Tensor& values) {
  return torch::empty({encoded_bytes(encoding, values.numel())}, torch::kUInt8);
}

// The all-gather that ends both reduce-scatters: this rank holds chunk `owned`'s reduced sum,
// encoded; the encoded sums travel around the ring unchanged, and every rank, the owner
// included, takes the decoded bytes as the result, so all hold the same values.
CommStats ring_all_gather(Group& group, const Chunks& chunk, int64_t owned, torch::Tensor outgoing, Encoding encoding) {
  const int64_t m = group.size(), r = group.rank();
  chunk(owned).copy_(decode(outgoing, encoding, chunk(owned).numel()));
  CommStats stats;
  for (int64_t k = 0; k < m - 1; ++k) {
    auto target = chunk(owned - k - 1);
    auto incoming = encoded_buffer(encoding, target);
    stats += group.send_recv(outgoing, (r + 1) % m, incoming, (r + m - 1) % m, m + k);
    target.copy_(decode(incoming, encoding, target.numel()));
    outgoing = incoming;
  }
  return stats;
}

}  // namespace

CommStats Group::reduce_scatter(torch::Tensor& flat, Encoding encoding) {
  const int64_t m = size(), r = rank();
  const Chunks chunk{flat, m};
  CommStats stats;
  auto finish = [&](std::unique_ptr<Posted>& posted) {
    const auto moved = posted->wait();
    counters_->bytes_sent += moved.bytes_sent;  // as each piece completes, for readers of bytes_sent()
    stats += moved;
    posted.reset();
  };
  // Every message is a piece of a chunk; piece p of a chunk travels with tag p in the all-to-all
  // and kGatherTags + p in the all-gather, so that the pieces spread over the connections.
  auto pieces = [](const torch::Tensor& values) {
    std::vector<torch::Tensor> out;
    for (int64_t begin = 0; begin < values.numel(); begin += kScatterPiece) {
      out.push_back(values.narrow(0, begin, std::min(kScatterPiece, values.numel() - begin)));
    }
    return out;
  };
  constexpr int64_t kGatherTags = int64_t{1} << 20;
  const auto mine = pieces(chunk(r));

  // All-to-all: every receive is posted first, then each piece of each chunk is encoded once and
  // sent to the chunk's owner while the next one is encoded (the peer's receive is already
  // posted, so nothing waits on an order).
  std::vector<std::vector<torch::Tensor>> incoming(static_cast<size_t>(m));
  std::vector<std::vector<std::unique_ptr<Posted>>> receiving(static_cast<size_t>(m));
  for (int64_t k = 1; k < m; ++k) {
    const int64_t from = (r + m - k) % m;
    for (size_t p = 0; p < mine.size(); ++p) {
      auto& buffer = incoming[static_cast<size_t>(from)].emplace_back(encoded_buffer(encoding, mine[p]));
      receiving[static_cast<size_t>(from)].push_back(impl_->post_recv(buffer, from, static_cast<int64_t>(p)));
    }
  }
  std::vector<std::unique_ptr<Posted>> sending;
  for (int64_t k = 1; k < m; ++k) {
    const int64_t to = (r + k) % m;
    const auto theirs = pieces(chunk(to));
    for (size_t p = 0; p < theirs.size(); ++p) sending.push_back(impl_->post_send(encode(theirs[p], encoding), to, static_cast<int64_t>(p)));
  }
  // The owner's sum, in fp32 and rank order, with its own values as they are; each piece is
  // decoded as soon as it has arrived.
  auto sum = torch::zeros_like(chunk(r));
  const auto sums = pieces(sum);
  for (int64_t q = 0; q < m; ++q) {
    for (size_t p = 0; p < mine.size(); ++p) {
      if (q == r) {
        sums[p].add_(mine[p]);
        continue;
      }
      finish(receiving[static_cast<size_t>(q)][p]);
      auto target = sums[p];
      decode_add(incoming[static_cast<size_t>(q)][p], encoding, target);
    }
  }
  for (auto& posted : sending) finish(posted);
  sending.clear();

  // All-gather, direct: each owner encodes its sum once and sends it to every other rank; every
  // rank, the owner included, takes the decoded bytes as the result, so all hold the same values.
  std::vector<std::vector<std::pair<torch::Tensor, torch::Tensor>>> results(static_cast<size_t>(m));  // (target, bytes)
  std::vector<std::vector<std::unique_ptr<Posted>>> gathering(static_cast<size_t>(m));
  for (int64_t k = 1; k < m; ++k) {
    const int64_t from = (r + m - k) % m;
    const auto targets = pieces(chunk(from));
    for (size_t p = 0; p < targets.size(); ++p) {
      auto& [target, buffer] = results[static_cast<size_t>(from)].emplace_back(targets[p], encoded_buffer(encoding, targets[p]));
      gathering[static_cast<size_t>(from)].push_back(impl_->post_recv(buffer, from, kGatherTags + static_cast<int64_t>(p)));
    }
  }
  for (size_t p = 0; p < sums.size(); ++p) {
    auto encoded = encode(sums[p], encoding);
    for (int64_t k = 1; k < m; ++k) sending.push_back(impl_->post_send(encoded, (r + k) % m, kGatherTags + static_cast<int64_t>(p)));
    mine[p].copy_(decode(encoded, encoding, mine[p].numel()));
  }
  for (int64_t k = 1; k < m; ++k) {
    const int64_t from = (r + m - k) % m;
    auto& posted = gathering[static_cast<size_t>(from)];
    for (size_t p = 0; p < posted.size(); ++p) {
      finish(posted[p]);
      auto& [target, buffer] = results[static_cast<size_t>(from)][p];
      target.copy_(decode(buffer, encoding, target.numel()));
    }
  }
  for (auto& posted : sending) finish(posted);
  stats.participants = m;
  return stats;
}

CommStats Group::reduce_ring(torch::Tensor& flat, Encoding encoding) {
  const int64_t m = size(), r = rank();
  const Chunks chunk{flat, m};
  const int64_t next = (r + 1) % m, previous = (r + m - 1) % m;
  CommStats stats;
  // Reduce-scatter: at hop k, send the running sum of chunk r − k, receive that of chunk r − k − 1
  // and add this rank's own values to it. After M − 1 hops this rank holds chunk r + 1's sum.
  auto outgoing = encode(chunk(r), encoding);
  for (int64_t k = 0; k < m - 1; ++k) {
    auto target = chunk(r - k - 1);
    auto incoming = encoded_buffer(encoding, target);
    stats += send_recv(outgoing, next, incoming, previous, k);
    decode_add(incoming, encoding, target);
    outgoing = encode(target, encoding);
  }
  stats += ring_all_gather(*this, chunk, r + 1, outgoing, encoding);
  stats.participants = m;
  return stats;
}

CommStats Group::send_recv(const torch::Tensor& out, int64_t to, torch::Tensor& in, int64_t from, int64_t tag) {
  check_peer(*impl_, to, "send_recv");
  check_peer(*impl_, from, "send_recv");
  return timed([&] {
    Staged staged(in);
    CommStats stats = impl_->send_recv(out.to(torch::kCPU).contiguous(), to, staged.staged, from, tag);
    staged.write_back();
    return stats;
  });
}

}  // namespace loco::comm
