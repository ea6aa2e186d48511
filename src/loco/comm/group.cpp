#include "loco/comm/group.h"

#include <chrono>

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

template <class F>
CommStats timed(F&& operation) {
  const auto start = Clock::now();
  CommStats stats = operation();
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

}  // namespace

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
}

Group::Group(std::shared_ptr<GroupImpl> impl) : impl_(std::move(impl)) { LOCO_CHECK(impl_ != nullptr, "null group"); }

Group Group::single() { return Group(std::make_shared<SingleGroup>()); }

Group Group::connect(std::shared_ptr<KeyValueStore> store, const GroupOptions& options) {
  options.validate();
  if (options.size == 1) return single();
  return Group(connect_gloo(std::move(store), options));
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

}  // namespace loco::comm
