#include "loco/algorithms/streaming.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "loco/algorithms/screening.h"
#include "loco/core/error.h"
#include "loco/core/hash.h"
#include "loco/model/transformer.h"

namespace loco::algorithms {
namespace {

using Clock = std::chrono::steady_clock;

torch::Tensor scalar(int64_t value) { return torch::tensor(value, torch::kInt64); }

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace


std::vector<std::vector<FragmentSlice>> plan_fragments(const model::Transformer& model, int64_t fragments,
                                                       FragmentPattern pattern) {
  const int64_t blocks = model->num_blocks();
  if (fragments < 1 || fragments > blocks) {
    throw ConfigError("algorithms", fmt::format("sync.fragments = {} needs between 1 and {} (the model's blocks)",
                                                fragments, blocks));
  }
  std::map<std::string, size_t> index_of;
  for (const auto& item : model->named_parameters()) index_of.emplace(item.key(), index_of.size());

  std::vector<std::vector<FragmentSlice>> plan(static_cast<size_t>(fragments));
  for (const auto& group : model->parameter_groups()) {
    const bool is_block = group.name.starts_with("block.");
    for (size_t j = 0; j < group.names.size(); ++j) {
      const size_t index = index_of.at(group.names[j]);
      const int64_t rows = group.parameters[j].size(0);
      if (is_block) {
        const int64_t block = std::stoll(group.name.substr(6));
        const int64_t p = pattern == FragmentPattern::kStrided ? block % fragments : block * fragments / blocks;
        plan[static_cast<size_t>(p)].push_back({index, group.names[j], 0, rows});
        continue;
      }
      for (int64_t p = 0; p < fragments; ++p) {
        const int64_t begin = p * rows / fragments, end = (p + 1) * rows / fragments;
        if (end == begin) continue;
        const std::string name = end - begin == rows ? group.names[j] : fmt::format("{}[{}:{}]", group.names[j], begin, end);
        plan[static_cast<size_t>(p)].push_back({index, name, begin, end - begin});
      }
    }
  }
  // In the model's parameter order, so that one fragment lays its values out as DiLoCo does.
  for (auto& slices : plan) {
    std::sort(slices.begin(), slices.end(),
              [](const auto& a, const auto& b) { return std::tie(a.index, a.begin) < std::tie(b.index, b.begin); });
  }
  return plan;
}

StreamingDiLoCo::StreamingDiLoCo(comm::Group group, StreamingOptions options, Membership* membership, std::string name)
    : elastic_(std::move(group), membership), options_(options), name_(std::move(name)) {
  options_.validate();
  LOCO_CHECK(!elastic_.elastic() || options_.overlap_steps * options_.fragments < options_.inner_steps,
             "elastic Streaming DiLoCo needs one fragment on the wire at a time (config validation checks it)");
  LOCO_CHECK(options_.weighting != Weighting::kShard || options_.shard_tokens > 0,
             "weighting by shard size needs the worker's shard size, got {} tokens", options_.shard_tokens);
}

bool StreamingDiLoCo::at_boundary() const {
  // Eager and elastic: an exchange is always in flight, and state() saves it as sent (to send again).
  if (options_.eager && elastic_.elastic()) return true;
  return std::none_of(fragments_.begin(), fragments_.end(), [](const Fragment& f) { return f.pending; });
}

StreamingDiLoCo::~StreamingDiLoCo() = default;

bool StreamingDiLoCo::starts_at(int64_t fragment, int64_t step) const {
  if (options_.round_seconds > 0) {
    return step <= options_.total_steps &&
           Clock::now() - round_start_ >= std::chrono::duration<double>(options_.round_seconds);
  }
  // Every fragment trains H inner steps before its first sync, at t_p + H, then every H steps.
  const int64_t offset = fragment * options_.inner_steps / options_.fragments;
  return step >= offset + options_.inner_steps && step <= options_.total_steps &&
         (step - offset) % options_.inner_steps == 0;
}

int64_t StreamingDiLoCo::apply_step(const Fragment& fragment) const {
  return std::min(fragment.started + options_.overlap_steps, options_.total_steps);
}

bool StreamingDiLoCo::in_sync() const {
  return std::all_of(fragments_.begin(), fragments_.end(), [&](const Fragment& f) { return !f.pending && f.exact == step_; });
}

SyncReports StreamingDiLoCo::on_start(model::Transformer& model, int64_t step) {
  torch::NoGradGuard no_grad;
  names_.clear();
  parameters_.clear();
  global_.clear();
  for (const auto& item : model->named_parameters()) {
    names_.push_back(item.key());
    parameters_.push_back(item.value());
    global_.push_back(item.value().detach().to(torch::kCPU, torch::kFloat32).clone());
  }
  fragments_.clear();
  fragments_.resize(static_cast<size_t>(options_.fragments));
  const auto plan = plan_fragments(model, options_.fragments, options_.pattern);
  for (size_t p = 0; p < fragments_.size(); ++p) {
    auto& f = fragments_[p];
    f.slices = plan[p];
    std::vector<std::string> names;
    for (const auto& s : f.slices) {
      names.push_back(s.name);
      f.local.push_back(parameters_[s.index].narrow(0, s.begin, s.rows));
      f.global.push_back(global_[s.index].narrow(0, s.begin, s.rows));
    }
    f.outer = std::make_unique<optim::OuterOptimizer>(names, f.global, options_.outer);
    if (keeps_sent()) f.sent = std::make_unique<FlatBuffer>(f.global, options_.piece_bytes);
    f.result = std::make_unique<FlatBuffer>(f.global, options_.piece_bytes);
    if (options_.eager) f.step_by = std::make_unique<FlatBuffer>(f.global, options_.piece_bytes);
    f.offset = static_cast<int64_t>(p) * options_.inner_steps / options_.fragments;
    f.started = step;
    f.exact = step;
  }
  step_ = step;
  round_start_ = Clock::now();
  if (!restored_ || restored_->empty()) {
    if (!elastic_.elastic()) {
      background_.submit([&] { return check_identical(elastic_.group(), global_, "the initial parameters"); }).get();
    } else if (elastic_.joining()) {
      // A joiner given the state as a sync starts (its round was convened again with it after a
      // peer failed, or re-opened on resume) then takes that sync's part with the others.
      SyncReports reports{join_round()};
      for (auto& report : advance(step_)) reports.push_back(std::move(report));
      return reports;
    }
    return {};
  }
  return resume(step);
}

SyncReports StreamingDiLoCo::resume(int64_t step) {
  // θ, the outer states and the schedule come from the checkpoint; the model holds θ_m.
  auto& restored = *restored_;
  for (size_t i = 0; i < names_.size(); ++i) restored.take_into("global." + names_[i], global_[i]);
  rounds_ = restored.take_int("streaming.rounds");
  if (options_.eager && restored.has("streaming.reported_hash")) {
    reported_hash_ = static_cast<uint64_t>(restored.take_int("streaming.reported_hash"));
  }
  for (size_t p = 0; p < fragments_.size(); ++p) {
    auto& f = fragments_[p];
    const std::string key = fmt::format("streaming.{}.", p);
    f.round = restored.take_int(key + "round");
    f.tokens = restored.take_int(key + "tokens");
    f.started = restored.take_int(key + "started");
    f.exact = restored.take_int(key + "exact");
    f.pending_tokens = restored.take_int(key + "pending_tokens");
    if (options_.eager) {
      f.final_phase = restored.take_int(key + "final_phase");
      if (f.final_phase == 1) restored.take_into(key + "step_by", f.step_by->flat());
      // Saved before it was kept: as that code stepped, with its weight in the sum (below).
      f.fresh_weight = restored.has(key + "fresh_weight") ? restored.take(key + "fresh_weight").item<double>() : -1;
    }
    if (restored.has(key + "result")) {
      restored.take_into(key + "result", f.result->flat());
      f.arrived = Reduced{{}, restored.take_int(key + "participants")};
      if (options_.eager) {  // the next eager step also needs what this worker sent, and its weight
        restored.take_into(key + "sent", f.sent->flat());
        f.arrived->weight = restored.take(key + "weight").item<double>();
        if (f.fresh_weight < 0) f.fresh_weight = f.arrived->weight;
      }
      f.pending = true;
    } else if (restored.has(key + "sent")) {
      // Without a copy kept (τ = 0), what it sent is what the model holds (its weights were saved
      // with it, unchanged since the sync started): stage() takes it from there.
      restored.take_into(key + "sent", f.sent ? f.sent->flat() : f.result->flat());
      stage(f);
      f.pending = true;
      f.sync_number = f.round;  // eager: f.round counted it when its sync's step was taken
      if (elastic_.elastic()) {  // eager: the exchange that was in flight, in its round again
        begin_round(rounds_ + 1, f.started, -1);
        rounds_ += 1;
        open_ = static_cast<int64_t>(p);
      }
      f.reduction = submit(f, plan_ && plan_->has_joiners());  // its collective failed: every worker sends again
    }
    if (f.fresh_weight < 0) f.fresh_weight = 1.0 / static_cast<double>(elastic_.group().size());
    f.outer->load_state(restored.take_prefix(fmt::format("outer.{}.", p)));
  }
  restored.expect_all_taken(" (was it saved with another sync.fragments?)");
  restored_.reset();
  // Eager and elastic: every worker continues from the leader's checkpoint, its θ, its exchange in
  // flight and its eager state; its model takes that θ too (its own holds its own replica's).
  if (options_.eager && elastic_.elastic()) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < global_.size(); ++i) parameters_[i].copy_(global_[i]);
    for (auto& f : fragments_) f.exact = step;
  }
  // Whatever this step still owed (a sync to start or to complete, left by a failed collective).
  return advance(step);
}

