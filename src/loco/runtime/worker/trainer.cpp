#include "loco/runtime/worker/trainer.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>

#include "loco/algorithms/membership.h"
#include "loco/core/error.h"
#include "loco/core/hash.h"
#include "loco/core/files.h"
#include "loco/core/run_folder.h"
#include "loco/metrics/metrics_log.h"
#include "loco/metrics/progress.h"
#include "loco/model/transformer.h"
#include "loco/optim/adamw.h"
#include "loco/runtime/store/checkpoint.h"
#include "loco/model/precision.h"
#include "loco/runtime/worker/emulated_compute.h"
#include "loco/runtime/worker/inner_step.h"
#include "loco/runtime/worker/shard_turns.h"

namespace loco::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// One call of train(): its parts, built and restored before the first step, and the loop over
// steps. Each method is one stage of the driver; train() below reads top-down.
class TrainingLoop {
 public:
  TrainingLoop(const RunConfig& config, algorithms::SyncStrategy& sync, const TrainOptions& options)
      : config_(config), sync_(sync), options_(options), worker_(options.worker), link_(options.worker.link) {
    resolve_defaults(config_);
    open_inputs();
    find_resume_point();
    build_parts();
    restore();
    announce();
  }

  // The strategy's start (a round left pending by a stop is synchronized now; a joiner receives
  // the run's state), then where this worker's data starts.
  void start();
  bool running() const { return !part_over() && !ended_; }
  // One inner step and what follows it: synchronization, logging, evaluation, checkpoints.
  void step();
  // Saves what a stop or a failure leaves unsaved, evaluates, and writes the summary. Throws
  // PeerError when a peer failed and the run is not stopping.
  TrainSummary finish();

 private:
  void open_inputs();
  void find_resume_point();
  void build_parts();
  void restore();
  void announce();
  void take_joined_state(int64_t joined_step);
  // Whether this worker's part of the run is done: train.steps taken, or (asynchronous DiLoCo,
  // whose workers share the run's steps by speed) as its strategy says.
  bool part_over() const { return sync_.part_done().value_or(step_ >= config_.train.steps); }
  std::string rewarm_note() const;

  // Runs a sync hook, timing it; a PeerError is kept (peer_failure_) and reported as false.
  template <class Hook>
  bool run_hook(Hook&& hook);
  void record_sync(const algorithms::SyncReport& report);
  // Reads the losses and gradient norms of the steps taken since the last read (one host
  // synchronization on a GPU), stops the run with an Error at the first that is not finite, and
  // logs each step. Called every step where the inner step does not defer reads, else every
  // train.log_every steps and before anything that needs the values or a sound state: an
  // evaluation, a checkpoint, the end.
  void read_steps();
  void log_step(int64_t step_before, int64_t step_after, double lr, double grad_norm, double loss, bool last);
  void evaluate_when_due(int64_t step_before);
  void checkpoint_when_due(bool synced_now);

  TrainingState training_state() const;
  void save_checkpoint(bool prune);
  EvalResult score();
  // The inner steps' share of their wall time spent outside the sync hooks, so far.
  double compute_share() const { return steps_s_ > 0 ? (steps_s_ - hooks_s_) / steps_s_ : 0; }
  void doing(metrics::Activity activity) {
    if (options_.telemetry != nullptr) options_.telemetry->set_activity(activity);
  }
  bool can_score() const { return sync_.in_sync() || sync_.evaluation_parameters() != nullptr; }
  // Emulated compute saves for an elastic run's restarts only (its state was trained on no data).
  bool saves() const { return !emulated_ || worker_.elastic; }
  int64_t tokens_per_step() const { return inner_->tokens_per_step(); }
  double wall_s() const { return wall_before_ + seconds_since(call_start_); }
  metrics::WorkerId me() const { return {worker_.rank, ""}; }

  const Clock::time_point call_start_ = Clock::now();
  RunConfig config_;
  algorithms::SyncStrategy& sync_;
  const TrainOptions& options_;
  const WorkerRole& worker_;
  RunLink* link_;
  std::string who_;  // "worker r/n: " before the messages of a worker

  // Inputs.
  std::optional<data::Dataset> dataset_;
  fs::path run_dir_, state_dir_;
  std::optional<CheckpointStore> store_;
  std::optional<CheckpointStore> slot_store_;  // elastic: this slot's inner state at each round's end
  std::optional<Checkpoint> resumed_;

