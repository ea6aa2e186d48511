#include "loco/algorithms/options.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>

#include "loco/core/error.h"

namespace loco::algorithms {

void StreamingOptions::validate() const {
  if (inner_steps < 1) throw ConfigError("algorithms", fmt::format("sync.inner_steps must be >= 1, got {}", inner_steps));
  if (total_steps < 1) throw ConfigError("algorithms", fmt::format("the run must have >= 1 step, got {}", total_steps));
  if (fragments < 1 || fragments > inner_steps) {
    throw ConfigError("algorithms", fmt::format("sync.fragments must be in [1, sync.inner_steps = {}] so that every "
                                                "fragment has its own sync step, got {}", inner_steps, fragments));
  }
  if (overlap_steps < 0 || overlap_steps >= inner_steps) {
    throw ConfigError("algorithms", fmt::format("sync.overlap_steps must be in [0, sync.inner_steps = {}), got {}: a "
                                                "fragment's result must arrive before its next sync starts",
                                                inner_steps, overlap_steps));
  }
  if (!(merge_alpha >= 0 && merge_alpha <= 1)) {
    throw ConfigError("algorithms", fmt::format("sync.merge_alpha must be in [0, 1], got {}", merge_alpha));
  }
  if (piece_bytes < 4) throw ConfigError("algorithms", "sync.bucket_mb is too small");
  if (!(drop_probability >= 0 && drop_probability < 1)) {
    throw ConfigError("algorithms", fmt::format("sync.drop_probability must be in [0, 1), got {}", drop_probability));
  }
  if (eager && (overlap_steps != 0 || round_seconds > 0 || drop_probability > 0)) {
    throw ConfigError("algorithms", "eager outer updates (sync.eager) overlap a whole round by themselves: they need "
                                    "sync.overlap_steps = 0, fixed rounds (sync.round_seconds = 0) and no dropped outer "
                                    "gradients (sync.drop_probability = 0)");
  }
  screening.validate();
  if (eager && screening.combine != comm::Combine::kSum) {
    // A worker steps with the others' share of the sum, S − w_m·Δ_m: a median has no such share.
    throw ConfigError("algorithms", "sync.robust_mean is not available with eager outer updates (sync.eager): each "
                                    "worker steps with the others' share of a weighted sum (sync.reject_ratio and "
                                    "sync.clip_norm are)");
  }
  if (round_seconds < 0 || (round_seconds > 0 && (fragments != 1 || overlap_steps != 0))) {
    throw ConfigError("algorithms", "time-budgeted rounds (sync.round_seconds) need one fragment and no overlap (DiLoCo)");
  }
  outer.validate();
}

void Screening::validate() const {
  if (!(reject_ratio == 0 || reject_ratio > 1)) {
    throw ConfigError("algorithms", fmt::format("sync.reject_ratio must be 0 (off) or > 1, got {}", reject_ratio));
  }
  if (!(clip_norm >= 0)) throw ConfigError("algorithms", fmt::format("sync.clip_norm must be >= 0 (0 = off), got {}", clip_norm));
  if (combine != comm::Combine::kSum && clip_norm > 0) {
    throw ConfigError("algorithms", "sync.robust_mean and sync.clip_norm do not go together (a robust mean of clipped "
                                    "outer gradients is not made yet): choose one");
  }
  if (trim < 1 || trim > 4096) throw ConfigError("algorithms", fmt::format("sync.trim must be in [1, 4096], got {}", trim));
}

void DiLoCoOptions::validate() const {
  if (inner_steps < 1) throw ConfigError("algorithms", fmt::format("sync.inner_steps must be >= 1, got {}", inner_steps));
  if (total_steps < 1) throw ConfigError("algorithms", fmt::format("the run must have >= 1 step, got {}", total_steps));
  if (piece_bytes < 4) throw ConfigError("algorithms", "sync.bucket_mb is too small");
  if (round_seconds < 0) throw ConfigError("algorithms", fmt::format("sync.round_seconds must be >= 0, got {}", round_seconds));
  screening.validate();
  outer.validate();
}

StreamingOptions DiLoCoOptions::as_streaming() const {
  validate();
  StreamingOptions o;
  o.inner_steps = inner_steps;
  o.total_steps = total_steps;
  o.fragments = 1;
  o.overlap_steps = 0;
  o.merge_alpha = 0;
  o.exchange = exchange;
  o.round_seconds = round_seconds;
  o.outer = outer;
  o.weighting = weighting;
  o.shard_tokens = shard_tokens;
  o.drop_probability = drop_probability;
  o.drop_seed = drop_seed;
  o.piece_bytes = piece_bytes;
  o.eager = eager;
  o.screening = screening;
  o.poison = poison;
  return o;
}

Poison parse_poison(std::string_view text) {
  Poison poison;
  if (text.empty()) return poison;
  const auto bad = [&] {
    return ConfigError("algorithms", fmt::format("sync.poison = '{}': expected WORKER:xSCALE or WORKER:nan, each with an "
                                                 "optional @ROUND (e.g. '1:x100', '2:nan@3')", text));
  };
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) throw bad();
  const auto at = text.find('@', colon);
  const auto number = [&](std::string_view part, auto& out) {
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), out);
    if (ec != std::errc() || end != part.data() + part.size()) throw bad();
  };
  number(text.substr(0, colon), poison.worker);
  const auto what = text.substr(colon + 1, at == std::string_view::npos ? std::string_view::npos : at - colon - 1);
  if (what == "nan") poison.scale = std::numeric_limits<double>::quiet_NaN();
  else if (what.size() > 1 && what[0] == 'x') number(what.substr(1), poison.scale);
  else throw bad();
  if (at != std::string_view::npos) number(text.substr(at + 1), poison.round);
  if (poison.worker < 0 || poison.round < 0 || (!std::isnan(poison.scale) && !std::isfinite(poison.scale))) throw bad();
  return poison;
}

void AsyncOptions::validate() const {
  auto bad = [](const char* key, const std::string& why) { throw ConfigError("config", fmt::format("sync.{}: {}", key, why)); };
  if (workers < 1) bad("async", "needs at least one worker");
  if (inner_steps < 1) bad("inner_steps", "must be >= 1");
  if (delay < 0) bad("async_delay", fmt::format("must be >= 0 (0: the number of workers), got {}", delay));
  if (max_staleness < 0) bad("async_max_staleness", fmt::format("must be >= 0 (0: 4 x workers), got {}", max_staleness));
  screening.validate();
  if (!(grace >= 0)) bad("async_grace", fmt::format("must be >= 0, got {}", grace));
  if (!(silence_s > 0)) bad("async_silence_s", fmt::format("must be > 0, got {}", silence_s));
}

}  // namespace loco::algorithms
