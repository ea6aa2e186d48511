#include "loco/runtime/config/keys.h"

#include <iterator>

namespace loco::runtime::keys {
namespace {

template <class E>
EnumField enum_field(E& value, std::vector<std::pair<E, std::string>> table) {
  EnumField field;
  for (auto& [e, name] : table) field.names.push_back(name);
  field.get = [&value, table] {
    for (auto& [e, name] : table) {
      if (e == value) return name;
    }
    return std::string("?");
  };
  field.set = [&value, table](const std::string& text) {
    for (auto& [e, name] : table) {
      if (name == text) value = e;
    }
  };
  return field;
}

// A field's range or secrecy, as the tables below write it.
Field positive(Field f) {
  f.min = 0;
  f.min_exclusive = true;
  return f;
}
Field at_least(double lo, Field f) {
  f.min = lo;
  return f;
}
Field between(double lo, double hi, Field f) {
  f.min = lo;
  f.max = hi;
  return f;
}
Field secret(Field f) {
  f.secret = true;
  return f;
}

// The [model] keys of the table below.
// (a data table)
std::vector<Field> model_fields(model::ModelOptions& m) {
  using model::MlpKind;
  using model::NormKind;
  using model::PositionKind;
  using model::RopeScaling;
  return {
      at_least(0, {"model.vocab_size", "vocabulary size; 0 = the dataset's", &m.vocab_size}),
      at_least(1, {"model.context", "context length T in tokens", &m.context}),
      at_least(1, {"model.layers", "transformer blocks", &m.layers}),
      at_least(1, {"model.width", "model width d_model", &m.width}),
      at_least(1, {"model.heads", "attention heads (must divide width)", &m.heads}),
      at_least(0, {"model.kv_heads", "key/value heads, dividing heads (grouped-query attention); 0 = heads", &m.kv_heads}),
      positive({"model.mlp_ratio", "MLP hidden width / model width", &m.mlp_ratio}),
      at_least(0, {"model.mlp_hidden", "MLP hidden width; 0 = round(mlp_ratio * width)", &m.mlp_hidden_size}),
      {"model.tie_embeddings", "the output head is the token embedding (false: a matrix of its own, in the head's group)", &m.tie_embeddings},
      {"model.attention_bias", "biases on the query, key and value projections (Qwen2)", &m.attention_bias},
      {"model.norm", "normalization: rmsnorm or layernorm", enum_field(m.norm, {{NormKind::kRMSNorm, "rmsnorm"}, {NormKind::kLayerNorm, "layernorm"}})},
      {"model.position", "positions: rope or learned", enum_field(m.position, {{PositionKind::kRope, "rope"}, {PositionKind::kLearned, "learned"}})},
      {"model.mlp", "MLP: gelu or swiglu", enum_field(m.mlp, {{MlpKind::kGelu, "gelu"}, {MlpKind::kSwiGlu, "swiglu"}})},
      {"model.qk_norm", "RMSNorm on queries and keys per head", &m.qk_norm},
      positive({"model.norm_eps", "epsilon of the normalization (Hugging Face's rms_norm_eps)", &m.norm_eps}),
      at_least(1.000001, {"model.rope_theta", "base of the rotary embeddings' frequencies (Hugging Face's rope_theta)", &m.rope_base}),
      {"model.rope_scaling", "rotary scaling, as Hugging Face's rope_scaling: none, linear (frequencies / rope_factor) or llama3 (Llama 3.1's)",
       enum_field(m.rope_scaling, {{RopeScaling::kNone, "none"}, {RopeScaling::kLinear, "linear"}, {RopeScaling::kLlama3, "llama3"}})},
      at_least(1, {"model.rope_factor", "rope_scaling: its factor", &m.rope_factor}),
      positive({"model.rope_low_freq_factor", "rope_scaling = llama3: low_freq_factor", &m.rope_low_freq_factor}),
      positive({"model.rope_high_freq_factor", "rope_scaling = llama3: high_freq_factor", &m.rope_high_freq_factor}),
      at_least(1, {"model.rope_original_context", "rope_scaling = llama3: original_max_position_embeddings", &m.rope_original_context}),
      positive({"model.init_std", "std of the normal initialization", &m.init_std}),
  };
}
// The [dipaco] keys of the table below.
// (a data table)
std::vector<Field> dipaco_fields(DipacoSection& d) {
  return {
      {"dipaco.levels", "DiPaCo: the modular model's levels in block order, each BLOCKS:MODULES (MODULES a count, 1 = shared by every path, or path = path-specific), e.g. \"2:2,2:2\" (4 paths); \"\" = a dense model. `loco plan` prints the plan, `loco launch` trains it", &d.levels},
      {"dipaco.embed", "DiPaCo: the embeddings and final norm: shared by every path, or path (one copy per path)",
       enum_field(d.embed_path_specific, {{false, "shared"}, {true, "path"}})},
      {"dipaco.routing", "DiPaCo: how `loco route` assigns documents to paths: kmeans (balanced k-means, k = paths) or product (product k-means over the feature's halves; paths must be a square k*k)",
       enum_field(d.product_routing, {{false, "kmeans"}, {true, "product"}})},
      secret({"dipaco.database", "DiPaCo: where the task queue and the module registry live: \"\" = $LOCO_DIPACO_DATABASE if set, else RUN/dipaco.sqlite (SQLite, one machine or a shared folder), or a PostgreSQL connection string (\"host=... dbname=... user=...\"; the password from ~/.pgpass or $PGPASSWORD) for runs across machines; never written to config.toml or logs", &d.database}),
      at_least(1, {"dipaco.top_n", "DiPaCo: overlapping training shards: each training document goes to its balanced path and its next n - 1 nearest paths (1 = disjoint shards); evaluation and inference always run one path, the router's", &d.top_n}),
      at_least(0, {"dipaco.reroute_phase", "DiPaCo: discriminative re-routing before this phase: every path scores the held-out router documents, a linear router learns which path models each best (its biases tuned to balanced shards) and re-shards the training and validation documents; 0 = k-means routing throughout", &d.reroute_phase}),
      between(0.001, 0.5, {"dipaco.router_fraction", "DiPaCo with dipaco.reroute_phase: the share of the training documents held out of training as the router's documents", &d.router_fraction}),
      at_least(0, {"dipaco.phase_deadline_s", "DiPaCo: seconds after a module's first report of a phase that its outer step runs with the reports that arrived (weighted by shard, rescaled by the square root of their count); a later path's report to it is left out, and a path left behind by all its modules restarts from their new versions; 0 = every module waits for all its paths", &d.phase_deadline_s}),
      {"dipaco.outer_rescale", "DiPaCo: multiply a module's averaged outer gradient by the square root of how many paths reported to it (averaging n nearly independent outer gradients shrinks their norm by about that much); false = the plain weighted average", &d.outer_rescale},
      at_least(0, {"dipaco.keep_every", "DiPaCo: every module keeps its versions 0, K, 2K, ... and its last on disk, for early stopping (each costs a module's size); 0 = only the versions the next tasks need", &d.keep_every}),
      {"dipaco.early_stopping", "DiPaCo: scoring (at the end of `loco launch`, `loco eval`) picks each path's version among those kept (dipaco.keep_every) by its loss on half of the path's validation documents, scores the other half, and `loco generate` runs the picked versions", &d.early_stopping},
      positive({"dipaco.lease_s", "DiPaCo: seconds a task's lease lasts without renewal; a worker renews it while it works, so a worker that dies loses its task to another after at most this long", &d.lease_s}),
  };
}

}  // namespace

// Screening of the outer gradients before they are averaged (algorithms::Screening).
std::vector<Field> screening_fields(SyncSection& s) {
  return {
      at_least(0, {"sync.reject_ratio", "diloco, streaming and dipaco (its module steps, over the paths through a module): screening: a worker whose outer gradient's norm is more than this many times the median of the other workers' is left out of the sync (counted as a dropped one, logged, and in the sync event); an outer gradient that is not finite is always left out; 0 = off (docs/failure-model.md)", &s.reject_ratio}),
      at_least(0, {"sync.clip_norm", "diloco, streaming and dipaco: screening: each worker's outer gradient enters the average clipped to this norm; 0 = off", &s.clip_norm}),
      {"sync.robust_mean", "diloco and streaming (not eager): screening: none (the weighted average), median or trimmed (the trimmed mean: sync.trim contributions left out at each end), value by value over the outer gradients kept, so that a worker far off moves theta by little whatever it states; the same bytes on the wire",
       enum_field(s.robust_mean, {{comm::Combine::kSum, "none"}, {comm::Combine::kMedian, "median"}, {comm::Combine::kTrimmedMean, "trimmed"}})},
      at_least(1, {"sync.trim", "sync.robust_mean = trimmed: outer gradients left out at each end, value by value (the median when fewer than 2 trim + 1 are kept)", &s.trim}),
      {"sync.reject_not_finite", "diloco, streaming and dipaco: screening: an outer gradient with a value that is not finite is left out of the sync (the others' weights renormalized); false lets it reach the average (theta becomes NaN and the run stops), only to show what screening prevents", &s.reject_not_finite},
      {"sync.poison", "a fault to inject, for tests and benchmarks of screening: WORKER:xSCALE sends that worker's outer gradient times SCALE at every sync, WORKER:nan sends one value of it as NaN; @ROUND limits it to that sync (e.g. 1:x100, 2:nan@3); \"\" = none", &s.poison},
  };
}

std::vector<Field> async_fields(SyncSection& s) {
  return {
      {"sync.async", "diloco and streaming: asynchronous outer updates (Liu et al. 2024; docs/async.md): each worker sends its outer gradient to the coordinator when its inner steps are done, which applies it at once (delayed Nesterov), and continues from the theta that comes back without waiting for the others; the run's train.steps x cluster.workers inner steps are shared out by speed. With streaming, one fragment's outer gradient an exchange, in turn (sync.overlap_steps = 0). Fixed or elastic membership (a joiner takes a vacant slot and the current theta); screening by sync.reject_ratio, sync.clip_norm, sync.reject_not_finite", &s.async},
      at_least(0, {"sync.async_delay", "sync.async: outer gradients per momentum update N (delayed Nesterov; 1 = Nesterov on each); 0 = cluster.workers", &s.async_delay}),
      {"sync.async_dynamic_steps", "sync.async: each worker's inner steps per cycle follow its speed, sync.inner_steps for the fastest (dynamic local updates), so that unequal workers arrive at the same pace; false = sync.inner_steps for every worker", &s.async_dynamic_steps},
      between(0, 10, {"sync.async_grace", "sync.async: outer gradients that arrive together are applied together: the first waits at most this share of its cycle's time for the other workers' (no longer once every worker with a cycle under way is in), and they all continue from the same theta; 0 = each applied alone the moment it arrives", &s.async_grace}),
      positive({"sync.async_silence_s", "sync.async: a worker silent this long is taken as gone (its cycle's steps go to the others; elastic: its slot falls vacant): past max(this, 4 x its cycle's expected time) in a cycle, or this long between cycles. A worker under `loco launch` is taken as gone at once when its process exits, and an elastic run's member when its heartbeats stop for cluster.dead_after_s", &s.async_silence_s}),
      at_least(0, {"sync.async_max_staleness", "sync.async: an outer gradient that began more than this many outer updates before it arrives is left out (logged and counted); 0 = 4 x cluster.workers", &s.async_max_staleness}),
  };
}

// (a data table)
std::vector<Field> table(RunConfig& c) {
  std::vector<Field> fields = {
      {"run.dir", "folder for config.toml, metrics.jsonl and checkpoints/", &c.run.dir},
      {"data.dir", "prepared dataset folder (written by `loco prepare`)", &c.data.dir},
      {"data.shard", "how documents are divided among workers: iid (random), label (whole labels, e.g. Brown's genres) or kmeans (clusters of document embeddings)",
       enum_field(c.data.shard, {{ShardPolicy::kIid, "iid"}, {ShardPolicy::kLabel, "label"}, {ShardPolicy::kKMeans, "kmeans"}})},
      at_least(1, {"data.route_tokens", "kmeans shards: leading tokens of a document whose mean hidden state (initial model) embeds it", &c.data.route_tokens}),
  };
  auto model = model_fields(c.model);
  fields.insert(fields.end(), std::make_move_iterator(model.begin()), std::make_move_iterator(model.end()));
  std::vector<Field> rest = {
      positive({"optim.lr", "peak learning rate of AdamW", &c.optim.lr}),
      at_least(0, {"optim.warmup_steps", "linear warmup steps", &c.optim.warmup_steps}),
      at_least(0, {"optim.rewarmup_steps", "elastic and asynchronous runs: a worker that joins a run under way without saved AdamW moments ramps its learning rate up linearly over this many steps; 0 = off", &c.optim.rewarmup_steps}),
      between(0, 1, {"optim.min_lr_ratio", "final lr of the cosine decay, as a fraction of optim.lr", &c.optim.min_lr_ratio}),
      at_least(0, {"optim.grad_clip", "max global gradient norm; 0 = no clipping", &c.optim.grad_clip}),
      between(0, 0.999999, {"optim.beta1", "AdamW beta1", &c.optim.adamw.beta1}),
      between(0, 0.999999, {"optim.beta2", "AdamW beta2", &c.optim.adamw.beta2}),
      positive({"optim.eps", "AdamW epsilon", &c.optim.adamw.eps}),
      at_least(0, {"optim.weight_decay", "AdamW decoupled weight decay (matrices and embeddings only)", &c.optim.adamw.weight_decay}),
      at_least(1, {"train.steps", "optimizer steps in the run", &c.train.steps}),
      at_least(1, {"train.batch_size", "sequences per micro-batch", &c.train.batch_size}),
      at_least(1, {"train.grad_accum", "micro-batches accumulated per step", &c.train.grad_accum}),
      at_least(0, {"train.seed", "seed of the model initialization and the data order", &c.train.seed}),
      at_least(0, {"train.z_loss", "z-loss coefficient (e.g. 1e-4); 0 = off", &c.train.z_loss}),
      {"train.device", "auto, cpu, cuda or cuda:N (bf16 autocast on CUDA, fp32 on CPU)", &c.train.device},
      {"train.init_from", "checkpoint or run folder whose parameters (the global ones) start the run (a warm start), or a Hugging Face model folder (docs/hugging-face.md); \"\" = random init", &c.train.init_from},
      at_least(0, {"train.threads", "CPU threads; 0 = cores divided among local processes", &c.train.threads}),
      at_least(0, {"train.emulated_step_s", "> 0: emulated compute at model scale (docs/slow-links.md): no data is read and no forward or backward pass runs; each inner step waits this many seconds, then moves the parameters along a fixed random direction of its worker's (an eighth of them each step, by the learning rates since their last move), so that syncs, codecs and links carry real, dense outer gradients of the model's size. Such a run reports no loss and evaluates nothing; a fixed one saves no checkpoint, an elastic one saves what its restarts need (docs/failure-model.md, \"Goodput under failures\"); 0 = real compute", &c.train.emulated_step_s}),
      at_least(1, {"train.log_every", "steps between train events and plain progress lines (on a GPU, also between reads of the steps' losses)", &c.train.log_every}),
      at_least(1, {"eval.every", "steps between evaluations (one is always made at the end)", &c.eval.every}),
      at_least(1, {"eval.windows", "validation windows of model.context tokens, spread evenly over the split", &c.eval.windows}),
      at_least(1, {"eval.batch_size", "windows per evaluation batch", &c.eval.batch_size}),
      at_least(0, {"checkpoint.every", "steps between checkpoints (one is always written at the end); 0 = end only", &c.checkpoint.every}),
      at_least(1, {"checkpoint.keep", "how many recent checkpoints to keep", &c.checkpoint.keep}),
      {"sync.algorithm", "none (one process), ddp (average gradients every step), diloco (outer step every sync.inner_steps), streaming (Streaming DiLoCo: fragments on a staggered schedule, overlapped), local (replicas that never talk)",
       enum_field(c.sync.algorithm, {{Algorithm::kNone, "none"}, {Algorithm::kDdp, "ddp"}, {Algorithm::kDiLoCo, "diloco"},
                                     {Algorithm::kStreaming, "streaming"}, {Algorithm::kLocal, "local"}})},
      at_least(1, {"sync.inner_steps", "DiLoCo: inner steps H between outer steps (streaming: between two syncs of one fragment)", &c.sync.inner_steps}),
      at_least(0, {"sync.round_seconds", "elastic DiLoCo: time-budgeted rounds: each worker ends its round after this many seconds of inner steps (its outer gradient weighted by its tokens) instead of after sync.inner_steps; 0 = off", &c.sync.round_seconds}),
      at_least(0, {"sync.round_grace_s", "time-budgeted rounds: seconds the round waits, after the first worker reached its end, for the others; later ones are left out of it and rejoin", &c.sync.round_grace_s}),
      {"sync.weighting", "DiLoCo: weight of each worker's outer gradient: tokens (processed this round), shard (the size of its shard), uniform, or auto (shard with label or kmeans shards, else tokens)",
       enum_field(c.sync.weighting, {{WeightingChoice::kAuto, "auto"}, {WeightingChoice::kTokens, "tokens"},
                                     {WeightingChoice::kShard, "shard"}, {WeightingChoice::kUniform, "uniform"}})},
      between(0, 0.99, {"sync.drop_probability", "an experiment (DiLoCo paper, dropped outer gradients): each worker's outer gradient is left out of each sync with this probability, the others' weights renormalized; 0 = off", &c.sync.drop_probability}),
      positive({"sync.bucket_mb", "megabytes per message of an all-reduce of gradients (ddp) or outer gradients: each exchange is one operation whose pieces travel pipelined, spread over cluster.connections", &c.sync.bucket_mb}),
      at_least(1, {"sync.fragments", "streaming: fragments P, synchronized in turn every sync.inner_steps / P steps (at most the model's blocks)", &c.sync.fragments}),
      {"sync.fragment_pattern", "streaming: strided (block i in fragment i mod P) or sequential (runs of consecutive blocks)",
       enum_field(c.sync.fragment_pattern, {{algorithms::FragmentPattern::kStrided, "strided"}, {algorithms::FragmentPattern::kSequential, "sequential"}})},
      at_least(0, {"sync.overlap_steps", "streaming: inner steps tau a fragment's sync overlaps before its result is applied (0 = wait at once)", &c.sync.overlap_steps}),
      between(0, 1, {"sync.merge_alpha", "streaming: share alpha of the local fragment kept when the global one arrives (0 = take the global)", &c.sync.merge_alpha}),
      {"sync.eager", "diloco and streaming: eager outer updates (Kale et al. 2025): each sync's exchange overlaps the next sync.inner_steps inner steps, and each worker steps at once with the others' one-round-stale outer gradients plus its own fresh one; needs sync.overlap_steps = 0; with cluster.elastic its rounds come one at a time (an exchange's round closes at the next sync) and the run ends with a round averaging θ per fragment; its outer Nesterov defaults are lr 0.7, momentum 0 (bench/eager.sh; DiLoCo's 0.7 / 0.9 oscillated), and steps lr / (1 - momentum) beyond 1 are warned about (docs/slow-links.md)", &c.sync.eager},
      {"sync.exchange", "diloco and streaming: encoding of outer gradients on the wire: fp32, bf16, fp8, e3m0 (4-bit), int8, int4 (ddp sends fp32 gradients and ignores it)",
       enum_field(c.sync.exchange, {{comm::Encoding::kFp32, "fp32"}, {comm::Encoding::kBf16, "bf16"}, {comm::Encoding::kFp8, "fp8"},
                                    {comm::Encoding::kE3M0, "e3m0"}, {comm::Encoding::kInt8, "int8"}, {comm::Encoding::kInt4, "int4"}})},
      {"outer.optimizer", "DiLoCo's outer optimizer: nesterov, sgd (lr 1, no momentum = FedAvg) or adam",
       enum_field(c.outer.optimizer, {{optim::OuterKind::kNesterov, "nesterov"}, {optim::OuterKind::kSgd, "sgd"}, {optim::OuterKind::kAdam, "adam"}})},
      at_least(0, {"outer.lr", "outer learning rate; 0 = the optimizer's default (nesterov 0.7, sgd 1, adam 0.1)", &c.outer.lr}),
      between(-1, 0.999999, {"outer.momentum", "outer momentum (adam: beta1), in [0, 1); -1 = the optimizer's default (nesterov 0.9, or 0 with sync.eager; sgd 0, adam 0.9)", &c.outer.momentum}),
      between(0, 0.999999, {"outer.beta2", "adam outer optimizer: beta2", &c.outer.beta2}),
      positive({"outer.eps", "adam outer optimizer: epsilon (0.1: the DiLoCo paper found outer Adam stable only with a large one)", &c.outer.eps}),
      at_least(0, {"outer.momentum_warmup", "outer steps over which the momentum (nesterov, sgd) rises linearly from 0 to outer.momentum; 0 = off", &c.outer.momentum_warmup}),
      at_least(1, {"cluster.workers", "worker processes (replicas) in the run", &c.cluster.workers}),
      between(0, 65535, {"cluster.port", "port of `loco coordinator` (`loco launch` picks a free one unless --port is given)", &c.cluster.port}),
      {"cluster.host", "address other workers use to reach this one; \"\" = the local address that reaches the coordinator", &c.cluster.host},
      positive({"cluster.timeout_s", "seconds any collective, and the forming of a group, may take before it fails", &c.cluster.timeout_s}),
      between(1, 64, {"cluster.connections", "TCP connections between each pair of workers; the encoded all-reduce spreads its pieces over them (a long, fast link needs several: one TCP stream is bound by its window and round trip)", &c.cluster.connections}),
      positive({"cluster.join_timeout_s", "seconds the coordinator waits for all workers to join (elastic: also how long a worker "
                "waits for a vacant slot in a full run)", &c.cluster.join_timeout_s}),
      positive({"cluster.connect_timeout_s", "seconds a worker keeps retrying to reach the coordinator", &c.cluster.connect_timeout_s}),
      {"cluster.elastic", "workers may fail, be replaced and join mid-run; each round runs with the workers alive (sync.algorithm = diloco or streaming); with sync.async there are no rounds: a worker takes a vacant slot at any time and continues from the current theta", &c.cluster.elastic},
      at_least(1, {"cluster.min_workers", "elastic: the quorum, the fewest workers a round may run with (it waits for more)", &c.cluster.min_workers}),
      positive({"cluster.heartbeat_s", "elastic: seconds between a worker's heartbeats to the coordinator", &c.cluster.heartbeat_s}),
      positive({"cluster.dead_after_s", "elastic: seconds of heartbeat silence after which a worker is declared failed (asynchronous DiLoCo: its slot falls vacant)", &c.cluster.dead_after_s}),
      positive({"cluster.coordinator_timeout_s", "elastic: seconds a worker keeps retrying a coordinator that stopped answering (a restarted one continues the run), before it exits with the run's state saved", &c.cluster.coordinator_timeout_s}),
      secret({"cluster.join_token", "the run's shared secret: every request to the coordinator is signed with it; \"\" = $LOCO_JOIN_TOKEN, else RUN/join_token (generated by a coordinator on loopback; adopted only as a private file of this user's); a token of your own needs 128 bits (openssl rand -hex 32); never written to config.toml or logs", &c.cluster.join_token}),
      {"cluster.tls_cert", "coordinator: its TLS certificate (PEM); set with cluster.tls_key, it serves HTTPS only; \"\" = plain HTTP", &c.cluster.tls_cert},
      {"cluster.tls_key", "coordinator: the private key (PEM) of cluster.tls_cert", &c.cluster.tls_key},
      {"cluster.data_plane", "what the collectives between workers prove and hide: authenticated (every pair proves it holds the run's join token when a group forms, and every message carries an AES-GCM tag: an altered, injected or replayed one fails the round as a dead peer does), encrypted (the same, and the bytes are encrypted), open (Gloo's TCP as it is: only on a network you trust), or auto (authenticated when the run has a join token, else open)",
       enum_field(c.cluster.data_plane, {{std::string("auto"), "auto"}, {std::string("authenticated"), "authenticated"}, {std::string("encrypted"), "encrypted"}, {std::string("open"), "open"}})},
      {"cluster.tls_ca", "worker: reach the coordinator over HTTPS and verify its certificate against this CA (PEM); \"\" = cluster.tls_cert if set (self-signed), else plain HTTP", &c.cluster.tls_ca},
  };
  auto screening = screening_fields(c.sync);
  fields.insert(fields.end(), std::make_move_iterator(screening.begin()), std::make_move_iterator(screening.end()));
  auto async = async_fields(c.sync);
  fields.insert(fields.end(), std::make_move_iterator(async.begin()), std::make_move_iterator(async.end()));
  fields.insert(fields.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
  auto dipaco = dipaco_fields(c.dipaco);
  fields.insert(fields.end(), std::make_move_iterator(dipaco.begin()), std::make_move_iterator(dipaco.end()));
  std::vector<Field> links = {
      {"link.rate", "`loco launch`: run each process in an emulated island (its own network namespace; needs root) whose link has this rate, e.g. \"100mbit\" or \"1gbit\" (shaped by the kernel's tbf, both directions); \"\" = not shaped (docs/slow-links.md)", &c.link.rate},
      {"link.delay", "`loco launch`: the islands' one-way delay, e.g. \"50ms\" (added by loco's relay: this kernel has no netem); \"\" = none", &c.link.delay},
      {"link.workers", "`loco launch`: links of single workers, \"RANK:rate=...,delay=...;RANK:...\" (a slow island among fast ones); keys left out are link.rate and link.delay's", &c.link.workers},
      {"link.cpu", "`loco launch`: each worker island's share of the machine's CPU, in cores (a CPU control group's quota), so that islands compute at equal speed as separate machines would; 0 = the machine's cores as they come (docs/slow-links.md)", &c.link.cpu, 0, 1024},
  };
  fields.insert(fields.end(), std::make_move_iterator(links.begin()), std::make_move_iterator(links.end()));
  return fields;
}

}  // namespace loco::runtime::keys
