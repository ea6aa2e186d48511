#include "loco/algorithms/async_outer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <thread>

#include "loco/algorithms/flat_buffer.h"
#include "loco/algorithms/membership.h"
#include "loco/algorithms/screening.h"
#include "loco/core/error.h"
#include "loco/model/transformer.h"

namespace loco::algorithms {

namespace {

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Whether `sizes` cut `total` values into fragments (each of at least one value).
bool cuts(const std::vector<int64_t>& sizes, int64_t total) {
  int64_t sum = 0;
  for (const int64_t n : sizes) {
    if (n <= 0 || n > total) return false;
    sum += n;
  }
  return sum == total;
}

// Fragment p's delayed Nesterov state by name: "outer.<name>" with one fragment (the files of runs
// before fragments), "outer.<p>.<name>" with several.
std::string outer_prefix(size_t p, size_t fragments) { return fragments == 1 ? std::string("outer.") : fmt::format("outer.{}.", p); }

}  // namespace

AsyncOuterServer::AsyncOuterServer(AsyncOptions options) : options_(options) {
  options_.validate();
  members_.resize(static_cast<size_t>(options_.workers));
}

void AsyncOuterServer::check(const AsyncPush& push) const {
  const auto bad = [&](const std::string& why) { throw Error("async", fmt::format("worker {}'s exchange: {}", push.worker, why)); };
  if (push.worker < 0 || push.worker >= options_.workers) bad(fmt::format("not one of the run's {} workers", options_.workers));
  if (push.values.defined() && (push.values.dim() != 1 || push.values.scalar_type() != torch::kFloat32)) {
    bad("the values sent must be one flat fp32 tensor");
  }
  const int64_t parts = theta_.defined() ? fragments() : std::max<int64_t>(1, std::ssize(push.fragment_sizes));
  if (push.fragment < -1 || push.fragment >= parts || (push.fragment < 0 && push.base_version >= 0 && push.steps > 0 && parts > 1)) {
    bad(fmt::format("fragment {}; the run's θ has {} (an outer gradient names its own when there are several)", push.fragment, parts));
  }
  const bool of_fragment = push.fragment >= 0 && theta_.defined();
  const int64_t size = of_fragment ? slice(push.fragment).numel() : theta_.defined() ? theta_.numel() : options_.values;
  if (size > 0 && push.values.defined() && push.values.numel() != size) {
    bad(fmt::format("{} values; the {} has {}", push.values.numel(), of_fragment ? fmt::format("fragment {}", push.fragment) : "model", size));
  }
  if (!push.fragment_sizes.empty()) {
    if (!push.values.defined() || !cuts(push.fragment_sizes, push.values.numel())) bad("its fragments' sizes do not cut its values");
    if (theta_.defined() && fragment_sizes() != push.fragment_sizes) bad("its fragments are not the run's (another sync.fragments or model?)");
  }
  if (push.steps < 0 || push.steps > options_.inner_steps || push.cycle < 0) {
    bad(fmt::format("{} steps in its cycle {}; a cycle has 0 to {}", push.steps, push.cycle, options_.inner_steps));
  }
  if (!std::isfinite(push.seconds) || push.seconds < 1e-6 * static_cast<double>(push.steps) || push.seconds > 1e6) {
    bad(fmt::format("{} s for its {} steps", push.seconds, push.steps));
  }
  if (push.base_version >= 0 && !theta_.defined()) {
    bad(fmt::format("an outer gradient of version {}, but this run's outer state has none (the coordinator started the run "
                    "anew: restart it with --resume, or it had saved nothing to resume from)", push.base_version));
  }
  const int64_t current = of_fragment ? versions_[static_cast<size_t>(push.fragment)] : version_;
  if (push.base_version > current) bad(fmt::format("an outer gradient of version {}, ahead of θ's {}", push.base_version, current));
  if (push.base_version < 0 && !theta_.defined()) {
    if (!push.values.defined()) bad("the first worker to arrive must send its initial parameters");
    if (!torch::isfinite(push.values).all().item<bool>()) bad("its initial parameters are not all finite");
  }
}

void AsyncOuterServer::start_state(torch::Tensor theta, std::vector<int64_t> sizes) {
  if (sizes.empty()) sizes = {theta.numel()};
  theta_ = std::move(theta);
  offsets_ = {0};
  outers_.clear();
  for (const int64_t n : sizes) {
    outers_.emplace_back(theta_.narrow(0, offsets_.back(), n), options_.lr, options_.momentum, options_.delay_or_default());
    offsets_.push_back(offsets_.back() + n);
  }
  versions_.assign(sizes.size(), 0);
  kept_norms_.assign(sizes.size(), {});
}

std::vector<int64_t> AsyncOuterServer::fragment_sizes() const {
  std::vector<int64_t> sizes;
  for (size_t p = 0; p + 1 < offsets_.size(); ++p) sizes.push_back(offsets_[p + 1] - offsets_[p]);
  return sizes;
}

torch::Tensor AsyncOuterServer::slice(int64_t fragment) const {
  const auto p = static_cast<size_t>(fragment);
  return theta_.narrow(0, offsets_[p], offsets_[p + 1] - offsets_[p]);
}

AsyncReply AsyncOuterServer::exchange(const AsyncPush& push, Clock::time_point now) {
  std::unique_lock lock(mutex_);
  check(push);
  auto& me = members_[static_cast<size_t>(push.worker)];
  if (push.member != me.member) {
    if (me.member == kVacant) {
      throw SlotTaken(fmt::format("worker {}'s slot is vacant: member {} does not hold it (taken as gone, or never joined)",
                                  push.worker, push.member));
    }
    throw SlotTaken(fmt::format("worker {}'s slot is held by member {} now; member {} was replaced (taken as gone)", push.worker,
                                me.member, push.member));
  }
  me.heard = now;
  release_silent(now);
  const int64_t tenure = me.tenure;
  AsyncReply reply;
  // An outer gradient: of steps, or a fragment's flush once its share was done (no steps).
  const bool flush = push.steps == 0 && push.fragment >= 0 && push.values.defined();
  const bool sends = push.base_version >= 0 && (push.steps > 0 || flush);
  if (push.base_version < 0 && !theta_.defined()) {  // the first contact starts the run from its θ
    start_state(push.values.clone(), push.fragment_sizes);
  } else if (sends && push.cycle > 0 && push.cycle <= me.last_cycle) {
    // A retry of a cycle already counted (its answer was lost): answered as it was, not applied again.
    reply.applied = me.last_applied;
    reply.staleness = me.last_staleness;
    reply.rejected = me.last_rejected;
  } else if (sends) {
    me.last_cycle = std::max(me.last_cycle, push.cycle);
    reply.staleness = (push.fragment >= 0 ? versions_[static_cast<size_t>(push.fragment)] : version_) - push.base_version;
    if (push.steps > 0 && push.seconds > 0) {  // its speed, smoothed: one cycle's (the first's above all) is noisy
      const double v = static_cast<double>(push.steps) / push.seconds;
      me.speed = me.speed > 0 ? 0.5 * (me.speed + v) : v;
    }
    // Its steps count when it holds a cycle: one taken as gone (silent, or its process exited)
    // has had its cycle given to the others, and its Δ is applied all the same without counting
    // those steps twice.
    const int64_t counted = me.assigned > 0 ? push.steps : 0;
    double scale = 1;
    reply.rejected = left_out(push, counted, reply.staleness, scale);
    if (reply.rejected.empty()) steps_done_ += counted;
    me.assigned = 0;
    me.last_steps = counted;
    if (reply.rejected.empty()) {
      const auto waited_from = Clock::now();
      reply.staleness = apply_in_batch(lock, push, scale);
      reply.applied = true;
      now += Clock::now() - waited_from;  // its next cycle begins when the answer goes
      if (me.tenure != tenure) {
        // Released or replaced while its Δ waited in the batch (its process exited): applied, and
        // nothing more is given to it or owed by it.
        reply.finished = finished_locked();
        return reply;
      }
    } else {
      ++rejected_;
      notes_.push_back(fmt::format("worker {}'s outer gradient left out: {}", push.worker, reply.rejected));
    }
    me.last_applied = reply.applied;
    me.last_staleness = reply.staleness;
    me.last_rejected = reply.rejected;
    if (flush) me.unflushed = std::max<int64_t>(0, me.unflushed - 1);  // (once judged: the run is not over before)
  }
  me.gone = false;
  // A flush gets no share (the worker asks once its flushes are in); a worker whose share is done
  // owes the Δ of its other fragments.
  reply.steps_next = flush ? 0 : next_share(push.worker, now);
  if (push.steps > 0) me.unflushed = reply.steps_next == 0 ? fragments() - 1 : 0;
  const bool one_fragment = push.fragment >= 0 && sends;
  reply.version = one_fragment ? versions_[static_cast<size_t>(push.fragment)] : version_;
  reply.schedule_step = progress(now);
  reply.schedule_rate = schedule_rate(me);
  reply.finished = finished_locked();
  if (reply.finished || (reply.steps_next > 0 && !one_fragment)) {
    reply.theta = theta_.clone();
    reply.versions = versions_;
  } else if (reply.steps_next > 0) {
    reply.theta = slice(push.fragment).clone();
  }  // (a waiting worker needs none)
  if (open_) batch_closed_.notify_all();  // a batch may have been waiting for this worker
  return reply;
}

// Why an outer gradient is left out ("" when kept; `scale` < 1 when it is clipped). The steps of
// one left out for its staleness or screening count as done; those sent after the run's steps
// were all done do not.
std::string AsyncOuterServer::left_out(const AsyncPush& push, int64_t steps, int64_t staleness, double& scale) {
  if (finished_locked()) return "the run's steps were all done";
  std::string why;
  if (!push.values.defined()) {
    why = "no outer gradient came with its steps";
  } else if (staleness > options_.staleness_or_default()) {
    why = fmt::format("{} versions stale (sync.async_max_staleness {})", staleness, options_.staleness_or_default());
  } else {
    why = screen(push.values, std::max<int64_t>(push.fragment, 0), scale);
  }
  if (!why.empty()) steps_done_ += steps;
  return why;
}

// Δ joins the open batch (or opens one); the batch is applied, arrival by arrival, once every
// worker whose cycle should end by then has arrived or `grace` of this cycle's time has passed
// since the batch opened (at most max_wait_s), so that workers that arrive together continue from
// the same θ. Returns the staleness Δ was applied at.
int64_t AsyncOuterServer::apply_in_batch(std::unique_lock<std::mutex>& lock, const AsyncPush& push, double scale) {
  if (!open_) {
    open_ = std::make_shared<Batch>();
    const double wait = closing_ ? 0.0 : std::min(options_.grace * push.seconds, options_.max_wait_s);
    open_->deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(wait * 1e6));
  }
  const auto batch = open_;
  const size_t index = batch->entries.size();
  batch->entries.push_back({push.worker, std::max<int64_t>(push.fragment, 0), push.base_version, push.steps,
                            scale == 1 ? push.values : push.values * scale, 0});
  // Awaited: the workers with a cycle under way that should end before the deadline (or whose
  // speed is not known yet). Once none is left, the batch closes.
  const auto awaited = [&] {
    return std::any_of(members_.begin(), members_.end(), [&](const Member& m) {
      if (m.gone || m.assigned == 0) return false;
      if (m.speed <= 0) return true;
      const double seconds = std::min(static_cast<double>(m.assigned) / m.speed, 1e6);
      return m.since + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)) <= batch->deadline;
    });
  };
  if (awaited()) batch_closed_.wait_until(lock, batch->deadline, [&] { return batch->closed || closing_ || !awaited(); });
  if (!batch->closed) apply(*batch);
  return batch->entries[index].staleness;
}