  // Parts.
  torch::Device device_ = torch::kCPU;
  int64_t threads_ = 1;
  model::Transformer model_{nullptr};
  std::optional<optim::AdamW> adamw_;
  std::optional<InnerStep> inner_;
  std::optional<EmulatedCompute> emulated_;  // train.emulated_step_s > 0: no model compute, no loss
  std::optional<data::WindowSampler> sampler_;
  size_t train_token_count_ = 0;  // in this worker's shard (or the whole split)
  std::optional<ShardTurns> shards_;
  std::vector<data::Batch> eval_batches_;
  std::optional<metrics::MetricsLog> log_;
  std::optional<metrics::Progress> progress_;

  // Where the run stands.
  int64_t step_ = 0, tokens_ = 0, round_step_ = 0;
  double wall_before_ = 0;
  uint64_t global_hash_ = 0;
  int64_t max_positions_ = 0;  // the positions the model was made for (TrainingState::max_positions)
  bool own_position_ = false;  // elastic: the slot's own saved position, exact (Streaming DiLoCo: τ steps past the plan's)
  TrainSummary summary_;
  EvalResult last_eval_{NAN, NAN, 0};
  bool stopped_ = false, ended_ = false, eval_due_ = false, checkpoint_current_ = false;
  std::optional<PeerError> peer_failure_;
  bool peer_stopping_ = false;  // the failure was the run stopping (algorithms::RunStopping)
  bool run_completed_ = false;  // ... because its training completed: this member ends finished

  // Since the last `train` event, and for compute utilization: the inner steps' wall time
  // (evaluation and checkpoints excluded) and the part of it spent inside the sync hooks.
  // The steps taken but not yet read: their loss and gradient norm on the device.
  struct Unread {
    int64_t step_before;
    double lr;
    torch::Tensor loss, grad_norm;
  };
  std::vector<Unread> unread_;
  Clock::time_point interval_start_ = Clock::now();
  int64_t interval_tokens_ = 0, interval_steps_ = 0;
  double interval_loss_ = 0;
  double steps_s_ = 0, hooks_s_ = 0;
  int64_t bytes_before_ = 0;
};

void TrainingLoop::open_inputs() {
  dataset_.emplace(data::Dataset::open(config_.data.dir));
  config_ = resolve_for_dataset(config_, dataset_->manifest());
  run_dir_ = config_.run.dir;
  const RunFolder run(run_dir_);
  // A worker keeps its own checkpoints; the run folder holds what the workers share.
  state_dir_ = worker_.distributed && !worker_.elastic ? run.worker_dir(worker_.rank) : run_dir_;
  const bool resume = options_.resume || options_.resume_step.has_value();
  if (!worker_.elastic && !worker_.replaces && !resume) RunFolder(state_dir_).check_new_run("train");  // elastic: the coordinator (or launcher) checked
  store_.emplace(RunFolder(state_dir_).checkpoints(), config_.checkpoint.keep);
  if (worker_.elastic) slot_store_.emplace(run.slot_state(worker_.rank), config_.checkpoint.keep);
}

void TrainingLoop::find_resume_point() {
  if (!options_.resume && !options_.resume_step) return;
  std::optional<fs::path> from = options_.resume_step ? std::optional(store_->at(*options_.resume_step)) : store_->latest();
  if (!from) {
    throw DataError("train", fmt::format("--resume: {} has no checkpoint to resume from", store_->root().string()));
  }
  resumed_ = load_checkpoint(*from);
  RunConfig saved = parse_config(resumed_->state.config_toml, (resumed_->dir / "state.json").string());
  auto changed = differences(saved, config_, kResumeFixedKeys);
  if (!changed.empty()) {
    throw ConfigError("train", fmt::format("--resume: the config differs from the checkpoint's in keys that define "
                                           "the run: {}", fmt::join(changed, "; ")));
  }
  const uint64_t tokenizer = dataset_->manifest().tokenizer_hash;
  if (resumed_->state.tokenizer_hash != tokenizer) {
    throw DataError("train", fmt::format("--resume: the dataset {} was tokenized with tokenizer {}, the checkpoint "
                                         "with {}", config_.data.dir, hex64(tokenizer), hex64(resumed_->state.tokenizer_hash)));
  }
}

