// Learning-rate schedule: linear warmup, then cosine decay to min_lr_ratio * lr (the DiLoCo
// papers' inner schedule; docs/diloco.md).
#pragma once

#include <cstdint>

namespace loco::optim {

struct ScheduleOptions {
  double lr = 1e-3;           // peak learning rate
  int64_t warmup_steps = 100;
  int64_t total_steps = 1000; // decay ends here; later steps stay at the minimum
  double min_lr_ratio = 0.1;
  void validate() const;      // throws ConfigError
};

// Learning rate for 0-based step `step`: lr * (step + 1) / warmup during warmup, then cosine.
double learning_rate(const ScheduleOptions& options, int64_t step);

// A worker that joins a run under way with AdamW moments at zero would take its first steps at the
// schedule's current, possibly peak, rate; it re-warms instead: its learning rate is the
// schedule's times this factor, (steps_since_join + 1) / rewarmup_steps up to 1 (1 when
// rewarmup_steps is 0).
double rewarmup_factor(int64_t steps_since_join, int64_t rewarmup_steps);

}  // namespace loco::optim
