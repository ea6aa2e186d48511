#include "loco/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "loco/core/error.h"

namespace loco::optim {

void ScheduleOptions::validate() const {
  if (!(lr > 0)) throw ConfigError("optim", fmt::format("lr must be > 0, got {}", lr));
  if (warmup_steps < 0) throw ConfigError("optim", fmt::format("warmup_steps must be >= 0, got {}", warmup_steps));
  if (total_steps < 1) throw ConfigError("optim", fmt::format("total steps must be >= 1, got {}", total_steps));
  if (min_lr_ratio < 0 || min_lr_ratio > 1) {
    throw ConfigError("optim", fmt::format("min_lr_ratio must be in [0, 1], got {}", min_lr_ratio));
  }
}

double learning_rate(const ScheduleOptions& o, int64_t step) {
  if (step < o.warmup_steps) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  const int64_t decay_steps = std::max<int64_t>(1, o.total_steps - o.warmup_steps);
  const double progress = std::clamp(static_cast<double>(step - o.warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  const double cosine = 0.5 * (1 + std::cos(std::numbers::pi * progress));
  return o.lr * (o.min_lr_ratio + (1 - o.min_lr_ratio) * cosine);
}

double rewarmup_factor(int64_t steps_since_join, int64_t rewarmup_steps) {
  if (rewarmup_steps <= 0) return 1.0;
  return std::min(1.0, static_cast<double>(std::max<int64_t>(0, steps_since_join) + 1) / static_cast<double>(rewarmup_steps));
}

}  // namespace loco::optim
