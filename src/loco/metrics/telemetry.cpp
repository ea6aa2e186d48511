#include "loco/metrics/telemetry.h"

namespace loco::metrics {

std::string_view to_string(Activity activity) {
  switch (activity) {
    case Activity::kStarting: return "starting";
    case Activity::kTraining: return "training";
    case Activity::kSyncing: return "syncing";
    case Activity::kEvaluating: return "evaluating";
    case Activity::kCheckpointing: return "checkpointing";
    case Activity::kFinished: return "finished";
  }
  return "unknown";
}

void Telemetry::record(nlohmann::json event) {
  std::lock_guard lock(mutex_);
  if (events_.size() >= capacity_) {
    events_.pop_front();
    ++dropped_;
  }
  events_.push_back(std::move(event));
}

Telemetry::Batch Telemetry::take() {
  std::lock_guard lock(mutex_);
  Batch batch;
  batch.events.assign(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  batch.dropped = std::exchange(dropped_, 0);
  return batch;
}

}  // namespace loco::metrics