// A batch's outer gradients, one by one in arrival order (delayed Nesterov).
void AsyncOuterServer::apply(Batch& batch) {
  for (auto& entry : batch.entries) {
    auto& version = versions_[static_cast<size_t>(entry.fragment)];
    entry.staleness = version - entry.base_version;
    outers_[static_cast<size_t>(entry.fragment)].step(entry.delta);
    ++version;
    ++version_;
    ++applied_;
  }
  batch.closed = true;
  if (open_.get() == &batch) open_.reset();
  batch_closed_.notify_all();
}

void AsyncOuterServer::close() {
  std::lock_guard lock(mutex_);
  closing_ = true;
  if (open_) apply(*open_);
}

double AsyncOuterServer::schedule_rate(const Member& me) const {
  double total_speed = 0;
  int64_t known = 0;
  for (const auto& m : members_) {
    if (!m.gone && m.speed > 0) total_speed += m.speed, ++known;
  }
  // With every worker at its speed, the run's progress per inner step of this one.
  return me.speed > 0 && known > 0 ? total_speed / static_cast<double>(known) / me.speed : 1.0;
}

// Why Δ is left out ("" when kept); `scale` < 1 when it is clipped.
std::string AsyncOuterServer::screen(const torch::Tensor& delta, int64_t fragment, double& scale) {
  const double norm = delta.norm().item<double>();  // NaN or infinite when a value is
  if (!std::isfinite(norm)) {
    if (options_.screening.reject_not_finite) return "a value that is not finite";
    return "";
  }
  const auto& s = options_.screening;
  // Each fragment against its own (fragments differ in size; a flush's Δ covers fewer steps).
  auto& kept = kept_norms_[static_cast<size_t>(fragment)];
  if (s.reject_ratio > 0 && kept.size() >= 2) {
    const double reference = median({kept.begin(), kept.end()});
    if (norm > s.reject_ratio * reference) {
      return fmt::format("norm {:.4g} over {:g} x the median {:.4g} of the last kept", norm, s.reject_ratio, reference);
    }
  }
  kept.push_back(norm);
  if (std::ssize(kept) > options_.workers) kept.pop_front();
  if (s.clip_norm > 0 && norm > s.clip_norm) scale = s.clip_norm / norm;
  return "";
}

