// Asynchronous DiLoCo, a worker's side (async_outer.h): its exchanges with the outer state, one
// fragment at a time when the model is cut into Streaming DiLoCo's fragments.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <thread>

#include "loco/algorithms/async_outer.h"
#include "loco/algorithms/flat_buffer.h"
#include "loco/algorithms/streaming.h"
#include "loco/core/error.h"
#include "loco/model/transformer.h"

namespace loco::algorithms {

AsyncDiLoCo::AsyncDiLoCo(std::shared_ptr<OuterServerLink> link, int64_t worker, Poison poison, const std::atomic<bool>* stop,
                         AsyncWorkerOptions options)
    : link_(std::move(link)), worker_(worker), poison_(poison), stop_(stop), options_(options) {
  LOCO_CHECK(options_.fragments >= 1, "{} fragments", options_.fragments);
}

torch::Tensor AsyncDiLoCo::values(size_t fragment) const {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> pieces;
  for (const auto& v : fragments_[fragment].views) pieces.push_back(v.detach().to(torch::kCPU, torch::kFloat32).reshape({-1}));
  return torch::cat(pieces);
}

void AsyncDiLoCo::load(size_t fragment, const torch::Tensor& flat, bool merge) {
  torch::NoGradGuard no_grad;
  const double alpha = merge ? options_.merge_alpha : 0.0;
  int64_t at = 0;
  for (auto& v : fragments_[fragment].views) {
    const int64_t n = v.numel();
    if (at + n > flat.numel()) throw PeerError("async", fmt::format("fragment {}'s θ came with {} values, fewer than its parameters'", fragment, flat.numel()));
    const auto global = flat.narrow(0, at, n).view(v.sizes()).to(v.device(), v.scalar_type());
    if (alpha > 0) {
      v.mul_(alpha).add_(global, 1 - alpha);
    } else {
      v.copy_(global);
    }
    at += n;
  }
  if (at != flat.numel()) throw PeerError("async", fmt::format("fragment {}'s θ came with {} values, its parameters have {}", fragment, flat.numel(), at));
  auto& f = fragments_[fragment];
  f.base = flat;
  at = 0;
  for (auto& g : f.global) {
    g.copy_(flat.narrow(0, at, g.numel()).view(g.sizes()));
    at += g.numel();
  }
}

SyncReports AsyncDiLoCo::on_start(model::Transformer& model, int64_t step) {
  fragments_.assign(static_cast<size_t>(options_.fragments), {});
  if (options_.fragments == 1) {  // the parameters in their groups' order
    for (const auto& group : model->parameter_groups()) {
      for (const auto& p : group.parameters) fragments_[0].views.push_back(p);
    }
  } else {
    std::vector<torch::Tensor> parameters;
    global_.clear();
    for (const auto& item : model->named_parameters()) {
      parameters.push_back(item.value());
      global_.push_back(item.value().detach().to(torch::kCPU, torch::kFloat32).clone());
    }
    const auto plan = plan_fragments(model, options_.fragments, options_.pattern);
    for (size_t p = 0; p < plan.size(); ++p) {
      for (const auto& s : plan[p]) {
        fragments_[p].views.push_back(parameters[s.index].narrow(0, s.begin, s.rows));
        fragments_[p].global.push_back(global_[s.index].narrow(0, s.begin, s.rows));
      }
    }
  }
  AsyncPush hello;
  hello.worker = worker_;
  std::vector<torch::Tensor> all;
  for (size_t p = 0; p < fragments_.size(); ++p) {
    all.push_back(values(p));
    if (options_.fragments > 1) hello.fragment_sizes.push_back(all.back().numel());
  }
  hello.values = torch::cat(all);
  adopt(wait_for_share(exchange(std::move(hello))), std::nullopt, step);
  joined_under_way_ = schedule_base_ > 0;
  done_ = steps_next_ == 0;
  return {};
}

AsyncReply AsyncDiLoCo::wait_for_share(AsyncReply reply) {
  while (reply.steps_next == 0 && !reply.finished) {
    if (stop_ != nullptr && stop_->load()) throw RunStopping("the run is stopping; this worker's share of its steps was done");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    AsyncPush ask;
    ask.worker = worker_;
    ask.base_version = reply.version;
    reply = exchange(std::move(ask));
  }
  return reply;
}

AsyncReply AsyncDiLoCo::exchange(AsyncPush push) {
  push.member = options_.member;
  if (push.values.defined()) bytes_sent_ += push.values.numel() * 4;
  return link_->exchange(push);
}

AsyncReply AsyncDiLoCo::flush(size_t last, AsyncReply reply) {
  for (size_t k = 1; k < fragments_.size() && !reply.finished; ++k) {
    const size_t p = (last + k) % fragments_.size();
    AsyncPush push;
    push.worker = worker_;
    push.fragment = static_cast<int64_t>(p);
    push.base_version = fragments_[p].base_version;
    push.values = fragments_[p].base - values(p);
    push.cycle = ++cycles_;
    reply = exchange(std::move(push));
  }
  return reply;
}

// Continues from the reply's θ, the base of the next exchange of its fragment (of every fragment
// when it is the whole θ), with the reply's schedule.
void AsyncDiLoCo::adopt(const AsyncReply& reply, std::optional<size_t> fragment, int64_t step) {
  if (fragment) {
    load(*fragment, reply.theta, /*merge=*/true);
    fragments_[*fragment].base_version = reply.version;
    whole_ = fragments_.size() == 1;
  } else {
    if (!reply.versions.empty() && reply.versions.size() != fragments_.size()) {
      throw PeerError("async", fmt::format("the outer state answered with {} fragments' versions; this worker has {} fragments",
                                           reply.versions.size(), fragments_.size()));
    }
    int64_t at = 0;
    for (size_t p = 0; p < fragments_.size(); ++p) {
      int64_t n = 0;
      for (const auto& v : fragments_[p].views) n += v.numel();
      if (at + n > reply.theta.numel()) throw PeerError("async", fmt::format("the global parameters came with {} values, fewer than the model's", reply.theta.numel()));
      load(p, reply.theta.narrow(0, at, n).clone());
      fragments_[p].base_version = reply.versions.empty() ? reply.version : reply.versions[p];
      at += n;
    }
    if (at != reply.theta.numel()) throw PeerError("async", fmt::format("the global parameters came with {} values, the model has {}", reply.theta.numel(), at));
    whole_ = true;
  }
  steps_next_ = reply.steps_next;
  schedule_base_ = reply.schedule_step;
  schedule_rate_ = reply.schedule_rate;
  cycle_steps_ = 0;
  cycle_start_step_ = step;
  cycle_start_ = std::chrono::steady_clock::now();
}

std::optional<double> AsyncDiLoCo::schedule_step(int64_t step) const {
  return schedule_base_ + static_cast<double>(step - cycle_start_step_) * schedule_rate_;
}

SyncReports AsyncDiLoCo::after_step(StepContext& context) {
  ++cycle_steps_;
  if (cycle_steps_ < steps_next_) return {};
  const int64_t step = context.step + 1;
  const auto start = std::chrono::steady_clock::now();
  const int64_t sent_before = bytes_sent_;
  const size_t p = next_;
  AsyncPush push;
  push.worker = worker_;
  push.fragment = fragments_.size() > 1 ? static_cast<int64_t>(p) : -1;
  push.base_version = fragments_[p].base_version;
  push.steps = cycle_steps_;
  push.seconds = std::chrono::duration<double>(start - cycle_start_).count();
  push.values = fragments_[p].base - values(p);
  push.cycle = ++cycles_;
  if (poison_.hits(worker_, cycles_)) {
    if (std::isnan(poison_.scale)) {
      push.values[0] = std::numeric_limits<float>::quiet_NaN();
    } else {
      push.values.mul_(poison_.scale);
    }
  }
  const int64_t round = cycles_;
  AsyncReply reply = exchange(std::move(push));
  const AsyncReply sent = reply;  // what its own outer gradient met
  if (reply.steps_next > 0 && !reply.finished) {
    adopt(reply, p, step);
    next_ = (p + 1) % fragments_.size();
  } else {
    // Its share done: it sends its other fragments' Δ, waits for the others' last outer gradients
    // and ends on the run's final θ (or takes up a share a worker that went silent left).
    reply = wait_for_share(flush(p, reply));
    adopt(reply, std::nullopt, step);
    next_ = 0;
  }
  done_ = reply.steps_next == 0;
  SyncReport report;
  report.round = round;
  report.step = step;
  report.world_size = 1;
  report.fragment = fragments_.size() > 1 ? static_cast<int64_t>(p) : -1;
  report.stats.bytes_sent = bytes_sent_ - sent_before;
  report.stats.bytes_received = reply.theta.numel() * 4;
  report.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.stall_seconds = report.stats.seconds;
  report.params_hash = hash_tensors({reply.theta});
  report.staleness = sent.staleness;
  report.rejected = sent.applied || sent.rejected.empty() ? 0 : 1;
  report.screening = sent.rejected;
  return {report};
}

}  // namespace loco::algorithms
