// MembershipTable's durable state (save, load: RUN/coordinator.json) and its description for
// GET /v1/state. The state machine itself is membership.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "loco/runtime/coordinator/membership.h"

namespace loco::runtime {

namespace {

nlohmann::json reports_json(const std::map<int64_t, data::SamplerPosition>& reports) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [id, p] : reports) out.push_back({id, p.epoch, p.cursor});
  return out;
}

nlohmann::json slots_json(const std::vector<protocol::SlotInfo>& slots) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : slots) out.push_back({s.owner, s.position.epoch, s.position.cursor});
  return out;
}

// Integers of the saved state: a float or an out-of-range number is malformed, not converted
// (nlohmann's own conversion of them is unchecked).
std::vector<int64_t> integers(const nlohmann::json& value) { return protocol::get_integers<int64_t>(value, "a saved list"); }

std::vector<protocol::SlotInfo> slots_from(const nlohmann::json& json) {
  std::vector<protocol::SlotInfo> out;
  for (const auto& s : json) {
    protocol::SlotInfo slot;
    slot.owner = protocol::saved_integer(s.at(0));
    slot.position = {protocol::saved_position(s.at(1)), protocol::saved_position(s.at(2))};
    out.push_back(slot);
  }
  return out;
}

}  // namespace

// Slot -> the member that read its shard in a round, as [{"slot", "member"}].
nlohmann::json MembershipTable::adopted_json(const std::map<int64_t, int64_t>& adopted) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [slot, member] : adopted) out.push_back({{"slot", slot}, {"member", member}});
  return out;
}

std::vector<metrics::SlotReader> MembershipTable::slot_readers(const std::map<int64_t, int64_t>& adopted) {
  std::vector<metrics::SlotReader> out;
  for (const auto& [slot, member] : adopted) out.push_back({slot, member});
  return out;
}

const char* MembershipTable::state_name(State state) {
  return state == State::kActive ? "active" : state == State::kJoining ? "joining" : "gone";
}

nlohmann::json MembershipTable::save() const {
  nlohmann::json members = nlohmann::json::array();
  for (const auto& [id, m] : members_) {
    members.push_back({{"id", id}, {"name", m.name}, {"slot", m.slot}, {"state", state_name(m.state)},
                       {"synced_step", m.synced_step}});
  }
  nlohmann::json out = {{"next_id", next_id_}, {"started", started_}, {"complete", complete_}, {"round", round_},
                        {"rounds_missed", rounds_missed_},
                        {"round_step", round_step_}, {"epoch", epoch_}, {"epoch_members", epoch_members_},
                        {"epoch_broken", epoch_broken_}, {"members", members}, {"slots", slots_json(slots_)}};
  if (last_hash_) out["last_hash"] = *last_hash_;
  if (convened_) {
    out["convened"] = {{"round", convened_->round}, {"epoch", convened_->epoch}, {"step", convened_->step},
                       {"contributors", convened_->contributors}, {"participants", convened_->participants},
                       {"slots", slots_json(convened_->slots)}, {"done", convened_->done},
                       {"adopted", adopted_json(convened_->adopted)}, {"issued", convened_->issued},
                       {"reports", reports_json(convened_->reports)}};
  }
  out["tasks"] = tasks_.save();
  return out;
}

