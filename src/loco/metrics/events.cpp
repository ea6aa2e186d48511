#include "loco/metrics/events.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "loco/core/error.h"
#include "loco/core/hash.h"

namespace loco::metrics {
namespace {

using nlohmann::json;

// Tolerant readers: a missing or mistyped field reads as `otherwise`.
double number(const json& j, const char* key, double otherwise) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : otherwise;
}
int64_t integer(const json& j, const char* key, int64_t otherwise = 0) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return otherwise;
  const double value = it->get<double>();
  return std::isfinite(value) && std::abs(value) < 9.2e18 ? it->get<int64_t>() : otherwise;
}
std::string text(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
bool flag(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}
std::map<std::string, int64_t> byte_map(const json& j, const char* key) {
  std::map<std::string, int64_t> out;
  const auto it = j.find(key);
  if (it == j.end() || !it->is_object()) return out;
  for (const auto& [name, value] : it->items()) {
    if (value.is_number()) out[name] = value.get<int64_t>();
  }
  return out;
}
std::vector<int64_t> integers(const json& j, const char* key) {
  std::vector<int64_t> out;
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return out;
  for (const auto& value : *it) {
    if (value.is_number_integer()) out.push_back(value.get<int64_t>());
  }
  return out;
}
// The objects of array `key` (others skipped).
std::vector<json> objects(const json& j, const char* key) {
  std::vector<json> out;
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return out;
  for (const auto& value : *it) {
    if (value.is_object()) out.push_back(value);
  }
  return out;
}
json readers_json(const std::vector<SlotReader>& readers) {
  json out = json::array();
  for (const auto& r : readers) out.push_back({{"slot", r.slot}, {"member", r.member}});
  return out;
}
std::vector<SlotReader> readers_from(const json& j) {
  std::vector<SlotReader> out;
  for (const auto& r : objects(j, "adopted")) out.push_back({integer(r, "slot"), integer(r, "member")});
  return out;
}
// NaN as null, as the wire has it.
json maybe(double value) { return std::isnan(value) ? json(nullptr) : json(value); }

WorkerId worker_from(const json& j) {
  WorkerId id;
  const auto it = j.find("worker");
  if (it == j.end()) return id;
  if (it->is_number_integer()) id.rank = it->get<int64_t>();
  if (it->is_string()) id.name = it->get<std::string>();
  return id;
}
json worker_json(const WorkerId& id) {
  if (!id.name.empty()) return id.name;
  if (id.rank >= 0) return id.rank;
  return nullptr;
}

// Each event's fields, "worker" included, without "event".
json fields(const StartEvent& e) {
  return {{"worker", worker_json(e.worker)}, {"world_size", e.world_size}, {"step", e.step}, {"parameters", e.parameters},
          {"device", e.device}, {"threads", e.threads}, {"sync", e.sync}};
}
json fields(const TrainEvent& e) {
  return {{"worker", worker_json(e.worker)}, {"step", e.step}, {"loss", maybe(e.loss)}, {"lr", e.lr},
          {"grad_norm", maybe(e.grad_norm)}, {"tokens", e.tokens}, {"tokens_per_s", e.tokens_per_s},
          {"bytes_sent", e.bytes_sent}, {"utilization", e.utilization}, {"wall_s", e.wall_s}};
}
json fields(const SyncEvent& e) {
  json j = {{"round", e.round}, {"step", e.step}, {"worker", worker_json(e.worker)}, {"world_size", e.world_size},
            {"bytes_sent", e.bytes_sent}, {"bytes_received", e.bytes_received}, {"seconds", e.seconds},
            {"stall_s", e.stall_s}, {"params_hash", e.params_hash}};
  if (e.fragment >= 0) j["fragment"] = e.fragment;
  if (!e.route.empty()) j["route"] = e.route;
  if (e.attempts > 1) j["attempts"] = e.attempts;
  if (e.weight >= 0) j["weight"] = e.weight;
  if (e.tokens >= 0) j["tokens"] = e.tokens;
  if (e.round_trip_s > 0) j["round_trip_s"] = e.round_trip_s;
  if (e.rejected > 0) j["rejected"] = e.rejected;
  if (!e.screening.empty()) j["screening"] = e.screening;
  if (e.staleness >= 0) j["staleness"] = e.staleness;
  if (e.epoch >= 0) j["epoch"] = e.epoch;
  return j;
}
json fields(const EvalEvent& e) {
  return {{"worker", worker_json(e.worker)}, {"step", e.step}, {"val_loss", maybe(e.val_loss)}, {"val_ppl", maybe(e.val_ppl)},
          {"tokens", e.tokens}};
}
json fields(const SummaryEvent& e) {
  json j = summary_json(e.summary);
  j.update({{"worker", worker_json(e.worker)}, {"world_size", e.world_size}, {"sync", e.sync}});
  return j;
}
json fields(const PathTaskEvent& e) {
  return {{"worker", worker_json(e.worker)}, {"path", e.path}, {"phase", e.phase}, {"steps", e.steps}, {"loss", maybe(e.loss)},
          {"tokens", e.tokens}, {"compute_s", e.compute_s}, {"bytes_read", e.bytes_read}, {"bytes_written", e.bytes_written},
          {"module_bytes_read", e.module_bytes_read}, {"module_bytes_written", e.module_bytes_written}};
}
json fields(const StepTaskEvent& e) {
  json j = {{"worker", worker_json(e.worker)}, {"module", e.module}, {"version", e.version}, {"paths", e.paths},
            {"bytes_read", e.bytes_read}, {"bytes_written", e.bytes_written}};
  if (e.rejected > 0) j["rejected"] = e.rejected;
  if (!e.screening.empty()) j["screening"] = e.screening;
  return j;
}
json fields(const RouteTaskEvent& e) {
  return {{"worker", worker_json(e.worker)}, {"phase", e.phase}, {"router_documents", e.router_documents},
          {"documents_per_path", e.documents_per_path}};
}
json fields(const WorkerSummaryEvent& e) {
  return {{"worker", worker_json(e.worker)}, {"path_tasks", e.path_tasks}, {"step_tasks", e.step_tasks},
          {"lost_tasks", e.lost_tasks}, {"inner_steps", e.inner_steps}, {"tokens", e.tokens},
          {"bytes_read", e.bytes_read}, {"bytes_written", e.bytes_written}, {"wall_s", e.wall_s}, {"busy_s", e.busy_s},
          {"peak_rss_bytes", e.peak_rss_bytes}, {"interrupted", e.interrupted}};
}
json fields(const JoinedEvent& e) { return {{"worker", worker_json(e.worker)}, {"step", e.step}}; }
json fields(const ShardsEvent& e) { return {{"worker", worker_json(e.worker)}, {"step", e.step}, {"adopted", e.adopted}}; }
json fields(const CheckpointEvent& e) { return {{"worker", worker_json(e.worker)}, {"step", e.step}, {"path", e.path}}; }
json fields(const PeerFailureEvent& e) {
  return {{"worker", worker_json(e.worker)}, {"step", e.step}, {"error", e.error}, {"run_stopping", e.run_stopping}};
}
json fields(const MemberJoinEvent& e) {
  return {{"member", e.member}, {"name", e.name}, {"slot", e.slot}, {"joiner", e.joiner}};
}
json fields(const SlotTakenEvent& e) {
  return {{"member", e.member}, {"name", e.name}, {"slot", e.slot}, {"round", e.round}};
}
json fields(const MemberFailureEvent& e) {
  return {{"member", e.member}, {"name", e.name}, {"slot", e.slot}, {"how", e.how}, {"noticed_after_s", e.noticed_after_s},
          {"was_training", e.was_training}, {"discarded_steps", e.discarded_steps}};
}
json fields(const MemberLeaveEvent& e) {
  return {{"member", e.member}, {"name", e.name}, {"slot", e.slot}, {"status", e.status}};
}
json fields(const RejoinEvent& e) {
  return {{"member", e.member}, {"name", e.name}, {"slot", e.slot}, {"round", e.round}, {"reason", e.reason},
          {"discarded_steps", e.discarded_steps}};
}
json fields(const CollectiveFailedEvent& e) {
  json out = {{"reported_by", e.reported_by}, {"name", e.name}, {"epoch", e.epoch}, {"round", e.round}};
  if (!e.error.empty()) out["error"] = e.error;
  return out;
}
json fields(const LeftOutEvent& e) { return {{"round", e.round}, {"members", e.members}, {"waited_s", e.waited_s}}; }
json fields(const MembershipEvent& e) {
  json members = json::array();
  for (const auto& m : e.members) {
    members.push_back({{"rank", m.rank}, {"member", m.member}, {"name", m.name}, {"slot", m.slot}, {"joining", m.joining}});
  }
  return {{"epoch", e.epoch}, {"round", e.round}, {"members", members}, {"contributors", e.contributors},
          {"joiners", e.joiners}, {"adopted", readers_json(e.adopted)}};
}
json fields(const RoundRetriedEvent& e) {
  return {{"round", e.round}, {"epoch", e.epoch}, {"failed_epoch", e.failed_epoch}, {"participants", e.participants}};
}
json fields(const RoundCompleteEvent& e) {
  json j = {{"round", e.round}, {"epoch", e.epoch}, {"step", e.step}, {"participants", e.participants},
            {"contributors", e.contributors}, {"slots", e.slots}, {"short_handed", e.short_handed},
            {"idle_slots", e.idle_slots}, {"adopted", readers_json(e.adopted)}, {"params_hash", e.params_hash}};
  if (e.recovery_s >= 0) j["recovery_s"] = e.recovery_s;
  return j;
}
json fields(const RestoredFromCheckpointEvent& e) {
  return {{"round", e.round}, {"step", e.step >= 0 ? json(e.step) : json(nullptr)}, {"members", e.members},
          {"undone", e.undone}, {"epoch", e.epoch}};
}
json fields(const CoordinatorRestoredEvent& e) {
  return {{"epoch", e.epoch}, {"round", e.round}, {"live_members", e.live_members}};
}
json fields(const RunResumedEvent& e) {
  return {{"step", e.step}, {"round", e.round}, {"slots_without_inner_state", e.slots_without_inner_state}};
}
json fields(const SlotsSummaryEvent& e) { return {{"rounds", e.rounds}, {"rounds_missed", e.rounds_missed}}; }
json fields(const OtherEvent& e) {
  json j = e.fields.is_object() ? e.fields : json::object();
  if (e.worker.known()) j["worker"] = worker_json(e.worker);
  return j;
}

// The membership events: a worker's, then its coordinator's. nullopt for another kind.
std::optional<Event> parse_membership(const std::string& kind, const json& j, const WorkerId& worker) {
  if (kind == "joined" && !j.contains("member")) return JoinedEvent{worker, integer(j, "step")};
  if (kind == "shards") return ShardsEvent{worker, integer(j, "step"), integers(j, "adopted")};
  if (kind == "checkpoint") return CheckpointEvent{worker, integer(j, "step"), text(j, "path")};
  if (kind == "peer_failure") return PeerFailureEvent{worker, integer(j, "step"), text(j, "error"), flag(j, "run_stopping")};
  if (kind == "join") {
    return MemberJoinEvent{worker, integer(j, "member"), text(j, "name"), integer(j, "slot"), flag(j, "joiner")};
  }
  // "joined" with a member: as loco wrote the coordinator's slot_taken before it had a name of its own.
  if (kind == "slot_taken" || kind == "joined") {
    return SlotTakenEvent{worker, integer(j, "member"), text(j, "name"), integer(j, "slot"), integer(j, "round")};
  }
  if (kind == "failure") {
    return MemberFailureEvent{worker, integer(j, "member"), text(j, "name"), integer(j, "slot"), text(j, "how"),
                              number(j, "noticed_after_s", 0), flag(j, "was_training"), integer(j, "discarded_steps")};
  }
  if (kind == "leave") return MemberLeaveEvent{worker, integer(j, "member"), text(j, "name"), integer(j, "slot"), text(j, "status")};
  if (kind == "rejoin") {
    return RejoinEvent{worker, integer(j, "member"), text(j, "name"), integer(j, "slot"), integer(j, "round"),
                       text(j, "reason"), integer(j, "discarded_steps")};
  }
  if (kind == "collective_failed") {
    return CollectiveFailedEvent{worker, integer(j, "reported_by"), text(j, "name"), integer(j, "epoch"), integer(j, "round"),
                                 text(j, "error")};
  }
  if (kind == "left_out") return LeftOutEvent{worker, integer(j, "round"), integers(j, "members"), number(j, "waited_s", 0)};
  if (kind == "membership") {
    MembershipEvent e{worker, integer(j, "epoch"), integer(j, "round"), {}, integer(j, "contributors"),
                      integer(j, "joiners"), readers_from(j)};
    for (const auto& m : objects(j, "members")) {
      e.members.push_back({integer(m, "rank"), integer(m, "member"), text(m, "name"), integer(m, "slot"), flag(m, "joining")});
    }
    return e;
  }
  if (kind == "round_retried") {
    return RoundRetriedEvent{worker, integer(j, "round"), integer(j, "epoch"), integer(j, "failed_epoch"),
                             integer(j, "participants")};
  }
  if (kind == "round_complete") {
    return RoundCompleteEvent{worker, integer(j, "round"), integer(j, "epoch"), integer(j, "step"),
                              integer(j, "participants"), integer(j, "contributors"), integer(j, "slots"),
                              flag(j, "short_handed"), integers(j, "idle_slots"), readers_from(j),
                              text(j, "params_hash"), number(j, "recovery_s", -1)};
  }
  if (kind == "restored_from_checkpoint") {
    return RestoredFromCheckpointEvent{worker, integer(j, "round"), integer(j, "step", -1), integers(j, "members"),
                                       integer(j, "undone", 0), integer(j, "epoch", 0)};
  }
  if (kind == "coordinator_restored") {
    return CoordinatorRestoredEvent{worker, integer(j, "epoch"), integer(j, "round"), integer(j, "live_members")};
  }
  if (kind == "run_resumed") {
    return RunResumedEvent{worker, integer(j, "step"), integer(j, "round"), integers(j, "slots_without_inner_state")};
  }
  if (kind == "slots_summary") return SlotsSummaryEvent{worker, integer(j, "rounds"), integers(j, "rounds_missed")};
  return std::nullopt;
}

Event parse(const std::string& kind, const json& j) {
  const auto worker = worker_from(j);
  if (auto membership = parse_membership(kind, j, worker)) return std::move(*membership);
  if (kind == "start" || kind == "resume") {
    return StartEvent{worker, kind == "resume", integer(j, "world_size", 1), integer(j, "step"), integer(j, "parameters"),
                      text(j, "device"), text(j, "sync"), integer(j, "threads", 1)};
  }
  if (kind == "train") {
    return TrainEvent{worker, integer(j, "step"), number(j, "loss", NAN), number(j, "lr", 0), number(j, "grad_norm", NAN),
                      integer(j, "tokens"), number(j, "tokens_per_s", 0), integer(j, "bytes_sent"),
                      number(j, "utilization", NAN), number(j, "wall_s", 0)};
  }
  if (kind == "sync") {
    return SyncEvent{worker, integer(j, "round"), integer(j, "step"), integer(j, "world_size", 1), integer(j, "bytes_sent"),
                     integer(j, "bytes_received"), number(j, "seconds", 0), number(j, "stall_s", NAN),
                     text(j, "params_hash"), integer(j, "fragment", -1), text(j, "route"), integer(j, "attempts", 1),
                     number(j, "weight", -1), integer(j, "tokens", -1), number(j, "round_trip_s", 0),
                     integer(j, "rejected", 0), text(j, "screening"),
                     integer(j, "staleness", -1), integer(j, "epoch", -1)};
  }
  if (kind == "eval") {
    return EvalEvent{worker, integer(j, "step"), number(j, "val_loss", NAN), number(j, "val_ppl", NAN), integer(j, "tokens")};
  }
  if (kind == "summary") {
    auto summary = summary_from_json(j);
    if (summary) return SummaryEvent{worker, integer(j, "world_size", 1), text(j, "sync"), *summary};
  }
  if (kind == "path_task") {
    return PathTaskEvent{worker, integer(j, "path"), integer(j, "phase"), integer(j, "steps"), number(j, "loss", NAN),
                         integer(j, "tokens"), number(j, "compute_s", 0), integer(j, "bytes_read"),
                         integer(j, "bytes_written"), byte_map(j, "module_bytes_read"), byte_map(j, "module_bytes_written")};
  }
  if (kind == "step_task") {
    return StepTaskEvent{worker, text(j, "module"), integer(j, "version", -1), integer(j, "paths"), integer(j, "bytes_read"),
                         integer(j, "bytes_written"), integer(j, "rejected", 0), text(j, "screening")};
  }
  if (kind == "route_task") {
    return RouteTaskEvent{worker, integer(j, "phase", -1), integer(j, "router_documents"), text(j, "documents_per_path")};
  }
  if (kind == "worker_summary") {
    return WorkerSummaryEvent{worker, integer(j, "path_tasks"), integer(j, "step_tasks"), integer(j, "lost_tasks"),
                              integer(j, "inner_steps"), integer(j, "tokens"), integer(j, "bytes_read"),
                              integer(j, "bytes_written"), number(j, "wall_s", 0), number(j, "busy_s", 0),
                              integer(j, "peak_rss_bytes"), flag(j, "interrupted")};
  }
  OtherEvent other{kind, worker, j};
  other.fields.erase("event");
  other.fields.erase("time");
  other.fields.erase("worker");
  return other;
}

}  // namespace