void AsyncOuterServer::seat(int64_t worker, int64_t member) {
  std::lock_guard lock(mutex_);
  LOCO_CHECK(worker >= 0 && worker < options_.workers, "slot {} of {}", worker, options_.workers);
  auto& m = members_[static_cast<size_t>(worker)];
  if (m.assigned > 0) notes_.push_back(fmt::format("worker {}'s cycle of {} steps goes back to the others: a new member holds its slot", worker, m.assigned));
  const int64_t tenure = m.tenure + 1;
  m = Member{};
  m.member = member;
  m.tenure = tenure;
  m.gone = member == kVacant;
  if (open_) batch_closed_.notify_all();  // a batch may have been waiting for its predecessor
}

bool AsyncOuterServer::release(int64_t worker, bool vacate) {
  std::lock_guard lock(mutex_);
  LOCO_CHECK(worker >= 0 && worker < options_.workers, "slot {} of {}", worker, options_.workers);
  auto& m = members_[static_cast<size_t>(worker)];
  const bool had = m.assigned > 0;
  if (had) notes_.push_back(fmt::format("worker {} is gone: its cycle of {} steps goes to the others", worker, m.assigned));
  let_go(m);
  ++m.tenure;
  if (vacate) m.member = kVacant;
  if (open_) batch_closed_.notify_all();
  return had;
}