void TrainingLoop::build_parts() {
  device_ = model::resolve_device(config_.train.device);
  threads_ = configure_threads(config_.train.threads);
  write_file_atomic(RunFolder(run_dir_).config(), to_toml(config_), "train");

  model_ = build_model(config_);
  if (resumed_) {
    load_model_weights(model_, resumed_->model, resumed_->dir.string());
    max_positions_ = resumed_->state.max_positions;
  } else if (!config_.train.init_from.empty()) {
    max_positions_ = load_initial_weights(model_, config_, dataset_->manifest().tokenizer_hash);
  }
  model_->to(device_);
  model_->train();

  if (config_.train.emulated_step_s > 0) {
    // The step's update is emulated_'s: AdamW holds no parameter (nor its moments' memory); the
    // inner step gives the schedule's learning rate.
    adamw_.emplace(std::vector<optim::NamedParameter>{}, config_.optim.adamw);
    emulated_.emplace(model_, config_.train.emulated_step_s,
                      static_cast<uint64_t>(config_.train.seed) * 1000003 + static_cast<uint64_t>(worker_.rank) + 1,
                      /*gradients=*/config_.sync.algorithm == Algorithm::kDdp);
  } else {
    adamw_.emplace(make_inner_optimizer(model_, config_.optim.adamw));
  }
  inner_.emplace(model_, *adamw_, inner_step_options(config_), device_, "the last checkpoint is intact");

  // Each worker samples its own shard, in an order of its own (rank 0's is a single process's).
  const auto& train_tokens = worker_.train_tokens != nullptr ? *worker_.train_tokens : dataset_->train().tokens;
  train_token_count_ = train_tokens.size();
  sampler_.emplace(train_tokens, config_.model.context, static_cast<uint64_t>(config_.train.seed + worker_.rank));
  if (!emulated_) eval_batches_ = data::evaluation_batches(dataset_->val().tokens, config_.model.context, config_.eval.windows,
                                           config_.eval.batch_size);
}

void TrainingLoop::restore() {
  if (!resumed_) return;
  adamw_->load_state(resumed_->optimizer, resumed_->state.step);
  sync_.load_state(resumed_->sync);
  if (resumed_->state.copied_from) {
    // Another worker's checkpoint (this one held none): the position saved is in that worker's
    // shard; this worker's own stands where `step` steps of its own order leave it.
    const auto windows = static_cast<uint64_t>(resumed_->state.step * (tokens_per_step() / config_.model.context));
    const auto per_epoch = static_cast<uint64_t>(sampler_->windows_per_epoch());
    sampler_->restore({windows / per_epoch, windows % per_epoch});
  } else if (!slot_store_) {
    // Elastic runs skip this: the global checkpoint and its position are the leader's (a place in
    // the leader's shard, which may be beyond the end of this one's); a slot's is its own saved
    // one (below) or the plan's (start()).
    sampler_->restore(resumed_->state.sampler);
  }
  if (slot_store_) {
    // The global checkpoint is the leader's; this slot's AdamW moments and data position of the
    // same round are its own (else it keeps the leader's moments, and the plan's position).
    const auto steps = slot_store_->steps();
    if (std::find(steps.begin(), steps.end(), resumed_->state.step) != steps.end()) {
      auto own = load_checkpoint(slot_store_->at(resumed_->state.step));
      if (!own.model.empty()) load_model_weights(model_, own.model, own.dir.string());
      adamw_->load_state(own.optimizer, own.state.step);
      sampler_->restore(own.state.sampler);
      own_position_ = true;
    }
  }
  step_ = resumed_->state.step;
  tokens_ = resumed_->state.tokens;
  wall_before_ = resumed_->state.wall_s;
  global_hash_ = resumed_->state.global_hash;
}

