// metrics.jsonl: one JSON object per line, each with an "event" field and a wall-clock "time"
// (seconds since the Unix epoch). Events written by the trainer (docs/configuration.md lists them):
//   train   {step, loss, lr, grad_norm, tokens, tokens_per_s}
//   eval    {step, val_loss, val_ppl}
//   summary {steps, tokens, val_loss, val_ppl, wall_s, ...}
// Every line is flushed as it is written: a killed process loses at most the line in flight.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>

#include "loco/core/files.h"
#include "loco/metrics/telemetry.h"

namespace loco::metrics {

class MetricsLog {
 public:
  MetricsLog() = default;  // discards events
  explicit MetricsLog(const std::filesystem::path& path);
  // `fields` must be an object; "event" and "time" are added in front. Throws Error on I/O failure.
  void write(const std::string& event, const nlohmann::json& fields);
  // Every event written from now on is also recorded there (nullptr: not); it must outlive this log.
  void tee(Telemetry* telemetry) { tee_ = telemetry; }

 private:
  LineAppender out_;
  Telemetry* tee_ = nullptr;
};

}  // namespace loco::metrics