SyncReports StreamingDiLoCo::after_step(StepContext& context) {
  step_ = context.step + 1;
  for (auto& f : fragments_) f.tokens += context.step_tokens;
  return advance(step_);
}

SyncReports StreamingDiLoCo::advance(int64_t step) {
  const bool last = step == options_.total_steps;
  SyncReports reports;
  if (options_.eager) {
    for (size_t p = 0; p < fragments_.size(); ++p) {
      auto& f = fragments_[p];
      if (f.final_phase != 0) {  // the run's end, resumed after a failure stopped it
        if (last) reports.push_back(eager_finish(p, step, {}, elastic_.group().size(), -1));
      } else if (f.started < step && (starts_at(static_cast<int64_t>(p), step) || last)) {
        reports.push_back(eager_sync(p, step, last));
      }
    }
    return reports;
  }
  // Results due now (τ steps after their start, or the run's end), then the syncs that start now
  // (and at the last step every fragment that trained since its last start), then, when τ = 0 or
  // at the end, their results at once. Always in fragment order: every worker issues the same
  // collectives in the same order.
  for (size_t p = 0; p < fragments_.size(); ++p) {
    if (fragments_[p].pending && apply_step(fragments_[p]) <= step) reports.push_back(complete(p, step, last));
  }
  for (size_t p = 0; p < fragments_.size(); ++p) {
    auto& f = fragments_[p];
    if (f.pending || f.started >= step) continue;
    // At the last step, a fragment whose result was just applied exactly (α = 0) has nothing left
    // to send: syncing it again would send Δ = 0 and still move θ_p by the stale momentum.
    if (last && f.exact == step) continue;
    if (!starts_at(static_cast<int64_t>(p), step) && !last) continue;
    start(f, step);
    // Elastic rounds come one at a time: a sync due at once completes before the next starts.
    if (elastic_.elastic() && apply_step(f) <= step) reports.push_back(complete(p, step, last));
  }
  for (size_t p = 0; p < fragments_.size(); ++p) {
    if (fragments_[p].pending && apply_step(fragments_[p]) <= step) reports.push_back(complete(p, step, last));
  }
  return reports;
}

