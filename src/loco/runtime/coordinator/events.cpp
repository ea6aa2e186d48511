#include "loco/runtime/coordinator/events.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

namespace loco::runtime {

std::string describe_event(const std::string& name, const nlohmann::json& e) {
  if (name == "join") {
    return fmt::format("{} joined as member {} (slot {}){}", e["name"].get<std::string>(), e["member"].get<int64_t>(),
                       e["slot"].get<int64_t>(), e["joiner"].get<bool>() ? ", to receive the state at the next round" : "");
  }
  if (name == "joined") return fmt::format("member {} took part in round {}: it now trains slot {}", e["member"].get<int64_t>(), e["round"].get<int64_t>(), e["slot"].get<int64_t>());
  if (name == "failure") {
    return fmt::format("member {} ({}) failed: {}", e["member"].get<int64_t>(), e["name"].get<std::string>(), e["how"].get<std::string>());
  }
  if (name == "collective_failed") {
    return fmt::format("member {} reports that round {}'s collective failed in epoch {}: the round is convened again "
                       "with the members still alive", e["reported_by"].get<int64_t>(), e["round"].get<int64_t>(),
                       e["epoch"].get<int64_t>());
  }
  if (name == "round_retried") {
    return fmt::format("round {} is tried again in epoch {} with {} workers (its collective in epoch {} failed)",
                       e["round"].get<int64_t>(), e["epoch"].get<int64_t>(), e["participants"].get<size_t>(),
                       e["failed_epoch"].get<int64_t>());
  }
  if (name == "left_out") {
    return fmt::format("round {} goes on without member(s) {}: still training {:.1f} s after the first arrival "
                       "(sync.round_grace_s); they rejoin", e["round"].get<int64_t>(),
                       fmt::join(e["members"].get<std::vector<int64_t>>(), ", "), e["waited_s"].get<double>());
  }
  if (name == "restored_from_checkpoint") {
    return fmt::format("member(s) {} continue from the global checkpoint (round {})",
                       fmt::join(e["members"].get<std::vector<int64_t>>(), ", "), e["round"].get<int64_t>());
  }
  if (name == "leave") return fmt::format("member {} left: {}", e["member"].get<int64_t>(), e["status"].get<std::string>());
  if (name == "rejoin") {
    return fmt::format("member {} must rejoin: {}", e["member"].get<int64_t>(), e["reason"].get<std::string>());
  }
  if (name == "membership") {
    std::vector<std::string> who;
    for (const auto& m : e["members"]) {
      who.push_back(fmt::format("{}{}", m["member"].get<int64_t>(), m["joining"].get<bool>() ? " (joining)" : ""));
    }
    return fmt::format("epoch {} for round {}: members {}", e["epoch"].get<int64_t>(), e["round"].get<int64_t>(), fmt::join(who, ", "));
  }
  if (name == "round_complete") {
    return fmt::format("round {} complete at step {} with {} of {} workers{}", e["round"].get<int64_t>(), e["step"].get<int64_t>(),
                       e["contributors"].get<int64_t>(), e["slots"].get<int64_t>(),
                       e.contains("recovery_s") ? fmt::format(" (recovered {:.1f} s after the failure)", e["recovery_s"].get<double>()) : "");
  }
  return name + " " + e.dump();
}

}  // namespace loco::runtime