bool AsyncOuterServer::silent(int64_t worker, Clock::time_point now) {
  std::lock_guard lock(mutex_);
  release_silent(now);
  return members_.at(static_cast<size_t>(worker)).gone;
}

bool AsyncOuterServer::heard(int64_t worker) const {
  std::lock_guard lock(mutex_);
  return members_.at(static_cast<size_t>(worker)).heard.has_value();
}

// A worker silent well past its cycle's time is gone: its share goes back to the others. One
// between cycles (waiting for a share, which it asks for every 200 ms, or owing flushes) is gone
// after `silence_s` without a word, unless the run is over (its members then only end).
void AsyncOuterServer::release_silent(Clock::time_point now) {
  const bool over = finished_locked();
  for (size_t w = 0; w < members_.size(); ++w) {
    auto& m = members_[w];
    if (m.gone) continue;
    if (m.assigned > 0) {
      const double expected = m.speed > 0 ? static_cast<double>(m.assigned) / m.speed : 0;
      if (seconds_between(m.since, now) <= std::max(options_.silence_s, 4 * expected)) continue;
      notes_.push_back(fmt::format("worker {} silent for {:.0f} s in a cycle of {} steps: gone; its steps go to the others", w,
                                   seconds_between(m.since, now), m.assigned));
    } else if (!over && m.heard && seconds_between(*m.heard, now) > options_.silence_s) {
      notes_.push_back(fmt::format("worker {} silent for {:.0f} s between its cycles{}: gone", w, seconds_between(*m.heard, now),
                                   m.unflushed > 0 ? fmt::format(" (it owed {} flushes)", m.unflushed) : ""));
    } else {
      continue;
    }
    let_go(m);
  }
}