std::string WorkerId::label() const {
  if (!name.empty()) return name;
  return rank >= 0 ? std::to_string(rank) : std::string();
}

nlohmann::json summary_json(const TrainSummary& s) {
  return {{"steps", s.steps},
          {"tokens", s.tokens},
          {"val_loss", maybe(s.val_loss)},
          {"val_ppl", maybe(s.val_ppl)},
          {"val_unigram_entropy", s.val_unigram_entropy},
          {"wall_s", s.wall_s},
          {"interrupted", s.interrupted},
          {"rounds", s.rounds},
          {"bytes_sent", s.bytes_sent},
          {"bytes_received", s.bytes_received},
          {"sync_s", s.sync_s},
          {"stall_s", s.stall_s},
          {"peak_step_bytes", s.peak_step_bytes},
          {"compute_utilization", s.compute_utilization},
          {"compute_s", s.compute_s},
          {"end_to_end_utilization", s.end_to_end_utilization},
          {"global_hash", hex64(s.global_hash)}};
}

std::optional<TrainSummary> summary_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("steps")) return std::nullopt;
  TrainSummary s;
  s.steps = integer(j, "steps");
  s.tokens = integer(j, "tokens");
  s.val_loss = number(j, "val_loss", NAN);
  s.val_ppl = number(j, "val_ppl", NAN);
  s.val_unigram_entropy = number(j, "val_unigram_entropy", NAN);
  s.wall_s = number(j, "wall_s", 0);
  s.interrupted = flag(j, "interrupted");
  s.rounds = integer(j, "rounds");
  s.bytes_sent = integer(j, "bytes_sent");
  s.bytes_received = integer(j, "bytes_received");
  s.sync_s = number(j, "sync_s", 0);
  s.stall_s = number(j, "stall_s", 0);
  s.peak_step_bytes = integer(j, "peak_step_bytes");
  s.compute_utilization = number(j, "compute_utilization", 0);
  s.compute_s = number(j, "compute_s", 0);
  s.end_to_end_utilization = number(j, "end_to_end_utilization", 0);
  s.global_hash = std::strtoull(text(j, "global_hash").c_str(), nullptr, 16);
  return s;
}

