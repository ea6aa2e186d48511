#include "loco/runtime/worker/worker.h"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <map>

#include "loco/algorithms/ddp.h"
#include "loco/algorithms/diloco.h"
#include "loco/algorithms/streaming.h"
#include "loco/core/environment.h"
#include "loco/core/files.h"
#include "loco/core/hash.h"
#include "loco/core/run_folder.h"
#include "loco/model/transformer.h"
#include "loco/runtime/store/checkpoint.h"
#include "loco/runtime/coordinator/coordinator_client.h"
#include "loco/runtime/worker/elastic.h"
#include "loco/runtime/worker/outer_link.h"
#include "loco/runtime/worker/telemetry.h"

namespace loco::runtime {
namespace {

std::chrono::milliseconds seconds(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

}  // namespace

torch::Tensor embed_documents(const RunConfig& config, const data::Dataset& dataset) {
  return embed_documents(config, dataset, dataset.train());
}

torch::Tensor embed_documents(const RunConfig& config, const data::Dataset& dataset, const data::Split& split) {
  const RunConfig resolved = resolve_for_dataset(config, dataset.manifest());
  auto model = build_model(resolved);
  if (!config.train.init_from.empty()) load_initial_weights(model, resolved, dataset.manifest().tokenizer_hash);
  model->eval();
  torch::NoGradGuard no_grad;
  const int64_t length = std::min(config.data.route_tokens, config.model.context);
  std::vector<torch::Tensor> rows;
  for (const auto& doc : split.documents) {
    const int64_t n = std::max<int64_t>(1, std::min<int64_t>(length, doc.length));
    std::vector<int64_t> ids(split.tokens.begin() + static_cast<int64_t>(doc.offset),
                             split.tokens.begin() + static_cast<int64_t>(doc.offset) + n);
    auto tokens = torch::tensor(ids, torch::kInt64).unsqueeze(0);  // (1, n)
    rows.push_back(model->hidden(tokens).mean(1).squeeze(0).to(torch::kFloat32));  // (C)
  }
  return torch::stack(rows);
}

namespace {

uint64_t assignment_hash(const data::ShardAssignment& a) {
  Hasher hasher;
  for (const auto& docs : a.documents) {
    const uint64_t n = docs.size();
    hasher.update(&n, sizeof n);
    hasher.update(docs.data(), docs.size() * sizeof(uint32_t));
  }
  return hasher.digest();
}

// RUN/shards.json: the policy and, per worker, its documents, tokens and labels.
nlohmann::json describe(const data::ShardAssignment& a, const data::Dataset& dataset) {
  const auto& split = dataset.train();
  const auto tokens = data::shard_token_counts(split, a);
  nlohmann::json workers = nlohmann::json::array();
  for (size_t w = 0; w < a.documents.size(); ++w) {
    std::map<std::string, int64_t> labels;
    for (auto d : a.documents[w]) {
      const auto label = split.documents[d].label;
      labels[label < dataset.manifest().labels.size() ? dataset.manifest().labels[label] : "?"] += 1;
    }
    workers.push_back({{"rank", w}, {"documents", a.documents[w].size()}, {"tokens", tokens[w]}, {"labels", labels},
                       {"document_indices", a.documents[w]}});
  }
  return {{"policy", a.policy}, {"workers", workers}};
}

std::string summary_line(const nlohmann::json& worker) {
  std::vector<std::string> labels;
  for (const auto& [name, count] : worker["labels"].items()) {
    labels.push_back(fmt::format("{} {}", name.empty() ? "(none)" : name, count.get<int64_t>()));
  }
  if (labels.size() > 8) {
    const auto more = labels.size() - 6;
    labels.resize(6);
    labels.push_back(fmt::format("and {} more", more));
  }
  return fmt::format("{} documents, {} tokens; labels: {}", worker["documents"].get<int64_t>(),
                     worker["tokens"].get<int64_t>(), fmt::join(labels, ", "));
}

std::vector<protocol::CheckpointInfo> list_checkpoints(const fs::path& dir) {
  std::vector<protocol::CheckpointInfo> out;
  CheckpointStore store(dir, 1);
  for (int64_t step : store.steps()) {
    const auto path = store.at(step) / "state.json";
    try {
      auto state = nlohmann::json::parse(read_file_beneath(store.at(step), "state.json", "worker", kMaxRunTextBytes));
      const uint64_t hash = state.contains("global_hash") ? parse_hex64(state["global_hash"].get<std::string>(), "worker", path.string()) : 0;
      out.push_back({step, hash});
    } catch (const nlohmann::json::exception& e) {
      throw DataError("worker", fmt::format("{}: malformed: {}", path.string(), e.what()));
    }
  }
  return out;
}

// A fixed worker's link to its run: whether a failed collective means the run is stopping.
class FixedLink : public RunLink {
 public:
  FixedLink(CoordinatorClient& client, const std::atomic<bool>* stop) : client_(client), stop_(stop) {}
  bool stopping() override { return (stop_ != nullptr && stop_->load()) || client_.run_stopping(); }

