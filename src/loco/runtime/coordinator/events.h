// The wording of an elastic run's events (MembershipTable::take_events) in the coordinator's log.
// metrics.jsonl keeps them as they are; this is what a person reads.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace loco::runtime {

// One line for event `name` with fields `e` ("join", "failure", "membership", "round_complete"...);
// an event it has no wording for is shown as its name and JSON.
std::string describe_event(const std::string& name, const nlohmann::json& e);

}  // namespace loco::runtime
