// metrics.jsonl: one JSON object per line, each with an "event" field and a wall-clock "time"
// (seconds since the Unix epoch); the events and their fields are events.h's. Every line is
// flushed as it is written: a killed process loses at most the line in flight.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>

#include "loco/core/files.h"
#include "loco/metrics/events.h"
#include "loco/metrics/telemetry.h"

namespace loco::metrics {

class MetricsLog {
 public:
  MetricsLog() = default;  // discards events
  explicit MetricsLog(const std::filesystem::path& path);
  // Appends `event` with "event" (its kind) and "time" in front. Throws Error on I/O failure.
  void write(const Event& event);
  // Every event written from now on is also recorded there (nullptr: not); it must outlive this log.
  void tee(Telemetry* telemetry) { tee_ = telemetry; }

 private:
  LineAppender out_;
  Telemetry* tee_ = nullptr;
};

}  // namespace loco::metrics