void TrainingLoop::announce() {
  log_.emplace(RunFolder(run_dir_).metrics());
  log_->tee(options_.telemetry);
  progress_.emplace(step_, config_.train.steps, options_.progress, options_.out);
  who_ = worker_.distributed ? fmt::format("worker {}/{}: ", worker_.rank, worker_.world_size) : "";
  progress_->message(fmt::format(
      "{}{} {} on {}: {} parameters, {} blocks x {} wide, context {}, vocab {}; {} train tokens{}; device {}, {} threads; "
      "sync {}", who_, resumed_ ? "resuming" : "training", config_.run.dir, config_.data.dir,
      model::parameter_count(config_.model), config_.model.layers, config_.model.width, config_.model.context,
      config_.model.vocab_size, train_token_count_, worker_.train_tokens != nullptr ? " in its shard" : "", device_.str(),
      threads_, sync_.name()));
  if (resumed_) {
    const auto copy = resumed_->state.copied_from ? fmt::format(" (a copy of worker {}'s)", *resumed_->state.copied_from) : "";
    progress_->message(fmt::format("{}resumed from {}{} at step {}", who_, resumed_->dir.string(), copy, step_));
  }
  if (emulated_) {
    progress_->message(fmt::format("{}compute EMULATED (train.emulated_step_s): each step waits {:g} s, then moves the "
                                   "parameters along a fixed random direction; no loss, no evaluation, {}",
                                   who_, emulated_->step_s(), saves() ? "checkpoints for restarts" : "no checkpoint"));
  }
  if (!resumed_ && !config_.train.init_from.empty()) {
    progress_->message(fmt::format("{}initialized from {}", who_, config_.train.init_from));
  }
  log_->write(metrics::StartEvent{me(), resumed_.has_value(), worker_.world_size, step_,
                                  model::parameter_count(config_.model), device_.str(), sync_.name(),
                                  threads_});
}

void TrainingLoop::start() {
  summary_.val_unigram_entropy = dataset_->manifest().val_unigram_entropy;
  for (const auto& report : sync_.on_start(model_, step_)) record_sync(report);
  if (auto joined = sync_.joined_at_step()) take_joined_state(*joined);
  if (!resumed_ && sync_.joined_under_way()) {  // asynchronous: re-warm from where the run's schedule stands
    inner_->rewarm_from(std::llround(sync_.schedule_step(step_).value_or(static_cast<double>(step_))));
    progress_->message(fmt::format("{}joined the run under way, its schedule at step {}; its AdamW moments start from "
                                   "zero{}", who_, *inner_->rewarmed_from(), rewarm_note()));
  }
  if (link_ != nullptr && !own_position_) {
    if (auto position = link_->start_position()) sampler_->restore(*position);
  }
  shards_.emplace(*sampler_, link_, config_.model.context, static_cast<uint64_t>(config_.train.seed));
  summary_.first_step = step_;
  bytes_before_ = sync_.bytes_sent();
  interval_start_ = Clock::now();
}

// A joiner of a run under way holds the run's θ now, and continues from the round's step, with its
// slot's AdamW moments as its last owner saved them (when this host sees RUN/slots): a better start
// than zeros in the middle of the schedule.
void TrainingLoop::take_joined_state(int64_t joined_step) {
  step_ = joined_step;
  tokens_ = step_ * tokens_per_step();
  progress_->message(fmt::format("{}joined the run at step {}", who_, step_));
  log_->write(metrics::JoinedEvent{me(), step_});
  if (!slot_store_) {
    inner_->rewarm_from(step_);
    return;
  }
  const auto latest = slot_store_->latest();
  if (!latest) {
    progress_->message(fmt::format("{}finds no saved inner state of slot {} in {} (another host's, or none yet); its "
                                   "AdamW moments start from zero{}", who_, worker_.rank, slot_store_->root().string(),
                                   rewarm_note()));
    inner_->rewarm_from(step_);
    return;
  }
  try {
    auto own = load_checkpoint(*latest);
    adamw_->load_state(own.optimizer, own.state.step);
    progress_->message(fmt::format("{}took slot {}'s AdamW moments of step {}", who_, worker_.rank, own.state.step));
  } catch (const DataError& e) {
    progress_->message(fmt::format("{}cannot use slot {}'s saved inner state ({}); its AdamW moments start from zero{}",
                                   who_, worker_.rank, e.what(), rewarm_note()));
    inner_->rewarm_from(step_);
  }
}

std::string TrainingLoop::rewarm_note() const {
  const int64_t steps = config_.optim.rewarmup_steps;
  return steps == 0 ? "" : fmt::format(", and its learning rate warms up again over {} steps (optim.rewarmup_steps)", steps);
}