std::string kind_of(const Event& event) {
  struct Kind {
    std::string operator()(const StartEvent& e) const { return e.resumed ? "resume" : "start"; }
    std::string operator()(const TrainEvent&) const { return "train"; }
    std::string operator()(const SyncEvent&) const { return "sync"; }
    std::string operator()(const EvalEvent&) const { return "eval"; }
    std::string operator()(const SummaryEvent&) const { return "summary"; }
    std::string operator()(const PathTaskEvent&) const { return "path_task"; }
    std::string operator()(const StepTaskEvent&) const { return "step_task"; }
    std::string operator()(const RouteTaskEvent&) const { return "route_task"; }
    std::string operator()(const WorkerSummaryEvent&) const { return "worker_summary"; }
    std::string operator()(const JoinedEvent&) const { return "joined"; }
    std::string operator()(const ShardsEvent&) const { return "shards"; }
    std::string operator()(const CheckpointEvent&) const { return "checkpoint"; }
    std::string operator()(const PeerFailureEvent&) const { return "peer_failure"; }
    std::string operator()(const MemberJoinEvent&) const { return "join"; }
    std::string operator()(const SlotTakenEvent&) const { return "slot_taken"; }
    std::string operator()(const MemberFailureEvent&) const { return "failure"; }
    std::string operator()(const MemberLeaveEvent&) const { return "leave"; }
    std::string operator()(const RejoinEvent&) const { return "rejoin"; }
    std::string operator()(const CollectiveFailedEvent&) const { return "collective_failed"; }
    std::string operator()(const LeftOutEvent&) const { return "left_out"; }
    std::string operator()(const MembershipEvent&) const { return "membership"; }
    std::string operator()(const RoundRetriedEvent&) const { return "round_retried"; }
    std::string operator()(const RoundCompleteEvent&) const { return "round_complete"; }
    std::string operator()(const RestoredFromCheckpointEvent&) const { return "restored_from_checkpoint"; }
    std::string operator()(const CoordinatorRestoredEvent&) const { return "coordinator_restored"; }
    std::string operator()(const RunResumedEvent&) const { return "run_resumed"; }
    std::string operator()(const SlotsSummaryEvent&) const { return "slots_summary"; }
    std::string operator()(const OtherEvent& e) const { return e.kind; }
  };
  return std::visit(Kind{}, event);
}

