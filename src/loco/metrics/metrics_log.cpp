#include "loco/metrics/metrics_log.h"

#include <chrono>


namespace loco::metrics {

MetricsLog::MetricsLog(const std::filesystem::path& path) : out_(path, "metrics") {}

void MetricsLog::write(const Event& event) {
  if (!out_.is_open() && tee_ == nullptr) return;
  nlohmann::ordered_json line;
  line["event"] = kind_of(event);
  line["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const auto fields = to_json(event);  // named: items() does not keep a temporary alive
  for (const auto& [key, value] : fields.items()) {
    if (key != "event") line[key] = value;
  }
  if (out_.is_open()) out_.append(line.dump());
  if (tee_ != nullptr) tee_->record(nlohmann::json(line));
}

}  // namespace loco::metrics