void StreamingDiLoCo::begin_round(int64_t round, int64_t step, int64_t failed_epoch, const std::string& failure) {
  plan_ = elastic_.begin(round, step, failed_epoch, failure);
}

void StreamingDiLoCo::start(Fragment& f, int64_t step) {
  torch::NoGradGuard no_grad;
  if (elastic_.elastic()) begin_round(rounds_ + 1, step, -1);
  if (f.sent) {
    auto& sent = f.sent->views();
    for (size_t i = 0; i < sent.size(); ++i) sent[i].copy_(f.local[i]);
  }
  stage(f);
  f.pending_tokens = f.tokens;
  f.tokens = 0;
  f.started = step;
  f.pending = true;
  f.stall = 0;
  f.failure = nullptr;
  f.reduction = submit(f, plan_ && plan_->has_joiners());
}

bool StreamingDiLoCo::dropped(size_t index) {
  if (options_.drop_probability <= 0) return false;
  const uint64_t key[4] = {options_.drop_seed, index, static_cast<uint64_t>(fragments_[index].round),
                           static_cast<uint64_t>(elastic_.group().rank())};
  const double draw = static_cast<double>(hash64(key, sizeof key) >> 11) * 0x1.0p-53;  // uniform in [0, 1)
  return draw < options_.drop_probability;
}