const WorkerId& worker_of(const Event& event) {
  return std::visit([](const auto& e) -> const WorkerId& { return e.worker; }, event);
}

nlohmann::json to_json(const Event& event) {
  json j = std::visit([](const auto& e) { return fields(e); }, event);
  j["event"] = kind_of(event);
  return j;
}

std::optional<TimedEvent> parse_event(const nlohmann::json& j) {
  if (!j.is_object()) return std::nullopt;
  const auto kind = j.find("event");
  if (kind == j.end() || !kind->is_string()) return std::nullopt;
  return TimedEvent{number(j, "time", NAN), parse(kind->get<std::string>(), j)};
}

namespace {

// Appends the events of the complete lines of `chunk` to `out`; returns the bytes consumed.
size_t parse_lines(const std::string& chunk, std::vector<TimedEvent>& out) {
  size_t start = 0;
  for (size_t end; (end = chunk.find('\n', start)) != std::string::npos; start = end + 1) {
    const auto parsed = json::parse(chunk.begin() + static_cast<std::ptrdiff_t>(start),
                                    chunk.begin() + static_cast<std::ptrdiff_t>(end), nullptr, /*allow_exceptions=*/false);
    if (auto event = parse_event(parsed)) out.push_back(std::move(*event));  // a line cut short is skipped
  }
  return start;
}

}  // namespace

std::vector<TimedEvent> read_events(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataError("metrics", fmt::format("{}: cannot read it", file.string()));
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!all.empty() && all.back() != '\n') all += '\n';  // a last line without its newline still counts
  std::vector<TimedEvent> out;
  parse_lines(all, out);
  return out;
}

std::vector<TimedEvent> EventTail::read_new() {
  std::vector<TimedEvent> out;
  std::ifstream in(file_, std::ios::binary);
  if (!in) return out;
  in.seekg(static_cast<std::streamoff>(offset_));
  const std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  offset_ += parse_lines(chunk, out);
  return out;
}

}  // namespace loco::metrics