// The steps of `worker`'s next cycle: H scaled by its speed against the fastest (dynamic local
// updates; a fifth of H for its first, which measures its speed), at most what is left of the
// run's budget once every cycle under way is counted. The last steps are shared by speed among
// the workers about to ask (none under way), so that they end together.
int64_t AsyncOuterServer::next_share(int64_t worker, Clock::time_point now) {
  auto& me = members_[static_cast<size_t>(worker)];
  me.assigned = 0;
  int64_t under_way = 0;
  double fastest = 0, idle_speed = 0;
  for (const auto& m : members_) {
    under_way += m.assigned;
    if (m.gone) continue;
    fastest = std::max(fastest, m.speed);
    if (m.assigned == 0) idle_speed += m.speed;
  }
  const int64_t left = std::max<int64_t>(0, options_.total_steps * options_.workers - steps_done_ - under_way);
  const int64_t h = options_.inner_steps;
  int64_t share = h;
  if (options_.dynamic_steps) {
    share = me.speed > 0 ? std::clamp<int64_t>(static_cast<int64_t>(std::floor(static_cast<double>(h) * me.speed / fastest)), 1, h)
                         : std::max<int64_t>(1, h / 5);
  }
  share = std::max<int64_t>(1, share / fragments());  // Streaming DiLoCo: one fragment's exchange every H_w / P steps
  if (me.speed > 0 && idle_speed > 0) {
    share = std::min<int64_t>(share, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(left) * me.speed / idle_speed))));
  }
  me.assigned = std::min(share, left);
  me.since = now;
  return me.assigned;
}

// The run's inner steps per worker so far, counting each cycle under way at its worker's speed.
double AsyncOuterServer::progress(Clock::time_point now) const {
  double steps = static_cast<double>(steps_done_);
  for (const auto& m : members_) {
    if (m.assigned > 0 && m.speed > 0) steps += std::min<double>(static_cast<double>(m.assigned), seconds_between(m.since, now) * m.speed);
  }
  return steps / static_cast<double>(options_.workers);
}

// Every step of the run done and applied (none waiting in a batch).
bool AsyncOuterServer::finished_locked() const {
  const bool owed = std::any_of(members_.begin(), members_.end(), [](const Member& m) { return !m.gone && m.unflushed > 0; });
  return theta_.defined() && !open_ && !owed && steps_done_ >= options_.total_steps * options_.workers;
}

AsyncOuterServer::Totals AsyncOuterServer::totals() const {
  std::lock_guard lock(mutex_);
  return {version_, applied_, rejected_, steps_done_, options_.total_steps * options_.workers, finished_locked()};
}

