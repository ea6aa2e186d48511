// What a worker tells the coordinator's status page (runtime/status/dashboard.h) while it trains:
// every metrics.jsonl event, and what it is doing now. The training loop writes into it without
// I/O; the worker's sender thread takes what accumulated and posts it (runtime/worker/telemetry.h).
// A coordinator that cannot be reached costs the loop nothing: the oldest events are dropped once
// the buffer is full, and counted (the sender holds one batch in flight besides).
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string_view>
#include <vector>

namespace loco::metrics {

enum class Activity : int { kStarting, kTraining, kSyncing, kEvaluating, kCheckpointing, kFinished };
std::string_view to_string(Activity activity);

class Telemetry {
 public:
  explicit Telemetry(size_t capacity = 4096) : capacity_(capacity) {}

  // One metrics event, as written to metrics.jsonl ("event" and "time" included).
  void record(nlohmann::json event);
  void set_activity(Activity activity) { activity_.store(activity, std::memory_order_relaxed); }
  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  Activity activity() const { return activity_.load(std::memory_order_relaxed); }
  int64_t step() const { return step_.load(std::memory_order_relaxed); }

  struct Batch {
    std::vector<nlohmann::json> events;  // oldest first
    int64_t dropped = 0;                 // lost to a full buffer since the last batch
  };
  // The events recorded since the last call.
  Batch take();

 private:
  const size_t capacity_;
  std::mutex mutex_;
  std::deque<nlohmann::json> events_;
  int64_t dropped_ = 0;
  std::atomic<Activity> activity_{Activity::kStarting};
  std::atomic<int64_t> step_{0};
};

}  // namespace loco::metrics
