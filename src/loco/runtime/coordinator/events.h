// The wording of an elastic run's events (MembershipTable::take_events and the run's own) in the
// coordinator's log. metrics.jsonl keeps them as they are; this is what a person reads.
#pragma once

#include <string>

#include "loco/metrics/events.h"

namespace loco::runtime {

// One line for `event`; an event it has no wording for is shown as its kind and JSON.
std::string describe_event(const metrics::Event& event);

}  // namespace loco::runtime