std::future<StreamingDiLoCo::Reduced> StreamingDiLoCo::submit(Fragment& f, bool tell_joiners) {
  const int64_t index = &f - fragments_.data();
  const bool drop = dropped(static_cast<size_t>(index));
  // Decided here, on the training thread (eager steps count f.round on while this exchange flies).
  const bool poison = options_.poison.hits(elastic_.group().rank(), options_.eager ? f.sync_number : f.round + 1);
  return background_.submit([this, &f, tell_joiners, index, drop, poison] {
    torch::NoGradGuard no_grad;
    comm::CommStats told;
    if (tell_joiners) {
      auto which = torch::tensor({index}, torch::kInt64);
      told = elastic_.group().broadcast(which, 0);
    }
    // w_m = s_m / Σ s, where s_m is the tokens worker m trained since this fragment's last sync,
    // or the size of its shard (1 when uniform), and 0 when its outer gradient is dropped: each
    // worker sends (s_m, 1, kept_m) with its data, and the sum weights each term as it arrives
    // (no collective of its own: the numbers ride with the data).
    double size = options_.weighting == Weighting::kShard     ? static_cast<double>(options_.shard_tokens)
                  : options_.weighting == Weighting::kUniform ? 1.0
                                                              : static_cast<double>(f.pending_tokens);
    if (drop) size = 0;
    auto& result = f.result->views();
    if (!f.sent) {
      // `result` holds θ_{m,p} (stage()): fp32 sends it as it is, an encoded exchange
      // Δ_m = θ_p − θ_{m,p}, computed as −(θ_{m,p} − θ_p), the same bits.
      if (options_.exchange != comm::Encoding::kFp32) {
        for (size_t i = 0; i < result.size(); ++i) result[i].sub_(f.global[i]).neg_();
      }
    } else if (options_.eager || options_.exchange == comm::Encoding::kFp32) {
      // Eager: Σ w_m Δ_m (`sent` holds this worker's Δ_m already, eager_sync, for θ_p moves on
      // meanwhile). Otherwise with fp32: Σ w_m θ_m, DiLoCo's own collective (see diloco.cpp).
      for (size_t i = 0; i < result.size(); ++i) result[i].copy_(f.sent->views()[i]);
    } else {
      // Σ w_m Δ_m with Δ_m = θ_p − θ_{m,p}, each worker's term encoded on the wire. θ_p changes
      // only when this fragment's result is applied, after this task.
      for (size_t i = 0; i < result.size(); ++i) torch::sub_out(result[i], f.global[i], f.sent->views()[i]);
    }
    // fp32 without eager sends θ_m (Σ w_m θ_m is the average), everything else Δ_m.
    const bool sends_theta = options_.exchange == comm::Encoding::kFp32 && !options_.eager;
    if (poison) apply_poison(result, f.global, sends_theta, options_.poison.scale);
    const double squared_norm = drop ? 0.0 : squared_outer_norm(result, f.global, sends_theta);
    comm::Tally tally = sync_tally(size, 1.0, drop ? 0.0 : 1.0, squared_norm, options_.screening);
    comm::CommStats stats = f.result->all_reduce_sum(elastic_.group(), options_.exchange, &tally, options_.screening.combine,
                                                     options_.screening.trim);
    const auto screened = screen(tally.all, options_.screening);
    if (screened.kept == 0 && screened.not_finite > 0 && screened.not_finite == screened.rejected) {
      throw DataError("algorithms", fmt::format("every outer gradient of this sync has a value that is not finite ({}): "
                                                "training diverged; hint: lower optim.lr or outer.lr", screened.why));
    }
    double applied = 0;
    for (const double w : tally.applied) applied += w;
    if (sends_theta && screened.kept > 0 && applied < 1 - 1e-12) {
      // Clipped: Σ w_m θ_m with Σ w_m < 1; θ − Σ w_m Δ_m needs the rest of θ.
      for (size_t i = 0; i < result.size(); ++i) result[i].add_(f.global[i], 1 - applied);
    }
    const int64_t participants = std::llround(tally.sum(1));
    const double weight = tally.applied[static_cast<size_t>(elastic_.group().rank())];
    stats += told;
    stats.participants = participants;
    return Reduced{stats, participants, weight, screened.kept == 0, screened.rejected, screened.why};
  });
}