 private:
  CoordinatorClient& client_;
  const std::atomic<bool>* stop_;
};

// An elastic worker's link: the session's plan (where the shards stand, which ones it reads),
// and the shards of the slots it adopts, cut from the training split once each.
class ElasticLink final : public FixedLink {
 public:
  ElasticLink(ElasticSession& session, CoordinatorClient& client, const data::Dataset& dataset,
              const data::ShardAssignment& assignment, const std::atomic<bool>* stop)
      : FixedLink(client, stop), session_(session), dataset_(dataset), assignment_(assignment) {}

  std::optional<data::SamplerPosition> own_start;  // an initial member's: the join reply's; a joiner's: its first plan's

  std::optional<data::SamplerPosition> start_position() override {
    return own_start ? own_start : session_.joined_position();
  }
  std::optional<std::map<int64_t, data::SamplerPosition>> take_adoption() override { return session_.take_adoption(); }
  const std::vector<int32_t>& shard_tokens(int64_t slot) override {
    auto it = shards_.find(slot);
    if (it == shards_.end()) {
      const auto& documents = assignment_.documents.at(static_cast<size_t>(slot));
      it = shards_.emplace(slot, data::shard_tokens(dataset_.train(), documents)).first;
    }
    return it->second;
  }
  void record_progress(const data::SamplerPosition& own, const std::map<int64_t, data::SamplerPosition>& adopted,
                       int64_t step) override {
    session_.record_progress(own, adopted, step);
  }
  std::optional<RunProgress> run_progress() const override { return session_.run_progress(); }
  int64_t round_epoch(int64_t round) const override { return session_.round_epoch(round); }

