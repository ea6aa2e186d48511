#include "loco/comm/group.h"

#include <algorithm>
#include <chrono>

#include "loco/comm/codec_kernels.h"
#include "loco/comm/staged.h"
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
  stats.round_trip_s = counters_->link.round_trip_s;
  counters_->bytes_sent += stats.bytes_sent;
  return stats;
}

CommStats& CommStats::operator+=(const CommStats& other) {
  bytes_sent += other.bytes_sent;
  bytes_received += other.bytes_received;
  seconds += other.seconds;
  participants = std::max(participants, other.participants);
  if (!other.route.empty()) route = other.route;
  round_trip_s = std::max(round_trip_s, other.round_trip_s);
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
  if (data_plane != DataPlane::kOpen && secret.size() < 32) {
    throw ConfigError("comm", fmt::format("a data plane '{}' needs the run's secret (32 bytes or more), got {} bytes",
                                          to_string(data_plane), secret.size()));
  }
}

const char* to_string(DataPlane plane) {
  switch (plane) {
    case DataPlane::kOpen: return "open";
    case DataPlane::kAuthenticated: return "authenticated";
    case DataPlane::kEncrypted: return "encrypted";
  }
  return "?";
}

DataPlane parse_data_plane(std::string_view text) {
  for (auto plane : {DataPlane::kOpen, DataPlane::kAuthenticated, DataPlane::kEncrypted}) {
    if (text == to_string(plane)) return plane;
  }
  throw ConfigError("comm", fmt::format("data plane '{}': expected open, authenticated or encrypted", text));
}

Group::Group(std::shared_ptr<GroupImpl> impl) : impl_(std::move(impl)) { LOCO_CHECK(impl_ != nullptr, "null group"); }

Group Group::single() { return Group(std::make_shared<SingleGroup>()); }

Group Group::connect(std::shared_ptr<KeyValueStore> store, const GroupOptions& options) {
  options.validate();
  if (options.size == 1) return single();
  // A sealed data plane travels on loco's transport, which reads nothing before a connection has
  // proven membership; Gloo parses its frames before any seal is looked at (docs/security.md).
  auto impl = options.data_plane == DataPlane::kOpen ? connect_gloo(std::move(store), options)
                                                     : seal(connect_tcp(std::move(store), options), options);
  Group group(std::move(impl));
  group.measure_round_trip();
  return group;
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
  options.data_plane = data_plane_;
  options.secret = secret_;
  return Group::connect(store_, options);
}

void GroupFactory::set_data_plane(DataPlane plane, std::string secret) {
  data_plane_ = plane;
  secret_ = std::move(secret);
}

CommStats Group::all_reduce_sum(std::vector<torch::Tensor>& tensors) {
  const bool fp32 = std::all_of(tensors.begin(), tensors.end(), [](const torch::Tensor& t) {
    return t.scalar_type() == torch::kFloat32;
  });
  if (impl_->sealed() && fp32 && !tensors.empty()) return all_reduce_sealed(tensors);
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

CommStats Group::all_reduce_sealed(std::vector<torch::Tensor>& tensors) {
  if (tensors.size() == 1) return all_reduce_sum(tensors.front(), ReduceOptions{});
  auto flat = flatten(tensors);
  CommStats stats = all_reduce_sum(flat, ReduceOptions{});
  unflatten(flat, tensors);
  return stats;
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
