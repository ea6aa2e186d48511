#include "loco/metrics/metrics_log.h"

#include <chrono>

#include "loco/core/error.h"

namespace loco::metrics {

MetricsLog::MetricsLog(const std::filesystem::path& path) : out_(path, "metrics") {}

void MetricsLog::write(const std::string& event, const nlohmann::json& fields) {
  if (!out_.is_open() && tee_ == nullptr) return;
  LOCO_CHECK(fields.is_object(), "metrics fields must be a JSON object");
  nlohmann::ordered_json line;
  line["event"] = event;
  line["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const auto& [key, value] : fields.items()) line[key] = value;
  if (out_.is_open()) out_.append(line.dump());
  if (tee_ != nullptr) tee_->record(nlohmann::json(line));
}

void MetricsLog::write(const Event& event) {
  auto fields = to_json(event);
  fields.erase("event");
  write(kind_of(event), fields);
}

}  // namespace loco::metrics