void TrainingLoop::step() {
  const auto step_start = Clock::now();
  doing(metrics::Activity::kTraining);
  const int64_t step_before = step_;
  if (auto change = shards_->update()) {
    progress_->message(who_ + *change);
    log_->write(metrics::ShardsEvent{me(), step_, shards_->adopted_slots()});
  }
  data::WindowSampler& source = shards_->next();
  const data::SamplerPosition position = source.position();
  const double lr = inner_->learning_rate(std::llround(sync_.schedule_step(step_).value_or(static_cast<double>(step_))));
  torch::Tensor loss;  // none when the compute is emulated
  if (emulated_) {
    emulated_->forward_backward();
  } else {
    loss = inner_->forward_backward(source);
    // Where the update cannot skip a non-finite step on the device, the loss is read now: such a
    // step is never applied nor synchronized.
    if (!inner_->defers_reads()) inner_->read(loss, step_);
  }
  algorithms::StepContext context{step_, tokens_per_step(), &model_};
  if (!run_hook([&] { return sync_.after_backward(context); })) {
    source.restore(position);  // the step cannot complete without its peers: it never happened
    ended_ = true;
    return;
  }
  if (emulated_) {
    emulated_->update(lr);
    unread_.push_back({step_before, lr, {}, {}});
  } else {
    unread_.push_back({step_before, lr, loss, inner_->update(lr, loss)});
  }
  ++step_;
  tokens_ += tokens_per_step();
  if (options_.telemetry != nullptr) options_.telemetry->set_step(step_);
  checkpoint_current_ = false;
  if (link_ != nullptr) link_->record_progress(sampler_->position(), shards_->positions(), step_);
  const int64_t rounds_before = summary_.rounds;
  run_hook([&] { return sync_.after_step(context); });  // on failure the step stands; its round stays due
  const bool synced_now = summary_.rounds > rounds_before;
  // Time-budgeted rounds: a slower worker continues from the round's step (the furthest one's).
  if (worker_.elastic && synced_now && round_step_ > step_) step_ = round_step_;
  steps_s_ += seconds_since(step_start);
  // What moved during this step, in the background too. The last step is left out of the peak:
  // Streaming DiLoCo synchronizes every fragment there, so that training ends on one θ.
  const int64_t bytes_now = sync_.bytes_sent();
  if (!part_over()) summary_.peak_step_bytes = std::max(summary_.peak_step_bytes, bytes_now - bytes_before_);
  bytes_before_ = bytes_now;

  stopped_ = options_.stop != nullptr && options_.stop->load();
  if (!inner_->defers_reads() || step_ / config_.train.log_every > step_before / config_.train.log_every ||
      part_over() || stopped_ || peer_failure_) {
    read_steps();
  }
  if (peer_failure_) {
    ended_ = true;
    return;
  }
  evaluate_when_due(step_before);
  checkpoint_when_due(synced_now);
  if (stopped_) ended_ = true;
}

template <class Hook>
bool TrainingLoop::run_hook(Hook&& hook) {
  const auto start = Clock::now();
  doing(metrics::Activity::kSyncing);
  try {
    for (const auto& report : hook()) record_sync(report);
  } catch (const PeerError& e) {
    peer_failure_ = e;
    const auto* stopping = dynamic_cast<const algorithms::RunStopping*>(&e);
    peer_stopping_ = stopping != nullptr;
    run_completed_ = stopping != nullptr && stopping->completed();
  }
  doing(metrics::Activity::kTraining);
  hooks_s_ += seconds_since(start);
  return !peer_failure_;
}

void TrainingLoop::record_sync(const algorithms::SyncReport& report) {
  summary_.rounds += 1;
  summary_.bytes_sent += report.stats.bytes_sent;
  summary_.bytes_received += report.stats.bytes_received;
  summary_.sync_s += report.stats.seconds;
  summary_.stall_s += report.stall_seconds;
  global_hash_ = report.params_hash;
  round_step_ = report.step;
  log_->write(metrics::SyncEvent{me(), report.round, report.step, report.world_size, report.stats.bytes_sent,
                                 report.stats.bytes_received, report.stats.seconds, report.stall_seconds,
                                 hex64(report.params_hash), report.fragment, report.stats.route, report.attempts,
                                 report.weight, report.tokens, report.stats.round_trip_s, report.rejected,
                                 report.screening, report.staleness, link_ != nullptr ? link_->round_epoch(report.round) : -1});
  if (!report.screening.empty()) {
    progress_->message(fmt::format("{}sync {} at step {}: {}{}", who_, report.round, report.step,
                                   report.rejected > 0 ? fmt::format("{} outer gradient(s) left out: ", report.rejected) : "screening: ",
                                   report.screening));
  }
  progress_->set_sync_totals(report.round, summary_.bytes_sent);
}

