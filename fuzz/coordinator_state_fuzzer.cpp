// The coordinator's state file, RUN/coordinator.json, as a restarted coordinator reads it back
// (ElasticRun::restore_live_state in runtime/coordinator/elastic_run.cpp; this harness makes the same
// calls): JSON, the run's phase, MembershipTable::load of "table", "run_id" and "stopping". The
// failures restore_live_state turns into a DataError naming the file are nlohmann's exceptions,
// ProtocolError and std::invalid_argument, which MembershipTable::load documents; anything else
// would escape it, and is a finding. A table that loads must save and load again unchanged.
#include <nlohmann/json.hpp>

#include <stdexcept>

#include "fuzz.h"
#include "loco/runtime/coordinator/membership.h"

namespace {

using loco::fuzz::finding;
using loco::runtime::MembershipOptions;
using loco::runtime::MembershipTable;

constexpr int64_t kSlots = 3;  // the seeds' run; a file of another size is refused, as it should be

MembershipOptions options() {
  MembershipOptions o;
  o.slots = kSlots;
  o.min_workers = 1;
  o.total_steps = 1000;
  o.inner_steps = 10;
  return o;
}

// Returns whether the table loaded; throws what restore_live_state would see.
bool restore(const nlohmann::json& saved, MembershipTable& table, MembershipTable::Clock::time_point now) {
  const auto was = loco::runtime::protocol::parse_phase(saved.at("phase").get<std::string>());
  (void)was;
  table.load(saved.at("table"), now);
  (void)saved.at("run_id").get<std::string>();
  (void)saved.at("stopping").get<bool>();
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto now = MembershipTable::Clock::now();
  MembershipTable table(options());
  bool loaded = false;
  try {
    const auto saved = nlohmann::json::parse(data, data + size);
    loaded = restore(saved, table, now);
  } catch (const nlohmann::json::exception&) {
  } catch (const loco::runtime::protocol::ProtocolError&) {
  } catch (const std::invalid_argument&) {
  } catch (const std::exception& e) {
    finding(std::string("restoring the state file raised ") + typeid(e).name() + ": " + e.what());
  }
  if (!loaded) return 0;

  const nlohmann::json saved = table.save();
  MembershipTable again(options());
  try {
    again.load(saved, now);
  } catch (const std::exception& e) {
    finding(std::string("a loaded table's own save() is refused: ") + e.what() + "\n" + saved.dump());
  }
  if (again.save() != saved) finding("MembershipTable save/load is not a round trip: " + saved.dump());
  (void)table.describe();  // GET /v1/state of the restored table
  return 0;
}
