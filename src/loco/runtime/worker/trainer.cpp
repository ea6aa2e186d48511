#include "loco/runtime/worker/trainer.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <thread>

#include "loco/algorithms/membership.h"
#include "loco/core/environment.h"
#include "loco/core/error.h"
#include "loco/core/hash.h"
#include "loco/core/files.h"
#include "loco/metrics/metrics_log.h"
#include "loco/metrics/progress.h"
#include "loco/model/precision.h"
#include "loco/optim/adamw.h"
#include "loco/optim/schedule.h"
#include "loco/runtime/store/checkpoint.h"

namespace loco::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Keys that must not change when a run is resumed: they define the model, the data and the
// trajectory. (train.steps, eval.*, checkpoint.* and logging may change.)
const std::vector<std::string> kResumeFixedKeys = {"data.", "model.", "optim.", "train.batch_size",
                                                   "train.grad_accum", "train.seed", "train.z_loss",
                                                   "train.init_from", "sync.", "outer.", "cluster.workers"};

void prepare_run_dir(const fs::path& run_dir, bool resume) {
  std::error_code ec;
  if (resume || !fs::exists(run_dir, ec)) return;
  if (!fs::is_directory(run_dir, ec)) {
    throw ConfigError("train", fmt::format("run.dir {} exists and is not a folder", run_dir.string()));
  }
  if (!fs::is_empty(run_dir, ec)) {
    throw ConfigError("train", fmt::format("run.dir {} already holds a run; pass --resume to continue it, or choose "
                                           "another --run.dir (nothing was overwritten)",
                                           run_dir.string()));
  }
}

// Elastic runs: the shards of vacant slots a round's plan gave this worker, read in turn with its
// own, one step each (docs/failure-model.md). A slot's sampler draws the same order its owner's
// would (seed + slot), so whoever reads a shard, it is visited once per epoch.
class ShardTurns {
 public:
  ShardTurns(data::WindowSampler& own, const WorkerRole& worker, int64_t context, uint64_t seed)
      : own_(own), worker_(worker), context_(context), seed_(seed) {}

  // Takes the adoption of a new plan, if any: what changed, in words.
  std::optional<std::string> update() {
    if (!worker_.adoption) return std::nullopt;
    auto wanted = worker_.adoption();
    if (!wanted) return std::nullopt;
    std::vector<int64_t> taken, dropped;
    for (auto it = adopted_.begin(); it != adopted_.end();) {
      if (wanted->count(it->first) == 0) {
        dropped.push_back(it->first);
        it = adopted_.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& [slot, position] : *wanted) {
      auto it = adopted_.find(slot);
      if (it == adopted_.end()) {
        it = adopted_.try_emplace(slot, worker_.shard_tokens(slot), context_, seed_ + static_cast<uint64_t>(slot)).first;
        taken.push_back(slot);
      }
      if (it->second.position() != position) it->second.restore(position);
    }
    turn_ = 0;
    if (taken.empty() && dropped.empty()) return std::nullopt;
    std::string said;
    if (!taken.empty()) said = fmt::format("reads the shard of vacant slot(s) {} in turn with its own", fmt::join(taken, ", "));
    if (!dropped.empty()) {
      said += fmt::format("{}stops reading slot(s) {} (another member reads them now)", said.empty() ? "" : "; ",
                          fmt::join(dropped, ", "));
    }
    return said;
  }

  // The sampler of the next step: its own, then each adopted shard, in turn.
  data::WindowSampler& next() {
    const auto k = static_cast<size_t>(turn_++ % static_cast<int64_t>(adopted_.size() + 1));
    return k == 0 ? own_ : std::next(adopted_.begin(), static_cast<std::ptrdiff_t>(k - 1))->second;
  }

  std::map<int64_t, data::SamplerPosition> positions() const {
    std::map<int64_t, data::SamplerPosition> out;
    for (const auto& [slot, sampler] : adopted_) out.emplace(slot, sampler.position());
    return out;
  }
  std::vector<int64_t> adopted_slots() const {
    std::vector<int64_t> out;
    for (const auto& [slot, sampler] : adopted_) out.push_back(slot);
    return out;
  }

 private:
  data::WindowSampler& own_;
  const WorkerRole& worker_;
  int64_t context_;
  uint64_t seed_;
  std::map<int64_t, data::WindowSampler> adopted_;
  int64_t turn_ = 0;
};

}  // namespace