void TrainingLoop::read_steps() {
  if (unread_.empty()) return;
  if (emulated_) {  // nothing to read: the steps have no loss
    const auto steps = std::move(unread_);
    unread_.clear();
    for (size_t i = 0; i < steps.size(); ++i) {
      const bool last = i + 1 == steps.size();
      log_step(steps[i].step_before, last ? step_ : steps[i].step_before + 1, steps[i].lr, NAN, NAN, last);
    }
    return;
  }
  std::vector<torch::Tensor> values;
  for (const auto& u : unread_) {
    values.push_back(u.loss);
    values.push_back(u.grad_norm.defined() ? u.grad_norm.to(torch::kFloat32) : torch::zeros_like(u.loss));
  }
  const auto host = torch::stack(values).to(torch::kCPU, torch::kFloat64).contiguous();
  const double* read = host.data_ptr<double>();
  const auto steps = std::move(unread_);
  unread_.clear();
  for (size_t i = 0; i < steps.size(); ++i) {
    const double loss = read[2 * i], grad_norm = read[2 * i + 1];
    inner_->check(loss, steps[i].step_before, "loss");
    inner_->check(grad_norm, steps[i].step_before, "gradient norm");
    summary_.losses.push_back(loss);
    const bool last = i + 1 == steps.size();
    log_step(steps[i].step_before, last ? step_ : steps[i].step_before + 1, steps[i].lr, grad_norm, loss, last);
  }
}

// `last`: the newest step read, after which the run stands (step_ may have moved on to a round's).
void TrainingLoop::log_step(int64_t step_before, int64_t step_after, double lr, double grad_norm, double loss, bool last) {
  interval_tokens_ += tokens_per_step();
  interval_loss_ += loss;
  ++interval_steps_;
  const bool log_now = step_after / config_.train.log_every > step_before / config_.train.log_every ||
                       (last && (part_over() || stopped_ || peer_failure_));
  const double interval_s = seconds_since(interval_start_);
  const double tokens_per_s = interval_s > 0 ? static_cast<double>(interval_tokens_) / interval_s : 0;
  progress_->update(step_after, interval_loss_ / static_cast<double>(interval_steps_), tokens_per_s, log_now);
  if (!log_now) return;
  log_->write(metrics::TrainEvent{me(), step_after, loss, lr, grad_norm, tokens_, tokens_per_s, summary_.bytes_sent,
                                  compute_share(), wall_s()});
  interval_start_ = Clock::now();
  interval_tokens_ = 0;
  interval_loss_ = 0;
  interval_steps_ = 0;
}

// Evaluation scores the global parameters: those the strategy keeps, or the model's once it holds
// them.
void TrainingLoop::evaluate_when_due(int64_t step_before) {
  if (emulated_) return;
  eval_due_ = eval_due_ || step_ / config_.eval.every > step_before / config_.eval.every || part_over();
  if (!eval_due_ || !can_score()) return;
  eval_due_ = false;
  if (!worker_.evaluates || !sync_.leads()) return;
  last_eval_ = score();
  log_->write(metrics::EvalEvent{me(), step_, last_eval_.loss, last_eval_.ppl, last_eval_.tokens});
  progress_->message(fmt::format("{}step {}: val_loss {:.4f}  val_ppl {:.2f}", who_, step_, last_eval_.loss, last_eval_.ppl));
}

EvalResult TrainingLoop::score() {
  read_steps();
  doing(metrics::Activity::kEvaluating);
  const auto* global = sync_.in_sync() ? nullptr : sync_.evaluation_parameters();
  return global != nullptr ? evaluate_parameters(model_, *global, eval_batches_, device_)
                           : evaluate(model_, eval_batches_, device_);
}