SyncReport StreamingDiLoCo::complete(size_t index, int64_t step, bool last) {
  torch::NoGradGuard no_grad;
  auto& f = fragments_[index];
  const auto wait_start = Clock::now();
  while (!f.arrived) {
    if (f.failure) std::rethrow_exception(f.failure);
    LOCO_CHECK(f.reduction.valid(), "fragment {} has a sync in flight but nothing to wait for", index);
    try {
      f.arrived = f.reduction.get();
    } catch (const PeerError& e) {
      if (elastic_.elastic()) {
        // Nothing changed: the round is convened again with whoever is left, and the same
        // contribution goes out again (the weights renormalize over the survivors).
        begin_round(plan_->round, f.started, plan_->epoch, e.what());
        stage(f);
        f.reduction = submit(f, plan_->has_joiners());
        continue;
      }
      f.failure = std::current_exception();  // the fragment stays pending; state() keeps what it sent
      throw;
    }
  }
  f.stall += seconds_since(wait_start);
  const Reduced reduced = *f.arrived;

  if (reduced.empty) {
    // Every outer gradient was dropped: θ_p stays, and so does the outer optimizer's state.
  } else if (options_.exchange == comm::Encoding::kFp32) {
    f.outer->step_to_average(f.result->views());
  } else {
    f.outer->step(f.result->views());
  }
  // The merge: θ_{m,p} ← α·θ_{m,p} + (1 − α)·θ̃_p = lerp(θ̃_p, θ_{m,p}, α); α = 0 copies θ̃_p exactly.
  const double alpha = last ? 0.0 : options_.merge_alpha;
  for (size_t i = 0; i < f.local.size(); ++i) {
    auto global = f.global[i].to(f.local[i].device(), f.local[i].scalar_type());
    if (alpha == 0) f.local[i].copy_(global);
    else f.local[i].copy_(torch::lerp(global, f.local[i], alpha));
  }
  // Time-budgeted rounds: the contributors took different numbers of steps, and everyone continues
  // from the furthest one's (the round's step); otherwise every worker is at the same step.
  const int64_t round_step = plan_ ? std::max(step, plan_->step) : step;
  f.arrived.reset();
  f.pending = false;
  f.round += 1;
  if (alpha == 0) f.exact = round_step;
  step_ = std::max(step_, round_step);
  rounds_ += 1;
  round_start_ = Clock::now();

  SyncReport report;
  report.round = rounds_;
  report.step = round_step;
  report.world_size = reduced.participants;
  report.stats = reduced.stats;
  report.params_hash = hash_tensors(global_);
  report.fragment = options_.fragments > 1 ? static_cast<int64_t>(index) : -1;
  report.stall_seconds = f.stall;
  report.weight = reduced.weight;
  report.tokens = f.pending_tokens;
  report.rejected = reduced.rejected;
  report.screening = reduced.screening;
  if (elastic_.elastic()) {
    elastic_.end(*plan_, std::max(f.started, plan_->step), report.params_hash, !rounds_follow(step, index));
    report.stats += state_to_joiners(step);
    plan_.reset();
  }
  return report;
}

void StreamingDiLoCo::await(Fragment& f, size_t index) {
  if (f.arrived) return;
  if (f.failure) std::rethrow_exception(f.failure);
  LOCO_CHECK(f.reduction.valid(), "fragment {} has a sync in flight but nothing to wait for", index);
  const auto wait_start = Clock::now();
  try {
    f.arrived = f.reduction.get();
  } catch (const PeerError&) {
    f.failure = std::current_exception();  // the fragment stays pending; state() keeps what it sent
    f.stall += seconds_since(wait_start);
    throw;
  }
  f.stall += seconds_since(wait_start);
}