void MembershipTable::load(const nlohmann::json& saved, Clock::time_point now) {
  // The saved table nests four levels; a deeper one would be copied recursively below.
  if (protocol::nested_deeper_than(saved, protocol::kMaxJsonDepth)) {
    throw std::invalid_argument(fmt::format("malformed: nested deeper than {} levels", protocol::kMaxJsonDepth));
  }
  try {
    members_.clear();
    for (const auto& j : saved.at("members")) {
      Member m;
      m.name = j.at("name").get<std::string>();
      m.slot = protocol::saved_integer(j.at("slot"));
      const auto state = j.at("state").get<std::string>();
      m.state = state == "active" ? State::kActive : state == "joining" ? State::kJoining : State::kGone;
      m.synced_step = m.step = protocol::saved_integer(j.at("synced_step"));
      m.last_seen = now;
      if (m.slot < 0 || m.slot >= static_cast<int64_t>(slots_.size())) throw std::out_of_range("a member's slot");
      members_.emplace(protocol::saved_integer(j.at("id")), std::move(m));
    }
    auto slots = slots_from(saved.at("slots"));
    if (slots.size() != slots_.size()) {
      throw std::invalid_argument(fmt::format("it has {} slots, the run {}", slots.size(), slots_.size()));
    }
    slots_ = std::move(slots);
    next_id_ = protocol::saved_integer(saved.at("next_id"));
    started_ = saved.at("started").get<bool>();
    complete_ = saved.at("complete").get<bool>();
    round_ = protocol::saved_integer(saved.at("round"));
    round_step_ = protocol::saved_integer(saved.at("round_step"));
    rounds_missed_ = saved.contains("rounds_missed") ? integers(saved.at("rounds_missed")) : std::vector<int64_t>(slots_.size(), 0);
    if (rounds_missed_.size() != slots_.size()) throw std::out_of_range("rounds_missed");
    epoch_ = protocol::saved_integer(saved.at("epoch"));
    epoch_members_ = integers(saved.at("epoch_members"));
    epoch_broken_ = saved.at("epoch_broken").get<bool>();
    tasks_.load(saved.at("tasks"));
    for (const auto& [id, m] : members_) {
      if (m.state != State::kGone) tasks_.renew(id, now + 2 * options_.dead_after);  // a fresh allowance, as for the members
    }
    last_hash_.reset();
    if (saved.contains("last_hash")) last_hash_ = protocol::saved_position(saved.at("last_hash"));
    convened_.reset();
    if (saved.contains("convened")) {
      const auto& c = saved.at("convened");
      Convened convened;
      convened.round = protocol::saved_integer(c.at("round"));
      convened.epoch = protocol::saved_integer(c.at("epoch"));
      convened.step = protocol::saved_integer(c.at("step"));
      convened.contributors = protocol::saved_integer(c.at("contributors"));
      convened.participants = integers(c.at("participants"));
      convened.slots = slots_from(c.at("slots"));
      convened.done = integers(c.at("done"));
      for (const auto& a : c.value("adopted", nlohmann::json::array())) {
        convened.adopted[protocol::saved_integer(a.at("slot"))] = protocol::saved_integer(a.at("member"));
      }
      convened.issued = integers(c.at("issued"));
      for (const auto& r : c.at("reports")) convened.reports[protocol::saved_integer(r.at(0))] = {protocol::saved_position(r.at(1)), protocol::saved_position(r.at(2))};
      // The members still in that round get their answer again when they ask.
      for (size_t r = 0; r < convened.participants.size(); ++r) {
        auto it = members_.find(convened.participants[r]);
        if (it == members_.end()) throw std::out_of_range("a participant of the round under way");
        if (it->second.state == State::kGone || convened.round != round_ + 1) continue;
        if (std::find(convened.done.begin(), convened.done.end(), it->first) != convened.done.end()) continue;
        it->second.go = go_reply(convened, r);
      }
      convened_ = std::move(convened);
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(fmt::format("malformed: {}", e.what()));
  } catch (const protocol::ProtocolError& e) {
    throw std::invalid_argument(fmt::format("malformed: {}", e.what()));
  } catch (const std::out_of_range& e) {
    throw std::invalid_argument(fmt::format("inconsistent: {} is out of range", e.what()));
  }
  last_expire_.reset();
}

nlohmann::json MembershipTable::describe() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [id, m] : members_) {
    list.push_back({{"member", id}, {"name", m.name}, {"slot", m.slot}, {"state", state_name(m.state)},
                    {"arrived", m.arrival ? m.arrival->round : -1}});
  }
  nlohmann::json slots = nlohmann::json::array();
  for (const auto& s : slots_) slots.push_back({{"owner", s.owner}, {"epoch", s.position.epoch}, {"cursor", s.position.cursor}});
  nlohmann::json state = {{"epoch", epoch_}, {"epoch_broken", epoch_broken_}, {"rounds_completed", round_},
                          {"complete", complete_}, {"members", list}, {"slots", slots}, {"rounds_missed", rounds_missed_}};
  const auto counts = tasks_.counts();
  const auto count = [&](TaskState st) { return counts.count(st) ? counts.at(st) : int64_t{0}; };
  state["tasks"] = {{to_string(TaskState::kOpen), count(TaskState::kOpen)},
                    {to_string(TaskState::kLeased), count(TaskState::kLeased)},
                    {"issued", tasks_.totals().issued}, {"reissued", tasks_.totals().reissued},
                    {"done", tasks_.totals().done}};
  if (convened_) {
    state["convened"] = {{"round", convened_->round}, {"epoch", convened_->epoch},
                         {"participants", convened_->participants}, {"done", convened_->done}};
  }
  return state;
}

}  // namespace loco::runtime