int64_t configure_threads(int64_t threads) {
  if (threads <= 0) {
    const int64_t processes = read_environment().local_processes;
    const int64_t cores = std::max<unsigned>(1, std::thread::hardware_concurrency());
    threads = std::max<int64_t>(1, cores / processes);
  }
  // With the OpenMP build of OpenBLAS (scripts/setup.sh), BLAS calls share libtorch's OpenMP
  // threads, so this one setting governs both (docs/footguns.md).
  torch::set_num_threads(static_cast<int>(threads));
  return threads;
}

model::Transformer build_model(const RunConfig& config) {
  LOCO_CHECK(config.model.vocab_size > 0, "vocab_size must be resolved before building the model");
  return model::Transformer(config.model, static_cast<uint64_t>(config.train.seed));
}

NamedTensors model_weights(const model::Transformer& model) {
  NamedTensors out;
  for (const auto& item : model->named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

void load_model_weights(model::Transformer& model, const NamedTensors& weights, const std::string& where) {
  std::map<std::string, torch::Tensor> by_name(weights.begin(), weights.end());
  torch::NoGradGuard no_grad;
  auto params = model->named_parameters();
  for (auto& item : params) {
    auto it = by_name.find(item.key());
    if (it == by_name.end()) throw DataError("checkpoint", fmt::format("{}: no weights for '{}'", where, item.key()));
    if (!it->second.sizes().equals(item.value().sizes())) {
      throw DataError("checkpoint", fmt::format("{}: '{}' has shape [{}], the model needs [{}]", where, item.key(),
                                                fmt::join(it->second.sizes(), ", "), fmt::join(item.value().sizes(), ", ")));
    }
    item.value().copy_(it->second);
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    throw DataError("checkpoint", fmt::format("{}: weights '{}' do not belong to this model", where, by_name.begin()->first));
  }
}

EvalResult evaluate(model::Transformer& model, const std::vector<data::Batch>& batches, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  double total = 0;
  int64_t tokens = 0;
  for (const auto& batch : batches) {
    model::AutocastGuard autocast(device, true);
    auto logits = model->forward(batch.inputs.to(device));
    auto loss = model::language_model_loss(logits, batch.targets.to(device), 0.0).cross_entropy;
    const int64_t n = batch.targets.numel();
    total += loss.item<double>() * static_cast<double>(n);
    tokens += n;
  }
  if (was_training) model->train();
  EvalResult result;
  result.tokens = tokens;
  result.loss = tokens > 0 ? total / static_cast<double>(tokens) : NAN;
  result.ppl = std::exp(result.loss);
  return result;
}

// Scores `parameters` (the global θ, in the model's order) in place of the model's own, which are
// put back afterwards.
EvalResult evaluate_parameters(model::Transformer& model, const std::vector<torch::Tensor>& parameters,
                               const std::vector<data::Batch>& batches, const torch::Device& device) {
  auto live = model->parameters();
  LOCO_CHECK(live.size() == parameters.size(), "{} parameters to evaluate for a model of {}", parameters.size(), live.size());
  std::vector<torch::Tensor> own;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < live.size(); ++i) {
      own.push_back(live[i].detach().clone());
      live[i].copy_(parameters[i]);
    }
  }
  auto result = evaluate(model, batches, device);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < live.size(); ++i) live[i].copy_(own[i]);
  return result;
}

void load_initial_weights(model::Transformer& model, const RunConfig& config, uint64_t tokenizer_hash) {
  auto source = load_checkpoint(config.train.init_from);
  if (source.state.tokenizer_hash != tokenizer_hash) {
    throw DataError("train", fmt::format("train.init_from = {}: that model was trained with tokenizer {}, the dataset {} "
                                         "uses {}", config.train.init_from, hex64(source.state.tokenizer_hash),
                                         config.data.dir, hex64(tokenizer_hash)));
  }
  load_model_weights(model, inference_weights(source), source.dir.string());
}