NamedTensors StreamingDiLoCo::state() {
  NamedTensors out;
  for (size_t i = 0; i < names_.size(); ++i) out.emplace_back("global." + names_[i], global_[i]);
  // An eager elastic exchange in flight is saved as sent, its round as not completed (as the coordinator has it).
  out.emplace_back("streaming.rounds", scalar(open_ >= 0 ? rounds_ - 1 : rounds_));
  if (options_.eager) out.emplace_back("streaming.reported_hash", scalar(static_cast<int64_t>(reported_hash_)));
  for (size_t p = 0; p < fragments_.size(); ++p) {
    auto& f = fragments_[p];
    const std::string key = fmt::format("streaming.{}.", p);
    for (auto& [name, value] : f.outer->state()) out.emplace_back(fmt::format("outer.{}.{}", p, name), value);
    out.emplace_back(key + "round", scalar(f.round));
    out.emplace_back(key + "tokens", scalar(f.tokens));
    out.emplace_back(key + "started", scalar(f.started));
    out.emplace_back(key + "exact", scalar(f.exact));
    out.emplace_back(key + "pending_tokens", scalar(f.pending_tokens));
    if (options_.eager) {
      out.emplace_back(key + "final_phase", scalar(f.final_phase));
      out.emplace_back(key + "fresh_weight", torch::tensor(f.fresh_weight, torch::kFloat64));
      if (f.final_phase == 1) out.emplace_back(key + "step_by", f.step_by->flat());
    }
    if (!f.pending) continue;
    // A sync in flight: wait for it, so the checkpoint holds either its result or, when the
    // collective failed, what this worker sent (to send again on resume). An eager elastic round
    // still open is not waited for: on resume it is convened again and sent again.
    if (static_cast<int64_t>(p) == open_) {
      out.emplace_back(key + "sent", f.sent->flat());
      continue;
    }
    if (!f.arrived && f.reduction.valid()) {
      const auto wait_start = Clock::now();
      try {
        f.arrived = f.reduction.get();
      } catch (const PeerError&) {
        f.failure = std::current_exception();  // complete() reports it
      }
      f.stall += seconds_since(wait_start);
    }
    if (f.arrived) {
      out.emplace_back(key + "result", f.result->flat());
      out.emplace_back(key + "participants", scalar(f.arrived->participants));
      if (options_.eager) {
        out.emplace_back(key + "sent", f.sent->flat());
        out.emplace_back(key + "weight", torch::tensor(f.arrived->weight, torch::kFloat64));
      }
    } else {
      stage(f);  // the collective is over: `result` may take the local values again
      out.emplace_back(key + "sent", f.sent ? f.sent->flat() : f.result->flat());
    }
  }
  return out;
}

bool StreamingDiLoCo::keeps_sent() const { return options_.eager || options_.overlap_steps > 0; }

void StreamingDiLoCo::stage(Fragment& f) {
  if (f.sent) return;
  torch::NoGradGuard no_grad;
  auto& result = f.result->views();
  for (size_t i = 0; i < result.size(); ++i) result[i].copy_(f.local[i]);
}

namespace {

// A DiLoCo checkpoint written before DiLoCo became Streaming DiLoCo's one-fragment case: "diloco.round",
// "diloco.synced_step", "diloco.round_tokens" and "outer.<key>" hold what the one fragment's
// entries hold now. Anything else keeps its name (an old elastic run's "elastic.slots" is then
// refused as unexpected: those positions are the runtime's now).
NamedTensors upgrade_diloco_state(const NamedTensors& tensors) {
  const auto scalar = [](int64_t value) { return torch::tensor(value, torch::kInt64); };
  NamedTensors out;
  int64_t round = 0, synced_step = 0, round_tokens = 0;
  for (const auto& [key, value] : tensors) {
    if (key == "diloco.round") round = value.item<int64_t>();
    else if (key == "diloco.synced_step") synced_step = value.item<int64_t>();
    else if (key == "diloco.round_tokens") round_tokens = value.item<int64_t>();
    else if (key.starts_with("outer.")) out.emplace_back("outer.0." + key.substr(6), value);
    else out.emplace_back(key, value);
  }
  for (const auto& [key, value] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"streaming.rounds", round}, {"streaming.0.round", round}, {"streaming.0.tokens", round_tokens},
           {"streaming.0.started", synced_step}, {"streaming.0.exact", synced_step}, {"streaming.0.pending_tokens", 0}}) {
    out.emplace_back(key, scalar(value));
  }
  return out;
}

}  // namespace

void StreamingDiLoCo::load_state(const NamedTensors& tensors) {
  const bool old_diloco = options_.fragments == 1 &&
                          std::any_of(tensors.begin(), tensors.end(), [](const auto& t) { return t.first == "diloco.round"; });
  restored_.emplace(name_ == "diloco" ? "DiLoCo" : "Streaming DiLoCo", old_diloco ? upgrade_diloco_state(tensors) : tensors);
}

}  // namespace loco::algorithms