// Fixed runs: every checkpoint.every steps and at the end. Elastic runs: the leader saves the
// global state at every round's end, and every member its slot's inner state (its own model too:
// with Streaming DiLoCo it is not θ between a fragment's syncs) (docs/failure-model.md).
void TrainingLoop::checkpoint_when_due(bool synced_now) {
  if (!saves()) return;
  const bool round_end = synced_now && sync_.at_boundary();
  const bool due = worker_.elastic ? round_end && sync_.leads()
                                   : (config_.checkpoint.every > 0 && step_ % config_.checkpoint.every == 0) ||
                                         part_over();
  if (due || (slot_store_ && round_end)) read_steps();  // no state is saved past a step not known to be sound
  if (due) {
    save_checkpoint(/*prune=*/true);
    checkpoint_current_ = true;
  }
  if (slot_store_ && round_end) {
    slot_store_->save(training_state(), model_weights(model_), adamw_->state(), {}, /*prune=*/true);
  }
}

TrainingState TrainingLoop::training_state() const {
  TrainingState state;
  state.step = step_;
  state.tokens = tokens_;
  state.sampler = sampler_->position();
  state.seed = config_.train.seed;
  state.tokenizer_hash = dataset_->manifest().tokenizer_hash;
  state.config_toml = to_toml(config_);
  state.wall_s = wall_s();
  state.global_hash = global_hash_;
  state.max_positions = max_positions_;
  if (link_ != nullptr) state.run = link_->run_progress();
  return state;
}

void TrainingLoop::save_checkpoint(bool prune) {
  read_steps();
  doing(metrics::Activity::kCheckpointing);
  auto dir = store_->save(training_state(), model_weights(model_), adamw_->state(), sync_.state(), prune);
  log_->write(metrics::CheckpointEvent{me(), step_, dir.string()});
}

TrainSummary TrainingLoop::finish() {
  read_steps();
  progress_->finish();
  bool run_stopping = false;
  if (peer_failure_) {
    run_stopping = peer_stopping_ || (link_ != nullptr && link_->stopping());
    log_->write(metrics::PeerFailureEvent{me(), step_, peer_failure_->what(), run_stopping});
  }
  // A stopped elastic run keeps its last round's global checkpoint: a worker's state between
  // rounds is its own, not the run's.
  const bool may_save = !worker_.elastic || (sync_.leads() && sync_.at_boundary());
  if ((stopped_ || peer_failure_) && !checkpoint_current_ && may_save && saves()) save_checkpoint(/*prune=*/false);
  if (peer_failure_ && !run_stopping) {
    if (!saves()) throw PeerError("train", fmt::format("{} (emulated compute: nothing is saved)", peer_failure_->what()));
    throw PeerError("train", fmt::format("{}; the state at step {} is saved in {}", peer_failure_->what(), step_,
                                         store_->root().string()));
  }
  summary_.interrupted = (stopped_ || (peer_failure_ && !run_completed_)) && !part_over();
  if (std::isnan(last_eval_.loss) && worker_.evaluates && sync_.leads() && can_score() && !emulated_) last_eval_ = score();
  summary_.compute_utilization = compute_share();
  summary_.compute_s = std::max(0.0, steps_s_ - hooks_s_);
  const double call_s = seconds_since(call_start_);
  summary_.end_to_end_utilization = call_s > 0 ? std::min(1.0, summary_.compute_s / call_s) : 0;
  summary_.steps = step_;
  summary_.tokens = tokens_;
  summary_.val_loss = last_eval_.loss;
  summary_.val_ppl = last_eval_.ppl;
  summary_.wall_s = wall_s();
  summary_.global_hash = global_hash_;
  log_->write(metrics::SummaryEvent{me(), worker_.world_size, sync_.name(), summary_});
  doing(metrics::Activity::kFinished);
  return summary_;
}

}  // namespace

const std::vector<int32_t>& RunLink::shard_tokens(int64_t slot) {
  throw InternalError("train", fmt::format("this run gives no shard but the worker's own (asked for slot {})", slot));
}

TrainSummary train(const RunConfig& config, algorithms::SyncStrategy& sync, const TrainOptions& options) {
  TrainingLoop loop(config, sync, options);  // inputs checked, parts built, a checkpoint restored
  loop.start();
  while (loop.running()) loop.step();
  return loop.finish();
}

}  // namespace loco::runtime