 private:
  ElasticSession& session_;
  const data::Dataset& dataset_;
  const data::ShardAssignment& assignment_;
  std::map<int64_t, std::vector<int32_t>> shards_;
};

// The training loop's options for worker `rank` of `world`, reading `tokens`, linked to its run.
TrainOptions worker_train_options(const WorkerOptions& options, std::optional<int64_t> resume_step, int64_t rank,
                                  int64_t world, const std::vector<int32_t>& tokens, RunLink& link) {
  TrainOptions train_options;
  train_options.resume_step = resume_step;
  train_options.stop = options.stop;
  train_options.progress = options.progress;
  train_options.out = options.out;
  train_options.worker.rank = rank;
  train_options.worker.world_size = world;
  train_options.worker.distributed = true;
  train_options.worker.train_tokens = &tokens;
  train_options.worker.link = &link;
  return train_options;
}

}  // namespace

comm::GroupFactory group_factory(const RunConfig& config, CoordinatorClient& client) {
  // Peers dial this worker at the address that reaches the coordinator, unless cluster.host says.
  const std::string host = config.cluster.host.empty() ? client.local_address() : config.cluster.host;
  comm::GroupFactory factory(client.key_value_store(), host, seconds(config.cluster.timeout_s), config.cluster.connections);
  auto secret = client.data_plane_secret();
  if (config.cluster.data_plane == "auto") {
    factory.set_data_plane(secret.empty() ? comm::DataPlane::kOpen : comm::DataPlane::kAuthenticated, std::move(secret));
    return factory;
  }
  const auto plane = comm::parse_data_plane(config.cluster.data_plane);
  if (plane != comm::DataPlane::kOpen && secret.empty()) {
    throw ConfigError("config", fmt::format("cluster.data_plane = \"{}\" needs the run's join token, and this worker has none "
                                            "(--insecure): set a token, or cluster.data_plane = \"open\" on a network you trust",
                                            config.cluster.data_plane));
  }
  factory.set_data_plane(plane, plane == comm::DataPlane::kOpen ? std::string() : std::move(secret));
  return factory;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

std::string process_name(int64_t pid, const std::string& address) {
  return address.empty() ? fmt::format("{}:{}", host_name(), pid) : fmt::format("{}[{}]:{}", host_name(), address, pid);
}

data::ShardAssignment assign_shards(const RunConfig& config, const data::Dataset& dataset, int64_t workers) {
  const auto seed = static_cast<uint64_t>(config.train.seed);
  switch (config.data.shard) {
    case ShardPolicy::kIid: return data::shard_iid(dataset.train(), workers, seed);
    case ShardPolicy::kLabel: return data::shard_by_label(dataset.train(), dataset.manifest().labels, workers);
    case ShardPolicy::kKMeans: return data::shard_by_kmeans(embed_documents(config, dataset), workers, seed);
  }
  LOCO_CHECK(false, "unknown shard policy");
}

std::unique_ptr<algorithms::SyncStrategy> make_strategy(const RunConfig& config, comm::Group group, int64_t shard_tokens) {
  switch (config.sync.algorithm) {
    case Algorithm::kNone: return std::make_unique<algorithms::NoSync>("none");
    case Algorithm::kLocal: return std::make_unique<algorithms::NoSync>("local");
    case Algorithm::kDdp:
      return std::make_unique<algorithms::Ddp>(std::move(group),
                                               algorithms::DdpOptions{static_cast<int64_t>(config.sync.bucket_mb * 1e6)});
    case Algorithm::kDiLoCo: return std::make_unique<algorithms::DiLoCo>(std::move(group), diloco_options(config, shard_tokens));
    case Algorithm::kStreaming:
      return std::make_unique<algorithms::StreamingDiLoCo>(std::move(group), streaming_options(config, shard_tokens));
  }
  LOCO_CHECK(false, "unknown algorithm");
}

namespace {

// The coordinator picked the newest global checkpoint for `joined` to continue from when every
// member holding the run's state had failed; a member it had given up on may since have saved
// newer ones and pruned that one (the chaos soak, seed 3385470866). Says so when it is gone.
bool restore_checkpoint_gone(const RunConfig& config, const protocol::JoinReply& joined, const std::string& who, const std::function<void(const std::string&)>& say) {
  if (!joined.resume_step) return false;
  if (std::filesystem::exists(CheckpointStore(RunFolder(config.run.dir).checkpoints(), 1).at(*joined.resume_step))) return false;
  say(fmt::format("{}: the global checkpoint of step {} it was to continue from is gone (a newer one replaced it); "
                  "joining again as a new member", who, *joined.resume_step));
  return true;
}

// An elastic worker (cluster.elastic): joins as a member holding a slot (a shard of the data),
// trains with DiLoCo over the groups the coordinator convenes, and joins again as a new member if
// it is ever dropped (frozen past cluster.dead_after_s, or its round completed without it).
TrainSummary run_elastic_worker(const RunConfig& config, const WorkerOptions& options, const data::Dataset& dataset,
                                const std::function<void(const std::string&)>& say) {
  const auto assignment = assign_shards(config, dataset, config.cluster.workers);
  CoordinatorClient client(options.coordinator, seconds(config.cluster.connect_timeout_s),
                           client_security(config, options.insecure));
  client.set_patience(seconds(config.cluster.coordinator_timeout_s));  // a restarted coordinator finds it waiting
  // Its peers reach it at this address; the name carries it, so that the coordinator's events say
  // which host a member is on even where host names repeat (containers).
  const std::string address = config.cluster.host.empty() ? client.local_address() : config.cluster.host;
  const std::string name = process_name(::getpid(), address);
  int64_t wanted_slot = options.rank;
  std::optional<protocol::JoinReply> restarted;  // still a member, now to continue from the checkpoint
  int gone_checkpoints = 0;  // restores whose checkpoint a newer one had replaced by then
  for (;;) {
    protocol::JoinRequest request;
    request.name = name;
    request.rank = wanted_slot;
    request.config_toml = to_toml(config);
    request.dataset = protocol::DatasetIdentity::of(dataset.manifest());
    request.resume = options.resume;  // the coordinator decides: it resumes the run or not
    request.shards_hash = assignment_hash(assignment);
    protocol::JoinReply joined;
    const bool restoring = restarted.has_value();
    try {
      joined = restarted ? *std::exchange(restarted, std::nullopt)
                         : client.join(request, seconds(config.cluster.join_timeout_s), say);
    } catch (const RunComplete& e) {  // started too late (a replacement in the run's last seconds)
      say(fmt::format("{}; nothing to train: this worker ends", e.what()));
      return TrainSummary{};
    }
    const int64_t slot = joined.rank;
    const std::string who = fmt::format("worker {} (slot {})", joined.member, slot);
    // Its checkpoint gone: it joins again, as a new member, and is given the state anew.
    if (restoring && restore_checkpoint_gone(config, joined, who, say) && gone_checkpoints++ < 3) { wanted_slot = slot; continue; }
    say(fmt::format("{}: {} the coordinator at {} (run {}){}", who, joined.resume_step ? "resuming with" : "joined",
                    client.address(), joined.run_id, joined.joiner ? "; it receives the run's state at the next round" : ""));
    TrainSummary summary;
    auto report_done = [&](protocol::EndStatus status, const std::string& error) {
      try {
        client.report_done({slot, status, error, summary_json(summary), joined.member});
      } catch (const std::exception& e) {
        say(fmt::format("{}: could not report its end to the coordinator: {}", who, e.what()));
      }
    };
    const auto start = client.wait_for_start(slot, options.stop);
    if (start.phase == protocol::Phase::kStopping) {
      summary.interrupted = true;
      report_done(protocol::EndStatus::kStopped, "");
      return summary;
    }
    try {
      const auto tokens = data::shard_tokens(dataset.train(), assignment.documents[static_cast<size_t>(slot)]);
      ElasticSession session(config, client, joined, group_factory(config, client), options.stop);
      std::unique_ptr<algorithms::SyncStrategy> strategy;
      if (config.sync.algorithm == Algorithm::kStreaming) {
        strategy = std::make_unique<algorithms::StreamingDiLoCo>(comm::Group::single(), streaming_options(config, std::ssize(tokens)), &session);
      } else {
        strategy = std::make_unique<algorithms::DiLoCo>(comm::Group::single(), diloco_options(config, std::ssize(tokens)), &session);
      }
      ElasticLink link(session, client, dataset, assignment, options.stop);
      link.own_start = joined.joiner ? std::nullopt : std::optional(joined.position);  // the coordinator's record
      auto train_options = worker_train_options(options, joined.resume_step, slot, config.cluster.workers, tokens, link);
      train_options.worker.elastic = true;
      TelemetrySender telemetry(client, {slot, joined.member, name});
      train_options.telemetry = &telemetry.telemetry();
      summary = train(config, *strategy, train_options);
    } catch (const algorithms::RestartFromCheckpoint& e) {
      say(fmt::format("{}: {}{}", who, e.what(), e.step ? fmt::format(" of step {}", *e.step) : " (none yet: from the start)"));
      protocol::JoinReply next = joined;
      next.joiner = false;
      next.resume_step = e.step;
      next.position = {e.data_epoch, e.data_cursor};
      restarted = next;
      continue;
    } catch (const algorithms::Evicted& e) {
      say(fmt::format("{}: dropped from the run ({}); its work since the last round is discarded; joining again as a new "
                      "member", who, e.what()));
      wanted_slot = slot;
      continue;
    } catch (const algorithms::RunStopping& e) {
      say(fmt::format("{}: {}", who, e.what()));
      summary.interrupted = !e.completed();
      report_done(e.completed() ? protocol::EndStatus::kFinished : protocol::EndStatus::kStopped, "");
      return summary;
    } catch (const algorithms::CoordinatorLost& e) {
      const RunFolder run(config.run.dir);
      throw PeerError("worker", fmt::format("{}: {} (cluster.coordinator_timeout_s = {:g}). The run's state as of its last "
                                            "completed round is saved in {} and {}; once a coordinator is back, continue "
                                            "with `loco coordinator --resume` and `loco worker --resume` (the inner steps "
                                            "since that round are lost)", who, e.what(), config.cluster.coordinator_timeout_s,
                                            run.checkpoints().string(), run.slots().string()));
    } catch (const std::exception& e) {
      report_done(protocol::EndStatus::kFailed, e.what());
      throw;
    }
    report_done(summary.interrupted ? protocol::EndStatus::kStopped : protocol::EndStatus::kFinished, "");
    return summary;
  }
}

}  // namespace

namespace {

using Say = std::function<void(const std::string&)>;

// A fixed worker's join: its rank, config and dataset, and (resuming) its own checkpoints; a fresh
// run must find none.
protocol::JoinRequest fixed_join_request(const RunConfig& config, const WorkerOptions& options, const data::Dataset& dataset) {
  protocol::JoinRequest request;
  request.name = process_name(::getpid());
  request.rank = options.rank;
  request.config_toml = to_toml(config);
  request.dataset = protocol::DatasetIdentity::of(dataset.manifest());
  request.resume = options.resume;
  if (options.resume && options.rank < 0) {
    throw ConfigError("worker", "--resume needs this worker's rank: pass --rank (or set RANK or SLURM_PROCID)");
  }
  if (options.rank >= 0) {
    const fs::path checkpoints = RunFolder(config.run.dir).worker_checkpoints(options.rank);
    request.checkpoints = list_checkpoints(checkpoints);
    // An asynchronous elastic run's replacement continues from its slot's checkpoints (the
    // coordinator refuses them at a fresh start).
    const bool replacement_may_hold = config.cluster.elastic && config.sync.async;
    if (!options.resume && !request.checkpoints.empty() && !replacement_may_hold) {
      throw ConfigError("worker", fmt::format("{} already holds checkpoints of a run; pass --resume to continue it, or "
                                              "choose another run.dir (nothing was overwritten)", checkpoints.string()));
    }
  }
  return request;
}

// Every worker divides the data alike: its division's hash is checked against worker 0's through
// the coordinator's store (k-means on different hardware may differ). Worker 0 writes RUN/shards.json.
void check_same_division(const RunConfig& config, CoordinatorClient& client, const data::ShardAssignment& assignment,
                         const data::Dataset& dataset, int64_t rank, int64_t epoch, const Say& say) {
  auto store = client.key_value_store();
  const uint64_t mine = assignment_hash(assignment);
  const std::string prefix = fmt::format("epoch/{}", epoch);
  store->set(fmt::format("{}/shards/{}", prefix, rank), hex64(mine));
  auto reference = store->get(prefix + "/shards/0", seconds(config.cluster.timeout_s));
  if (!reference) throw PeerError("worker", "worker 0 did not publish its shard assignment in time");
  if (*reference != hex64(mine)) {
    throw DataError("worker", fmt::format("worker {} computed a different division of the data than worker 0 ({} vs {}); "
                                          "k-means on different hardware can do this: use data.shard = \"iid\" or \"label\"",
                                          rank, hex64(mine), *reference));
  }
  const auto shards = describe(assignment, dataset);
  if (rank == 0) write_file_atomic(RunFolder(config.run.dir).shards(), shards.dump(1) + "\n", "worker");
  say(fmt::format("worker {}/{}: shard ({}) {}", rank, config.cluster.workers, assignment.policy,
                  summary_line(shards["workers"][rank])));
}

// A fixed run resumed where some workers hold no checkpoint: the coordinator named a holder, which
// sends each of them its checkpoint of the resume step over the run's group (first thing, before any
// collective); they save it as their own, marked as copied. The other workers go on at once.
void copy_checkpoint(comm::Group& group, const protocol::CheckpointCopy& copy, const RunConfig& config,
                     const data::Dataset& dataset, int64_t rank, std::optional<int64_t> step, const Say& say) {
  const int64_t world = group.size();
  const bool valid = step && copy.from < world && !copy.to.empty() &&
                     std::all_of(copy.to.begin(), copy.to.end(), [&](int64_t r) { return r >= 0 && r < world && r != copy.from; });
  if (!valid) {
    throw PeerError("worker", fmt::format("the coordinator asked worker {} to copy its checkpoint to workers {} of {}, at no "
                                          "resume step or to ranks that are not this run's", copy.from, fmt::join(copy.to, ", "), world));
  }
  constexpr int64_t kCopyTag = 1;
  const bool receives = std::find(copy.to.begin(), copy.to.end(), rank) != copy.to.end();
  const CheckpointStore store(RunFolder(config.run.dir).worker_checkpoints(rank), config.checkpoint.keep);
  if (rank == copy.from) {
    const std::string bytes = encode_checkpoint(load_checkpoint(store.at(*step)));
    for (const int64_t to : copy.to) {
      group.send(torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64), to, kCopyTag);
      group.send(torch::from_blob(const_cast<char*>(bytes.data()), {std::ssize(bytes)}, torch::kUInt8), to, kCopyTag);
      say(fmt::format("worker {}/{}: sent worker {} a copy of its checkpoint of step {} ({:.1f} MB)", rank, world, to, *step,
                      static_cast<double>(bytes.size()) / 1e6));
    }
  } else if (receives) {
    auto size = torch::zeros({1}, torch::kInt64);
    group.recv(size, copy.from, kCopyTag);
    // Model, AdamW moments and the sync state: a few copies of the parameters; far more is not a checkpoint.
    const int64_t most = 64 * model::parameter_count(resolve_for_dataset(config, dataset.manifest()).model) + (int64_t{64} << 20);
    const int64_t n = size.item<int64_t>();
    if (n <= 0 || n > most) {
      throw PeerError("worker", fmt::format("worker {} announced a checkpoint of {} bytes, not a checkpoint of this model", copy.from, n));
    }
    std::string bytes(static_cast<size_t>(n), '\0');
    auto into = torch::from_blob(bytes.data(), {n}, torch::kUInt8);
    group.recv(into, copy.from, kCopyTag);
    auto checkpoint = decode_checkpoint(bytes, fmt::format("worker {}'s copy of its checkpoint of step {}", copy.from, *step));
    if (checkpoint.state.step != *step) {
      throw PeerError("worker", fmt::format("worker {} sent its checkpoint of step {}, not of step {}", copy.from, checkpoint.state.step, *step));
    }
    checkpoint.state.copied_from = copy.from;
    const auto saved = store.save(checkpoint.state, checkpoint.model, checkpoint.optimizer, checkpoint.sync, /*prune=*/false);
    say(fmt::format("worker {}/{}: held no checkpoint; resumes from worker {}'s of step {} ({}), with its own data position",
                    rank, world, copy.from, *step, saved.string()));
  }
}

// Workers started by hand on one host, with no launcher's variable saying how many share it, split
// its cores by the coordinator's count of the run's workers there (each took every core before).
void share_host_cores(RunConfig& config, int64_t host_workers, const Say& say) {
  if (config.train.threads > 0 || host_workers <= 1 || read_environment().local_processes_set) return;
  const int64_t cores = usable_cores();
  config.train.threads = std::max<int64_t>(1, cores / host_workers);
  say(fmt::format("{} workers of this run on this host: each takes {} of its {} cores (train.threads or "
                  "LOCO_LOCAL_PROCESSES choose otherwise)", host_workers, config.train.threads, cores));
}

// A fixed run's task: the whole run on the task's shard, in the run's one group.
TrainSummary run_fixed_task(const RunConfig& config, const WorkerOptions& options, CoordinatorClient& client,
                            const data::Dataset& dataset, const protocol::StartReply& start, const protocol::JoinReply& joined,
                            const Say& say) {
  const int64_t rank = joined.rank;
  if (!start.task) throw PeerError("worker", "the coordinator started the run without a task for this worker");
  const auto& task = *start.task;
  const int64_t world = config.cluster.workers;
  const auto assignment = assign_shards(config, dataset, world);
  if (task.shard < 0 || task.shard >= world) {
    throw PeerError("worker", fmt::format("task {} reads shard {}, but the run has {}", task.id, task.shard, world));
  }
  check_same_division(config, client, assignment, dataset, rank, start.epoch, say);
  const auto tokens = data::shard_tokens(dataset.train(), assignment.documents[static_cast<size_t>(task.shard)]);

  const bool communicates = config.sync.algorithm != Algorithm::kLocal && config.sync.algorithm != Algorithm::kNone;
  std::optional<comm::Group> group;  // none for asynchronous DiLoCo: its workers talk only to the coordinator
  if (communicates && !config.sync.async) group = group_factory(config, client).make(start.epoch, rank, world);
  if (start.copy) {
    if (!group) throw PeerError("worker", "the coordinator asked for a checkpoint copy in a run whose workers share no group");
    copy_checkpoint(*group, *start.copy, config, dataset, rank, start.resume_step, say);
  }
  auto strategy = config.sync.async ? make_async_strategy(config, client, rank, joined.member, options.stop)
                                    : make_strategy(config, group ? *group : comm::Group::single(), std::ssize(tokens));
  FixedLink link(client, options.stop);
  auto resume_step = start.resume_step;
  if (joined.joiner && !resume_step) {  // a slot taken without its --rank: its predecessor's checkpoints, if this host has them
    const auto held = list_checkpoints(RunFolder(config.run.dir).worker_checkpoints(rank));
    for (const auto& c : held) resume_step = std::max(resume_step.value_or(c.step), c.step);
  }
  auto train_options = worker_train_options(options, resume_step, rank, world, tokens, link);
  train_options.worker.replaces = joined.joiner;
  train_options.worker.evaluates = !communicates || rank == 0;  // the global parameters are scored once
  TelemetrySender telemetry(client, {rank, -1, process_name(::getpid())});
  train_options.telemetry = &telemetry.telemetry();
  const auto summary = train(config, *strategy, train_options);
  if (summary.interrupted) {
    // Tell the others before this worker's connections close: their collectives then fail, and
    // they must learn it was a stop, not a crash.
    client.report_stop(rank, fmt::format("worker {} stopped at step {}", rank, summary.steps));
  }
  return summary;
}

}  // namespace

TrainSummary run_worker(const RunConfig& input_config, const WorkerOptions& options) {
  RunConfig config = input_config;
  resolve_defaults(config);
  auto say = [&](const std::string& text) {
    if (options.progress == metrics::ProgressMode::kJson) {
      fmt::print(options.out, "{}\n", nlohmann::json{{"message", text}}.dump());
    } else {
      fmt::print(options.out, "{}\n", text);
    }
    std::fflush(options.out);
  };
  auto dataset = data::Dataset::open(config.data.dir);
  // Asynchronous DiLoCo needs no rounds: its elastic run is slots of a fixed run that a new worker
  // may take over (async_elastic_run.h), and its workers live as fixed ones do.
  const bool async_elastic = config.cluster.elastic && config.sync.async;
  if (config.cluster.elastic && !async_elastic) return run_elastic_worker(config, options, dataset, say);

  // A fixed worker's life: join, wait for everyone, run its one task (the whole run), report it.
  CoordinatorClient client(options.coordinator, seconds(config.cluster.connect_timeout_s),
                           client_security(config, options.insecure));
  protocol::JoinReply joined;
  try {
    joined = async_elastic ? client.join(fixed_join_request(config, options, dataset), seconds(config.cluster.join_timeout_s), say)
                           : client.join(fixed_join_request(config, options, dataset));
  } catch (const RunComplete& e) {  // started too late (a replacement in the run's last seconds)
    say(fmt::format("{}; nothing to train: this worker ends", e.what()));
    return TrainSummary{};
  }
  const int64_t rank = joined.rank;
  say(fmt::format("worker {}/{}: joined the coordinator at {} (run {}){}", rank, joined.world_size, client.address(),
                  joined.run_id, joined.joiner ? "; it continues from the run's current parameters" : ""));
  // An asynchronous elastic run's member is taken as gone within cluster.dead_after_s of its death.
  std::optional<Heartbeats> heartbeats;
  if (async_elastic) heartbeats.emplace(config, client, [member = joined.member] { return protocol::HeartbeatRequest{member}; }, [](const auto&) {});
  const auto start = client.wait_for_start(rank, options.stop);
  share_host_cores(config, start.host_workers, say);
  TrainSummary summary;
  auto report_done = [&](protocol::EndStatus status, const std::string& error) {
    try {
      protocol::DoneRequest done{rank, status, error, summary_json(summary), joined.member};
      if (start.task) done.task = start.task->id;
      client.report_done(done);
    } catch (const std::exception& e) {
      say(fmt::format("worker {}: could not report its end to the coordinator: {}", rank, e.what()));
    }
  };
  if (start.phase == protocol::Phase::kStopping) {
    summary.interrupted = true;
    report_done(protocol::EndStatus::kStopped, "");
    return summary;
  }
  try {
    summary = run_fixed_task(config, options, client, dataset, start, joined, say);
  } catch (const std::exception& e) {
    report_done(protocol::EndStatus::kFailed, e.what());
    throw;
  }
  report_done(summary.interrupted ? protocol::EndStatus::kStopped : protocol::EndStatus::kFinished, "");
  return summary;
}

}  // namespace loco::runtime
