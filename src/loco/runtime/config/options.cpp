// The options the run's components take, derived from its config (config.h), and the checks of a
// whole config: what the field table (config.cpp) cannot say about one key alone.
#include "loco/runtime/config/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "loco/core/environment.h"
#include "loco/core/error.h"

namespace loco::runtime {

const char* to_string(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kNone: return "none";
    case Algorithm::kDdp: return "ddp";
    case Algorithm::kDiLoCo: return "diloco";
    case Algorithm::kStreaming: return "streaming";
    case Algorithm::kLocal: return "local";
  }
  return "?";
}

optim::OuterOptions outer_options(const RunConfig& config) {
  optim::OuterOptions o = optim::default_outer_options(config.outer.optimizer);
  // Eager updates step mostly with a round-old consensus, and DiLoCo's Nesterov 0.7 / 0.9
  // oscillates on it; bench/eager.sh's sweep found these train (docs/slow-links.md).
  if (config.sync.eager && config.outer.optimizer == optim::OuterKind::kNesterov) {
    o.lr = kEagerOuterLr;
    o.momentum = kEagerOuterMomentum;
  }
  if (config.outer.lr > 0) o.lr = config.outer.lr;
  if (config.outer.momentum >= 0) o.momentum = config.outer.momentum;
  o.beta2 = config.outer.beta2;
  o.eps = config.outer.eps;
  o.momentum_warmup = config.outer.momentum_warmup;
  return o;
}

std::vector<std::string> config_warnings(const RunConfig& config) {
  std::vector<std::string> out;
  const auto o = outer_options(config);
  if (config.sync.eager && o.kind != optim::OuterKind::kAdam && o.momentum < 1) {
    const double step = o.lr / (1 - o.momentum);
    if (step > kEagerLargestStableStep) {
      out.push_back(fmt::format(
          "sync.eager with outer lr {:g} and momentum {:g} takes steps of lr / (1 - momentum) = {:.3g} times the averaged "
          "outer gradient; beyond {:g}, eager updates trained worse or oscillated in bench/eager.sh (docs/slow-links.md). "
          "The eager defaults are lr {:g}, momentum {:g}",
          o.lr, o.momentum, step, kEagerLargestStableStep, kEagerOuterLr, kEagerOuterMomentum));
    }
  }
  return out;
}

void resolve_defaults(RunConfig& config) {
  const auto o = outer_options(config);
  config.outer.lr = o.lr;
  config.outer.momentum = o.momentum;
}

RunConfig resolve_for_dataset(RunConfig config, const data::Manifest& manifest) {
  resolve_defaults(config);
  if (config.model.vocab_size == 0) {
    config.model.vocab_size = manifest.vocab_size;
  } else if (config.model.vocab_size != manifest.vocab_size) {
    throw ConfigError("config", fmt::format("model.vocab_size = {} but the dataset {} has a vocabulary of {}; hint: leave "
                                            "model.vocab_size = 0 to take the dataset's", config.model.vocab_size,
                                            config.data.dir, manifest.vocab_size));
  }
  validate(config);
  return config;
}

algorithms::Weighting weighting(const RunConfig& config) {
  switch (config.sync.weighting) {
    case WeightingChoice::kAuto:
      return config.data.shard == ShardPolicy::kIid || config.sync.round_seconds > 0 ? algorithms::Weighting::kTokens
                                                                                     : algorithms::Weighting::kShard;
    case WeightingChoice::kTokens: return algorithms::Weighting::kTokens;
    case WeightingChoice::kShard: return algorithms::Weighting::kShard;
    case WeightingChoice::kUniform: return algorithms::Weighting::kUniform;
  }
  LOCO_CHECK(false, "unknown weighting");
}

namespace {

// What DiLoCo and Streaming DiLoCo read alike: the rounds' length, the outer step, the weights and
// the exchange.
template <typename Options>
Options outer_round_options(const RunConfig& config, int64_t shard_tokens) {
  Options o;
  o.inner_steps = config.sync.inner_steps;
  o.total_steps = config.train.steps;
  o.outer = outer_options(config);
  o.weighting = weighting(config);
  o.shard_tokens = shard_tokens;
  o.drop_probability = config.sync.drop_probability;
  o.drop_seed = static_cast<uint64_t>(config.train.seed);
  o.exchange = config.sync.exchange;
  o.piece_bytes = static_cast<int64_t>(config.sync.bucket_mb * 1e6);
  o.eager = config.sync.eager;
  o.screening = {config.sync.reject_ratio, config.sync.clip_norm, config.sync.robust_mean, config.sync.trim,
                 config.sync.reject_not_finite};
  o.poison = algorithms::parse_poison(config.sync.poison);
  return o;
}

}  // namespace

algorithms::DiLoCoOptions diloco_options(const RunConfig& config, int64_t shard_tokens) {
  auto o = outer_round_options<algorithms::DiLoCoOptions>(config, shard_tokens);
  o.round_seconds = config.sync.round_seconds;
  return o;
}

algorithms::StreamingOptions streaming_options(const RunConfig& config, int64_t shard_tokens) {
  auto o = outer_round_options<algorithms::StreamingOptions>(config, shard_tokens);
  o.fragments = config.sync.fragments;
  o.pattern = config.sync.fragment_pattern;
  o.overlap_steps = config.sync.overlap_steps;
  o.merge_alpha = config.sync.merge_alpha;
  return o;
}

algorithms::AsyncOptions async_options(const RunConfig& config) {
  algorithms::AsyncOptions o;
  o.workers = config.cluster.workers;
  o.inner_steps = config.sync.inner_steps;
  o.total_steps = config.train.steps;
  o.delay = config.sync.async_delay;
  o.dynamic_steps = config.sync.async_dynamic_steps;
  o.max_staleness = config.sync.async_max_staleness;
  o.grace = config.sync.async_grace;
  o.silence_s = config.sync.async_silence_s;
  const auto outer = outer_options(config);
  o.lr = outer.lr;
  o.momentum = outer.momentum;
  o.screening = {config.sync.reject_ratio, config.sync.clip_norm, comm::Combine::kSum, 1, config.sync.reject_not_finite};
  return o;
}

std::string join_token(const ClusterSection& cluster) {
  if (!cluster.join_token.empty()) return cluster.join_token;
  const char* env = std::getenv("LOCO_JOIN_TOKEN");
  return env != nullptr ? env : "";
}

model::PathOptions path_options(const RunConfig& config) {
  model::PathOptions options;
  options.levels = model::PathOptions::parse_levels(config.dipaco.levels);
  options.embed_path_specific = config.dipaco.embed_path_specific;
  return options;
}

void check_trainable(const RunConfig& config) {
  if (path_options(config).enabled()) {
    throw ConfigError("config", fmt::format("dipaco.levels = \"{}\": a DiPaCo run trains its paths as tasks: start it with "
                                            "`loco launch --config FILE` (or `loco path-worker` processes on a prepared run; "
                                            "docs/dipaco.md). Hint: leave dipaco.levels empty to train a dense model here",
                                            config.dipaco.levels));
  }
}

}  // namespace loco::runtime
