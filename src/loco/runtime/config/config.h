// The run configuration: one TOML file, every key overridable on the command line as
// --section.key=value, everything validated before any work starts.
//
// Each component keeps its own options struct (model::ModelOptions, optim::AdamWOptions, ...);
// RunConfig gathers them, and a single table of keys (config.cpp) maps "section.key" to a field,
// with its type, help text and range. That table drives parsing, overrides, validation, the saved
// config.toml and the reference in docs/configuration.md (`loco config --reference`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

// Only the components' options, never their implementations (no torch): a config is named in many
// files, and what those include should not rebuild when an algorithm's header changes.
#include "loco/algorithms/options.h"
#include "loco/data/dataset.h"
#include "loco/model/options.h"
#include "loco/model/paths.h"
#include "loco/optim/options.h"

namespace loco::runtime {

namespace fs = std::filesystem;

struct RunSection {
  std::string dir = "runs/main";  // config.toml, metrics.jsonl, checkpoints/
};

enum class ShardPolicy { kIid, kLabel, kKMeans };

struct DataSection {
  std::string dir = "data/brown";  // a folder written by `loco prepare`
  ShardPolicy shard = ShardPolicy::kIid;  // how documents are divided among workers
  int64_t route_tokens = 32;       // kmeans: leading tokens of a document that make its embedding
};

struct OptimSection {
  double lr = 3e-3;
  int64_t warmup_steps = 100;
  int64_t rewarmup_steps = 20;  // a joiner whose AdamW moments start from zero ramps its lr up again
  double min_lr_ratio = 0.1;
  double grad_clip = 1.0;  // 0 = no clipping
  optim::AdamWOptions adamw;
};

struct TrainSection {
  int64_t steps = 1000;
  int64_t batch_size = 16;   // sequences per micro-batch
  int64_t grad_accum = 1;    // micro-batches per step
  int64_t seed = 1234;       // model init and data order
  double z_loss = 0.0;
  std::string device = "auto";
  std::string init_from;     // checkpoint (or run folder) whose parameters start the run; "" = random init
  int64_t threads = 0;       // 0 = the machine's cores divided among local processes
  int64_t log_every = 10;
  // > 0: each inner step's compute is emulated, taking this many seconds (emulated_compute.h);
  // 0: real forward and backward passes.
  double emulated_step_s = 0;
};

struct EvalSection {
  int64_t every = 200;       // steps between evaluations (and one at the end)
  int64_t windows = 256;     // validation windows of `context` tokens, spread over the split
  int64_t batch_size = 32;
};

enum class Algorithm { kNone, kDdp, kDiLoCo, kStreaming, kLocal };
const char* to_string(Algorithm algorithm);

// sync.weighting. auto: by shard size when shards are of unequal size by design (data.shard = label
// or kmeans), else by the tokens each worker trained this round.
enum class WeightingChoice { kAuto, kTokens, kShard, kUniform };

struct SyncSection {
  Algorithm algorithm = Algorithm::kNone;
  int64_t inner_steps = 50;          // DiLoCo's H
  double round_seconds = 0;          // elastic DiLoCo: > 0 ends each round by time, not after H steps
  double round_grace_s = 5;          // ... and leaves out a worker this late at the round's end
  WeightingChoice weighting = WeightingChoice::kAuto;
  double drop_probability = 0;       // an experiment: each outer gradient left out with this probability
  double reject_ratio = 0;           // screening (algorithms::Screening): a norm this many times the others' median is left out
  double clip_norm = 0;              // ... each outer gradient clipped to this norm
  comm::Combine robust_mean = comm::Combine::kSum;  // ... the kept ones combined by median or trimmed mean instead
  int64_t trim = 1;                  // ... the trimmed mean's contributions left out at each end
  bool reject_not_finite = true;     // ... an outer gradient that is not finite left out (false: to show the harm)
  std::string poison;                // a fault to inject (algorithms::Poison): "WORKER:x100", "WORKER:nan@ROUND"
  bool eager = false;                // eager outer updates: a whole round's exchange overlapped (streaming.h)
  // Asynchronous DiLoCo (algorithms/async_outer.h): outer gradients applied as they arrive
  bool async = false;
  int64_t async_delay = 0;           // N: arrivals per momentum update (0: the workers)
  bool async_dynamic_steps = true;   // each worker's inner steps per cycle by its speed
  int64_t async_max_staleness = 0;   // versions an outer gradient may lag θ (0: 4 x the workers)
  double async_grace = 0.2;          // outer gradients arriving within this share of a cycle are applied together
  double async_silence_s = 60;       // a worker silent this long (past its cycle's expected time) is taken as gone
  double bucket_mb = 1;              // megabytes per message (piece) of an exchange's all-reduce
  // Streaming DiLoCo
  int64_t fragments = 4;             // P
  algorithms::FragmentPattern fragment_pattern = algorithms::FragmentPattern::kStrided;
  int64_t overlap_steps = 1;         // τ
  double merge_alpha = 0.5;          // α
  comm::Encoding exchange = comm::Encoding::kFp32;
};

// outer.lr = 0 and outer.momentum = -1 stand for the optimizer's published defaults (see
// optim::default_outer_options); load_config writes the values they stand for.
struct OuterSection {
  optim::OuterKind optimizer = optim::OuterKind::kNesterov;
  double lr = 0;
  double momentum = -1;
  double beta2 = 0.95;
  double eps = 0.1;  // the DiLoCo paper's stable value for outer Adam
  int64_t momentum_warmup = 0;  // outer steps over which the momentum rises from 0 (0 = off)
};

struct ClusterSection {
  int64_t workers = 1;               // worker processes (replicas) in the run
  int64_t port = 29500;              // `loco coordinator`'s port (`loco launch` picks a free one)
  std::string host;                  // address peers use to reach this worker; "" = the one that reaches the coordinator
  double timeout_s = 120;            // bound on every collective and on forming a group
  int64_t connections = 1;           // TCP connections between each pair of workers (long links: several)
  double join_timeout_s = 300;       // the coordinator waits this long for all workers to join
  double connect_timeout_s = 60;     // a worker retries reaching the coordinator this long
  // Elastic membership (DiLoCo): workers may fail, be replaced and join during the run.
  bool elastic = false;
  int64_t min_workers = 1;           // a round needs at least this many workers (the quorum)
  double heartbeat_s = 1;            // seconds between a worker's heartbeats to the coordinator
  double dead_after_s = 10;          // heartbeat silence after which a worker counts as failed
  double coordinator_timeout_s = 60; // a worker's retries of a coordinator that stopped answering
  // The run's shared secret: every request to the coordinator is signed with it (docs/security.md).
  // "" = the environment's LOCO_JOIN_TOKEN, if set, else the run folder's generated one. Never
  // written to config.toml, checkpoints or logs.
  std::string join_token;
  // TLS for the control plane: the coordinator's certificate and key (PEM), and the CA a worker
  // verifies the coordinator against ("" = tls_cert itself, for a self-signed certificate).
  std::string tls_cert, tls_key, tls_ca;
  // What the collectives between workers prove and hide (comm::DataPlane, docs/security.md):
  // "auto" = "authenticated" when the run has a join token, else "open".
  std::string data_plane = "auto";
};

// The join token the user set: cluster.join_token, else $LOCO_JOIN_TOKEN, else "" (the run folder's
// generated token, auth.h, is resolved by the control plane).
std::string join_token(const ClusterSection& cluster);

struct CheckpointSection {
  int64_t every = 500;       // steps between checkpoints (and one at the end); 0 = only at the end
  int64_t keep = 2;          // most recent checkpoints kept
};

// DiPaCo's modular model (model/paths.h, docs/dipaco.md): `loco plan` plans it, `loco launch` trains
// it as tasks; the dense training commands refuse a config that sets it.
struct DipacoSection {
  std::string levels;            // "" = a dense model; "2:2,2:2": one BLOCKS:MODULES per level
  bool embed_path_specific = false;  // dipaco.embed: "shared" or "path"
  bool product_routing = false;      // dipaco.routing: "kmeans" (balanced) or "product" (P = k²)
  std::string database;              // "" = RUN/dipaco.sqlite; else a PostgreSQL connection string (secret)
  double lease_s = 60;               // a task's lease without renewal
  int64_t top_n = 1;                 // training shards: each document to its n nearest paths (never at evaluation)
  int64_t reroute_phase = 0;         // > 0: discriminative re-routing before this phase (0 = k-means throughout)
  double router_fraction = 0.1;      // ... on this share of the training documents, held out of training
  double phase_deadline_s = 0;       // > 0: a module steps this long after its phase's first report, with what arrived
  bool outer_rescale = true;         // a module's outer gradient times √(paths that reported) (algorithms/dipaco.h)
  int64_t keep_every = 0;            // > 0: every module keeps its versions 0, K, 2K, ... (else only what tasks need)
  bool early_stopping = false;       // scoring picks each path's kept version by the loss on half its validation documents
};

// `loco launch` only: emulated WAN islands (runtime/launch/islands.h); "" = this machine's own network.
struct LinkSection {
  std::string rate;     // every island's link rate, e.g. "100mbit"; "" = not shaped
  std::string delay;    // every island's one-way delay, e.g. "50ms"; "" = none added
  std::string workers;  // per-worker links, "RANK:rate=...,delay=...;RANK:..."
  double cpu = 0;       // every worker island's share of the CPU, in cores; 0 = none of its own
  bool enabled() const { return !rate.empty() || !delay.empty() || !workers.empty() || cpu > 0; }
};

struct RunConfig {
  RunSection run;
  DataSection data;
  model::ModelOptions model = default_model();  // model.vocab_size = 0: take it from the dataset
  static model::ModelOptions default_model() {
    model::ModelOptions options;
    options.vocab_size = 0;
    return options;
  }
  OptimSection optim;
  TrainSection train;
  EvalSection eval;
  CheckpointSection checkpoint;
  SyncSection sync;
  OuterSection outer;
  ClusterSection cluster;
  DipacoSection dipaco;
  LinkSection link;
};

// The outer Nesterov defaults with sync.eager (bench/eager.sh), and the largest step
// lr / (1 - momentum) eager updates trained well with in that sweep.
inline constexpr double kEagerOuterLr = 0.7;
inline constexpr double kEagerOuterMomentum = 0.0;
inline constexpr double kEagerLargestStableStep = 1.0;
// The outer optimizer's options, with outer.lr = 0 / outer.momentum = -1 resolved to the defaults
// (with sync.eager, outer Nesterov's are kEagerOuterLr and kEagerOuterMomentum).
optim::OuterOptions outer_options(const RunConfig& config);
// What a config asks that is allowed but unwise, one sentence each (printed by train and launch).
std::vector<std::string> config_warnings(const RunConfig& config);
// Replaces the "default" stand-ins (outer.lr = 0, outer.momentum = -1) by the values they mean.
void resolve_defaults(RunConfig& config);
// The config as a run on the dataset of `manifest` trains it, the one way every command resolves
// it: the defaults resolved, model.vocab_size = 0 taken from the dataset, and everything
// validated. Throws ConfigError when model.vocab_size is set and is not the dataset's.
RunConfig resolve_for_dataset(RunConfig config, const data::Manifest& manifest);
// How outer gradients are weighted, sync.weighting = "auto" resolved.
algorithms::Weighting weighting(const RunConfig& config);
// DiLoCo's and Streaming DiLoCo's options from the config, for a worker whose shard holds
// `shard_tokens` tokens (needed when weighting by shard size).
algorithms::DiLoCoOptions diloco_options(const RunConfig& config, int64_t shard_tokens = 0);
algorithms::StreamingOptions streaming_options(const RunConfig& config, int64_t shard_tokens = 0);
// Asynchronous DiLoCo's (sync.async): what the coordinator's outer state runs with.
algorithms::AsyncOptions async_options(const RunConfig& config);

// DiPaCo's levels, modules and paths as the config sets them (levels empty: a dense model).
model::PathOptions path_options(const RunConfig& config);
// Throws ConfigError for a DiPaCo config (dipaco.levels) given to a command that trains a dense model
// (train, worker, coordinator), so that none silently trains something other than what the config
// asks for; `loco launch` trains it (runtime/launch/dipaco_launch.h).
void check_trainable(const RunConfig& config);

// Keys that may differ between the processes of one run (paths, devices, threads, logging, and
// the settings of one process only: ports, addresses, its own timeouts); every other key must be
// equal (the coordinator refuses a worker otherwise).
extern const std::vector<std::string> kPerWorkerKeys;
// Keys that must not change when a run is resumed: they define the model, the data and the
// trajectory. (train.steps, eval.*, checkpoint.* and logging may change.)
extern const std::vector<std::string> kResumeFixedKeys;
// Keys whose values differ, as "key: a -> b", leaving out those starting with one of `excluded`.
std::vector<std::string> differences_except(const RunConfig& a, const RunConfig& b, const std::vector<std::string>& excluded);

// Parses TOML text; `source` names it in errors. Unknown keys, wrong types and out-of-range values
// throw ConfigError naming the key (and the line).
RunConfig parse_config(const std::string& toml_text, const std::string& source);
// Reads `file` (DataError if missing), then applies overrides ("section.key=value"), then
// resolve_defaults().
RunConfig load_config(const fs::path& file, const std::vector<std::string>& overrides);
// Applies one override "section.key=value"; the value is parsed as the key's type.
void apply_override(RunConfig& config, const std::string& assignment);
// Range and cross-field checks (e.g. model.heads divides model.width). Throws ConfigError.
void validate(const RunConfig& config);

// The resolved config as TOML; parse_config(to_toml(c)) == c.
std::string to_toml(const RunConfig& config);
// Keys whose values differ, as "key: a -> b" lines, restricted to keys starting with one of
// `prefixes` (all keys when empty).
std::vector<std::string> differences(const RunConfig& a, const RunConfig& b, const std::vector<std::string>& prefixes = {});
// Markdown table of every key: name, type, default, help.
std::string reference_markdown();

}  // namespace loco::runtime