TrainSummary train(const RunConfig& input_config, algorithms::SyncStrategy& sync, const TrainOptions& options) {
  const auto call_start = Clock::now();
  RunConfig config = input_config;
  resolve_defaults(config);
  const WorkerRole& worker = options.worker;

  // --- Inputs, all checked before any step -------------------------------------------------
  auto dataset = data::Dataset::open(config.data.dir);
  const auto& manifest = dataset.manifest();
  if (config.model.vocab_size == 0) {
    config.model.vocab_size = manifest.vocab_size;
  } else if (config.model.vocab_size != manifest.vocab_size) {
    throw ConfigError("train", fmt::format("model.vocab_size = {} but the dataset {} has a vocabulary of {}; "
                                           "hint: leave model.vocab_size = 0 to take the dataset's",
                                           config.model.vocab_size, config.data.dir, manifest.vocab_size));
  }
  validate(config);
  const fs::path run_dir(config.run.dir);
  // A worker keeps its own checkpoints; the run folder holds what the workers share.
  const fs::path state_dir =
      worker.distributed && !worker.elastic ? run_dir / "workers" / std::to_string(worker.rank) : run_dir;
  const bool resume = options.resume || options.resume_step.has_value();
  if (!worker.elastic) prepare_run_dir(state_dir, resume);  // elastic: the coordinator (or launcher) checked
  CheckpointStore store(state_dir / "checkpoints", config.checkpoint.keep);
  // Elastic: this slot's inner state at each round's end, beside the leader's global checkpoints.
  std::optional<CheckpointStore> slot_store;
  if (worker.elastic) slot_store.emplace(slot_state_dir(run_dir, worker.rank), config.checkpoint.keep);

  std::optional<Checkpoint> resumed;
  if (resume) {
    std::optional<fs::path> from = options.resume_step ? std::optional(store.at(*options.resume_step)) : store.latest();
    if (!from) {
      throw DataError("train", fmt::format("--resume: {} has no checkpoint to resume from",
                                           (state_dir / "checkpoints").string()));
    }
    resumed = load_checkpoint(*from);
    RunConfig saved = parse_config(resumed->state.config_toml, (resumed->dir / "state.json").string());
    auto changed = differences(saved, config, kResumeFixedKeys);
    if (!changed.empty()) {
      throw ConfigError("train", fmt::format("--resume: the config differs from the checkpoint's in keys that define "
                                             "the run: {}", fmt::join(changed, "; ")));
    }
    if (resumed->state.tokenizer_hash != manifest.tokenizer_hash) {
      throw DataError("train", fmt::format("--resume: the dataset {} was tokenized with tokenizer {}, the checkpoint "
                                           "with {}", config.data.dir, hex64(manifest.tokenizer_hash),
                                           hex64(resumed->state.tokenizer_hash)));
    }
  }
  const torch::Device device = model::resolve_device(config.train.device);
  const int64_t threads = configure_threads(config.train.threads);
  write_file_atomic(run_dir / "config.toml", to_toml(config), "train");

  // --- The parts ------------------------------------------------------------------------------
  auto model = build_model(config);
  if (resumed) {
    load_model_weights(model, resumed->model, resumed->dir.string());
  } else if (!config.train.init_from.empty()) {
    load_initial_weights(model, config, manifest.tokenizer_hash);
  }
  model->to(device);
  model->train();

  std::vector<optim::NamedParameter> named;
  for (const auto& [name, tensor] : model_weights(model)) named.push_back({name, tensor, tensor.dim() >= 2});
  optim::AdamW adamw(std::move(named), config.optim.adamw);
  const optim::ScheduleOptions schedule{config.optim.lr, config.optim.warmup_steps, config.train.steps, config.optim.min_lr_ratio};
  schedule.validate();

  // Each worker samples its own shard, in an order of its own (rank 0's is a single process's).
  const auto& train_tokens = worker.train_tokens != nullptr ? *worker.train_tokens : dataset.train().tokens;
  data::WindowSampler sampler(train_tokens, config.model.context, static_cast<uint64_t>(config.train.seed + worker.rank));
  const auto eval_batches =
      data::evaluation_batches(dataset.val().tokens, config.model.context, config.eval.windows, config.eval.batch_size);

  int64_t step = 0, tokens = 0;
  double wall_before = 0;
  uint64_t global_hash = 0;
  bool own_position = false;  // elastic: the slot's own saved position, exact (Streaming DiLoCo: τ steps past the coordinator's)
  if (resumed) {
    adamw.load_state(resumed->optimizer, resumed->state.step);
    sync.load_state(resumed->sync);
    sampler.restore(resumed->state.sampler);
    if (slot_store) {
      // The global checkpoint is the leader's; this slot's AdamW moments and data position of the
      // same round are its own (else it keeps the leader's moments, and the coordinator's position).
      const auto steps = slot_store->steps();
      if (std::find(steps.begin(), steps.end(), resumed->state.step) != steps.end()) {
        auto own = load_checkpoint(slot_store->at(resumed->state.step));
        if (!own.model.empty()) load_model_weights(model, own.model, own.dir.string());
        adamw.load_state(own.optimizer, own.state.step);
        sampler.restore(own.state.sampler);
        own_position = true;
      }
    }
    step = resumed->state.step;
    tokens = resumed->state.tokens;
    wall_before = resumed->state.wall_s;
    global_hash = resumed->state.global_hash;
  }
  std::vector<torch::Tensor> parameters;
  for (const auto& p : adamw.parameters()) parameters.push_back(p.tensor);

  metrics::MetricsLog log(run_dir / "metrics.jsonl");
  metrics::Progress progress(step, config.train.steps, options.progress, options.out);
  const int64_t first_step = step;
  const std::string who = worker.distributed ? fmt::format("worker {}/{}: ", worker.rank, worker.world_size) : "";
  progress.message(fmt::format(
      "{}{} {} on {}: {} parameters, {} blocks x {} wide, context {}, vocab {}; {} train tokens{}; device {}, {} threads; "
      "sync {}", who, resumed ? "resuming" : "training", config.run.dir, config.data.dir,
      model::parameter_count(config.model), config.model.layers, config.model.width, config.model.context,
      config.model.vocab_size, train_tokens.size(), worker.train_tokens != nullptr ? " in its shard" : "", device.str(),
      threads, sync.name()));
  if (resumed) progress.message(fmt::format("{}resumed from {} at step {}", who, resumed->dir.string(), step));
  if (!resumed && !config.train.init_from.empty()) progress.message(fmt::format("{}initialized from {}", who, config.train.init_from));
  log.write(resumed ? "resume" : "start", {{"worker", worker.rank}, {"world_size", worker.world_size}, {"step", step},
                                           {"parameters", model::parameter_count(config.model)},
                                           {"device", device.str()}, {"threads", threads}, {"sync", sync.name()}});

  auto training_state = [&](double wall_s) {
    TrainingState state;
    state.step = step;
    state.tokens = tokens;
    state.sampler = sampler.position();
    state.seed = config.train.seed;
    state.tokenizer_hash = manifest.tokenizer_hash;
    state.config_toml = to_toml(config);
    state.wall_s = wall_s;
    state.global_hash = global_hash;
    return state;
  };
  auto save_checkpoint = [&](double wall_s, bool prune) {
    auto dir = store.save(training_state(wall_s), model_weights(model), adamw.state(), sync.state(), prune);
    log.write("checkpoint", {{"worker", worker.rank}, {"step", step}, {"path", dir.string()}});
  };

  // --- The loop ----------------------------------------------------------------------------------
  TrainSummary summary;
  summary.first_step = first_step;
  summary.val_unigram_entropy = manifest.val_unigram_entropy;
  int64_t round_step = 0;  // the step of the last round synchronized
  auto record_sync = [&](const algorithms::SyncReport& report) {
    summary.rounds += 1;
    summary.bytes_sent += report.stats.bytes_sent;
    summary.bytes_received += report.stats.bytes_received;
    summary.sync_s += report.stats.seconds;
    summary.stall_s += report.stall_seconds;
    global_hash = report.params_hash;
    round_step = report.step;
    nlohmann::json event = {{"round", report.round}, {"step", report.step}, {"worker", worker.rank},
                            {"world_size", report.world_size}, {"bytes_sent", report.stats.bytes_sent},
                            {"bytes_received", report.stats.bytes_received}, {"seconds", report.stats.seconds},
                            {"stall_s", report.stall_seconds}, {"params_hash", hex64(report.params_hash)}};
    if (report.fragment >= 0) event["fragment"] = report.fragment;
    if (report.attempts > 1) event["attempts"] = report.attempts;
    if (report.weight >= 0) event["weight"] = report.weight;
    if (report.tokens >= 0) event["tokens"] = report.tokens;
    log.write("sync", event);
    progress.set_sync_totals(report.round, summary.bytes_sent);
  };
  for (const auto& report : sync.on_start(model, step)) record_sync(report);  // a round left pending by a stop
  if (auto joined = sync.joined_at_step()) {
    // A joiner of a run under way: it holds the run's θ now, and continues from the round's step.
    step = *joined;
    tokens = step * config.train.batch_size * config.train.grad_accum * config.model.context;
    progress.message(fmt::format("{}joined the run at step {}", who, step));
    log.write("joined", {{"worker", worker.rank}, {"step", step}});
    // Its slot's AdamW moments as its last owner saved them (when this host sees RUN/slots): a
    // better start than zeros in the middle of the schedule.
    if (auto latest = slot_store ? slot_store->latest() : std::nullopt) {
      try {
        auto own = load_checkpoint(*latest);
        adamw.load_state(own.optimizer, own.state.step);
        progress.message(fmt::format("{}took slot {}'s AdamW moments of step {}", who, worker.rank, own.state.step));
      } catch (const DataError& e) {
        progress.message(fmt::format("{}cannot use slot {}'s saved inner state ({}); its AdamW moments start from zero",
                                     who, worker.rank, e.what()));
      }
    } else if (slot_store) {
      progress.message(fmt::format("{}finds no saved inner state of slot {} in {} (another host's, or none yet); its "
                                   "AdamW moments start from zero", who, worker.rank, slot_store->root().string()));
    }
  }
  if (worker.start_position && !own_position) {
    if (auto position = worker.start_position()) sampler.restore(*position);
  }
  ShardTurns shards(sampler, worker, config.model.context, static_cast<uint64_t>(config.train.seed));
  summary.first_step = step;

  const int64_t tokens_per_step = config.train.batch_size * config.train.grad_accum * config.model.context;
  auto score = [&] {
    const auto* global = sync.in_sync() ? nullptr : sync.evaluation_parameters();
    return global != nullptr ? evaluate_parameters(model, *global, eval_batches, device) : evaluate(model, eval_batches, device);
  };
  auto interval_start = Clock::now();
  int64_t interval_tokens = 0;
  double interval_loss = 0;
  int64_t interval_steps = 0;
  EvalResult last_eval{NAN, NAN, 0};
  bool stopped = false, eval_due = false, checkpoint_current = false;
  std::optional<PeerError> peer_failure;
  bool peer_stopping = false;  // the failure was the run stopping (algorithms::RunStopping)
  // Compute utilization: the inner steps' wall time (evaluation and checkpoints excluded) and the
  // part of it spent inside the sync hooks (collectives, waiting, applying outer steps).
  double steps_s = 0, hooks_s = 0;
  int64_t bytes_before = sync.bytes_sent();
  auto in_hook = [&](auto&& hook) {
    const auto start = Clock::now();
    hook();
    hooks_s += seconds_since(start);
  };

  while (step < config.train.steps) {
    const auto step_start = Clock::now();
    const int64_t step_before = step;
    if (auto change = shards.update()) {
      progress.message(who + *change);
      log.write("shards", {{"worker", worker.rank}, {"step", step}, {"adopted", shards.adopted_slots()}});
    }
    data::WindowSampler& source = shards.next();
    const data::SamplerPosition position = source.position();
    const double lr = optim::learning_rate(schedule, step);
    adamw.zero_grad();
    double step_loss = 0;
    for (int64_t micro = 0; micro < config.train.grad_accum; ++micro) {
      auto batch = source.next(config.train.batch_size);
      torch::Tensor loss, ce;
      {
        model::AutocastGuard autocast(device, true);
        auto logits = model->forward(batch.inputs.to(device));  // (B, T, V)
        auto parts = model::language_model_loss(logits, batch.targets.to(device), config.train.z_loss);
        loss = parts.loss;
        ce = parts.cross_entropy;
      }
      (loss / static_cast<double>(config.train.grad_accum)).backward();
      step_loss += ce.item<double>() / static_cast<double>(config.train.grad_accum);
    }
    if (!std::isfinite(step_loss)) {
      throw Error("train", fmt::format("the loss became {} at step {}; hint: lower optim.lr or enable optim.grad_clip "
                                       "(the last checkpoint is intact)", step_loss, step));
    }
    algorithms::StepContext context{step, tokens_per_step, &model};
    try {
      in_hook([&] {
        for (const auto& report : sync.after_backward(context)) record_sync(report);
      });
    } catch (const PeerError& e) {
      // The step cannot complete without its peers: it never happened (its batches are drawn again).
      source.restore(position);
      peer_failure = e;
      peer_stopping = dynamic_cast<const algorithms::RunStopping*>(&e) != nullptr;
      break;
    }
    const double grad_norm = optim::clip_grad_norm(parameters, config.optim.grad_clip);
    adamw.step(lr);
    ++step;
    tokens += tokens_per_step;
    checkpoint_current = false;
    summary.losses.push_back(step_loss);
    if (worker.on_position) worker.on_position(sampler.position(), shards.positions(), step);
    const int64_t rounds_before = summary.rounds;
    try {
      in_hook([&] {
        for (const auto& report : sync.after_step(context)) record_sync(report);
      });
    } catch (const PeerError& e) {
      peer_failure = e;  // the inner step stands; its round's synchronization stays due
      peer_stopping = dynamic_cast<const algorithms::RunStopping*>(&e) != nullptr;
    }
    const bool synced_now = summary.rounds > rounds_before;
    // Time-budgeted rounds: a slower worker continues from the round's step (the furthest one's).
    if (worker.elastic && synced_now && round_step > step) step = round_step;
    steps_s += seconds_since(step_start);
    // What moved during this step, in the background too. The last step is left out of the peak:
    // Streaming DiLoCo synchronizes every fragment there, so that training ends on one θ.
    const int64_t bytes_now = sync.bytes_sent();
    if (step < config.train.steps) summary.peak_step_bytes = std::max(summary.peak_step_bytes, bytes_now - bytes_before);
    bytes_before = bytes_now;

    interval_tokens += tokens_per_step;
    interval_loss += step_loss;
    ++interval_steps;
    const bool last = step == config.train.steps;
    stopped = options.stop != nullptr && options.stop->load();
    const bool log_now = step / config.train.log_every > step_before / config.train.log_every || last || stopped || peer_failure;
    const double interval_s = seconds_since(interval_start);
    const double tokens_per_s = interval_s > 0 ? static_cast<double>(interval_tokens) / interval_s : 0;
    progress.update(step, interval_loss / static_cast<double>(interval_steps), tokens_per_s, log_now);
    if (log_now) {
      log.write("train", {{"worker", worker.rank}, {"step", step}, {"loss", step_loss}, {"lr", lr}, {"grad_norm", grad_norm},
                          {"tokens", tokens}, {"tokens_per_s", tokens_per_s}});
      interval_start = Clock::now();
      interval_tokens = 0;
      interval_loss = 0;
      interval_steps = 0;
    }
    if (peer_failure) break;
    // Evaluation scores the global parameters: those the strategy keeps, or the model's once it
    // holds them.
    eval_due = eval_due || step / config.eval.every > step_before / config.eval.every || last;
    if (eval_due && (sync.in_sync() || sync.evaluation_parameters() != nullptr)) {
      eval_due = false;
      if (worker.evaluates && sync.leads()) {
        last_eval = score();
        log.write("eval", {{"worker", worker.rank}, {"step", step}, {"val_loss", last_eval.loss}, {"val_ppl", last_eval.ppl},
                           {"tokens", last_eval.tokens}});
        progress.message(fmt::format("{}step {}: val_loss {:.4f}  val_ppl {:.2f}", who, step, last_eval.loss, last_eval.ppl));
      }
    }
    // Elastic runs: the leader saves the global state at every round's end (docs/failure-model.md).
    const bool checkpoint_due = worker.elastic ? synced_now && sync.at_boundary() && sync.leads()
                                               : (config.checkpoint.every > 0 && step % config.checkpoint.every == 0) || last;
    if (checkpoint_due) {
      save_checkpoint(wall_before + seconds_since(call_start), /*prune=*/true);
      checkpoint_current = true;
    }
    if (slot_store && synced_now && sync.at_boundary()) {
      // Its own model too: with Streaming DiLoCo it is not θ between a fragment's syncs.
      slot_store->save(training_state(wall_before + seconds_since(call_start)), model_weights(model), adamw.state(), {},
                       /*prune=*/true);
    }
    if (stopped) break;
  }
  progress.finish();

  bool run_stopping = false;
  if (peer_failure) {
    run_stopping = peer_stopping || (worker.run_stopping && worker.run_stopping());
    log.write("peer_failure", {{"worker", worker.rank}, {"step", step}, {"error", peer_failure->what()},
                               {"run_stopping", run_stopping}});
  }
  // A stopped elastic run keeps its last round's global checkpoint: a worker's state between rounds
  // is its own, not the run's.
  const bool may_save = !worker.elastic || (sync.leads() && sync.at_boundary());
  if ((stopped || peer_failure) && !checkpoint_current && may_save) {
    save_checkpoint(wall_before + seconds_since(call_start), /*prune=*/false);
  }
  if (peer_failure && !run_stopping) {
    throw PeerError("train", fmt::format("{}; the state at step {} is saved in {}", peer_failure->what(), step,
                                         (state_dir / "checkpoints").string()));
  }
  summary.interrupted = (stopped || peer_failure) && step < config.train.steps;
  if (std::isnan(last_eval.loss) && worker.evaluates && sync.leads() &&
      (sync.in_sync() || sync.evaluation_parameters() != nullptr)) {
    last_eval = score();
  }
  summary.compute_utilization = steps_s > 0 ? (steps_s - hooks_s) / steps_s : 0;

  summary.steps = step;
  summary.tokens = tokens;
  summary.val_loss = last_eval.loss;
  summary.val_ppl = last_eval.ppl;
  summary.wall_s = wall_before + seconds_since(call_start);
  summary.global_hash = global_hash;
  auto event = summary_json(summary);
  event.update({{"worker", worker.rank}, {"world_size", worker.world_size}, {"sync", sync.name()}});
  log.write("summary", event);
  return summary;
}

nlohmann::json summary_json(const TrainSummary& s) {
  return {{"steps", s.steps},
          {"tokens", s.tokens},
          {"val_loss", s.val_loss},
          {"val_ppl", s.val_ppl},
          {"val_unigram_entropy", s.val_unigram_entropy},
          {"wall_s", s.wall_s},
          {"interrupted", s.interrupted},
          {"rounds", s.rounds},
          {"bytes_sent", s.bytes_sent},
          {"bytes_received", s.bytes_received},
          {"sync_s", s.sync_s},
          {"stall_s", s.stall_s},
          {"peak_step_bytes", s.peak_step_bytes},
          {"compute_utilization", s.compute_utilization},
          {"global_hash", hex64(s.global_hash)}};
}

}  // namespace loco::runtime