NamedTensors AsyncOuterServer::state() const {
  std::lock_guard lock(mutex_);
  if (!theta_.defined()) return {};
  NamedTensors out = {{"theta", theta_.clone()}};
  for (size_t p = 0; p < outers_.size(); ++p) {
    for (const auto& [name, tensor] : outers_[p].state()) out.emplace_back(outer_prefix(p, outers_.size()) + name, tensor.clone());
  }
  if (outers_.size() > 1) {  // several fragments: their sizes and versions too
    out.emplace_back("fragments", torch::tensor(fragment_sizes(), torch::kInt64));
    out.emplace_back("versions", torch::tensor(versions_, torch::kInt64));
  }
  int64_t waiting = 0;  // the steps of outer gradients not applied yet: trained again after a resume
  if (open_) {
    for (const auto& entry : open_->entries) waiting += entry.steps;
  }
  // A worker that owes flushes sent its last steps' Δ of one fragment only: a resumed run, whose
  // workers go back to their checkpoints, trains those steps again rather than lose the others.
  for (const auto& m : members_) {
    if (!m.gone && m.unflushed > 0) waiting += m.last_steps;
  }
  out.emplace_back("counters", torch::tensor({version_, applied_, rejected_, steps_done_ - waiting}, torch::kInt64));
  auto speeds = torch::zeros({options_.workers}, torch::kFloat64);
  for (int64_t w = 0; w < options_.workers; ++w) speeds[w] = members_[static_cast<size_t>(w)].speed;
  out.emplace_back("speeds", speeds);
  return out;
}

void AsyncOuterServer::load_state(const NamedTensors& tensors) {
  std::lock_guard lock(mutex_);
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  const auto take = [&](const std::string& key, torch::ScalarType type) {
    const auto it = by_name.find(key);
    if (it == by_name.end() || it->second.scalar_type() != type) {
      throw DataError("async", fmt::format("the outer state has no {} entry '{}'", c10::toString(type), key));
    }
    return it->second;
  };
  auto theta = take("theta", torch::kFloat32).flatten().clone();
  const auto counters = take("counters", torch::kInt64);
  const auto speeds = take("speeds", torch::kFloat64);
  if (counters.numel() != 4 || speeds.numel() != options_.workers) {
    throw DataError("async", fmt::format("the outer state's counters or speeds do not fit a run of {} workers", options_.workers));
  }
  std::vector<int64_t> sizes = {theta.numel()}, versions = {counters[0].item<int64_t>()};
  if (by_name.count("fragments") > 0) {
    const auto cut = take("fragments", torch::kInt64), at = take("versions", torch::kInt64);
    sizes.assign(cut.data_ptr<int64_t>(), cut.data_ptr<int64_t>() + cut.numel());
    versions.assign(at.data_ptr<int64_t>(), at.data_ptr<int64_t>() + at.numel());
    if (!cuts(sizes, theta.numel()) || versions.size() != sizes.size()) {
      throw DataError("async", "the outer state's fragments do not cut its θ, or their versions do not match them");
    }
  }
  // Each fragment's delayed Nesterov over its slice of θ.
  std::vector<optim::DelayedNesterov> outers;
  for (size_t p = 0, at = 0; p < sizes.size(); at += static_cast<size_t>(sizes[p]), ++p) {
    outers.emplace_back(theta.narrow(0, static_cast<int64_t>(at), sizes[p]), options_.lr, options_.momentum, options_.delay_or_default());
    const auto prefix = outer_prefix(p, sizes.size());
    NamedTensors outer_state;
    for (const auto& [name, tensor] : tensors) {
      if (name.starts_with(prefix) && name.find('.', prefix.size()) == std::string::npos) outer_state.emplace_back(name.substr(prefix.size()), tensor);
    }
    outers.back().load_state(outer_state);
  }
  theta_ = theta;
  outers_ = std::move(outers);
  versions_ = versions;
  kept_norms_.assign(versions.size(), {});
  offsets_ = {0};
  for (const int64_t n : sizes) offsets_.push_back(offsets_.back() + n);
  version_ = counters[0].item<int64_t>();
  applied_ = counters[1].item<int64_t>();
  rejected_ = counters[2].item<int64_t>();
  steps_done_ = counters[3].item<int64_t>();
  for (int64_t w = 0; w < options_.workers; ++w) members_[static_cast<size_t>(w)].speed = speeds[w].item<double>();
}

std::vector<std::string> AsyncOuterServer::take_notes() {
  std::lock_guard lock(mutex_);
  return std::exchange(notes_, {});
}

}  // namespace loco::algorithms
