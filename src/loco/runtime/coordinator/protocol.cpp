#include "loco/runtime/coordinator/protocol.h"

#include <fmt/ranges.h>

#include <array>
#include <cmath>

#include "loco/core/hash.h"

namespace loco::runtime::protocol {
namespace {

// No run has more slots than this: a longer list in a request is hostile or corrupt.
constexpr size_t kMaxSlots = 65536;

template <class T>
constexpr bool kIsInteger = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// Typed access to a field of a JSON object from the network. Integers, alone or in a list, go
// through get_integer: nlohmann's own conversion of a float or negative number is unchecked.
template <class T>
T field(const nlohmann::json& json, const char* name) {
  if (!json.is_object()) throw ProtocolError("the request body is not a JSON object");
  auto it = json.find(name);
  if (it == json.end()) throw ProtocolError(fmt::format("field '{}' is missing", name));
  const std::string what = fmt::format("field '{}'", name);
  if constexpr (kIsInteger<T>) {
    return get_integer<T>(*it, what);
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    return get_integers<int64_t>(*it, what);
  } else {
    if constexpr (std::is_same_v<T, nlohmann::json>) {
      if (nested_deeper_than(*it, kMaxJsonDepth)) {
        throw ProtocolError(fmt::format("field '{}' nests deeper than {} levels", name, kMaxJsonDepth));
      }
    }
    try {
      return it->get<T>();
    } catch (const nlohmann::json::exception&) {
      throw ProtocolError(fmt::format("field '{}' has the wrong type", name));
    }
  }
}

template <class T>
T field_or(const nlohmann::json& json, const char* name, T fallback) {
  if (!json.is_object() || !json.contains(name) || json.at(name).is_null()) return fallback;
  return field<T>(json, name);
}

uint64_t hex_field(const nlohmann::json& json, const char* name) {
  const auto text = field<std::string>(json, name);
  try {
    return parse_hex64(text, "protocol", name);
  } catch (const DataError&) {
    throw ProtocolError(fmt::format("field '{}' is not a 16-digit hex number", name));
  }
}

void check_length(const std::string& value, size_t limit, const char* name) {
  if (value.size() > limit) throw ProtocolError(fmt::format("field '{}' is longer than {} bytes", name, limit));
}

// One wire name per value, in the enum's order.
template <class E, size_t N>
E parse_name(const std::array<std::string_view, N>& names, std::string_view text, const char* name) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == text) return static_cast<E>(i);
  }
  throw ProtocolError(fmt::format("field '{}' must be one of {}, got '{}'", name, fmt::join(names, ", "),
                                  text.substr(0, 32)));
}

constexpr std::array<std::string_view, 5> kPhaseNames = {"waiting", "running", "stopping", "finished", "failed"};
constexpr std::array<std::string_view, 6> kActionNames = {"wait", "go", "rejoin", "stop", "finished", "restore"};
constexpr std::array<std::string_view, 3> kStatusNames = {"finished", "stopped", "failed"};
constexpr std::array<std::string_view, 2> kReportNames = {"run", "round"};

}  // namespace

bool legal_transition(Phase from, Phase to) {
  switch (from) {
    case Phase::kWaiting: return to == Phase::kRunning || to == Phase::kFinished || to == Phase::kFailed;
    case Phase::kRunning: return to == Phase::kFinished || to == Phase::kFailed;
    case Phase::kStopping:
    case Phase::kFinished:
    case Phase::kFailed: return false;
  }
  return false;
}

std::string_view to_string(Phase phase) { return kPhaseNames.at(static_cast<size_t>(phase)); }
std::string_view to_string(RoundAction action) { return kActionNames.at(static_cast<size_t>(action)); }
std::string_view to_string(EndStatus status) { return kStatusNames.at(static_cast<size_t>(status)); }
std::string_view to_string(TaskReport report) { return kReportNames.at(static_cast<size_t>(report)); }
Phase parse_phase(std::string_view text, const char* field) { return parse_name<Phase>(kPhaseNames, text, field); }
RoundAction parse_round_action(std::string_view text, const char* field) {
  return parse_name<RoundAction>(kActionNames, text, field);
}
EndStatus parse_end_status(std::string_view text, const char* field) {
  return parse_name<EndStatus>(kStatusNames, text, field);
}

DatasetIdentity DatasetIdentity::of(const data::Manifest& m) {
  return {m.tokenizer_hash, m.vocab_size, m.train_documents, m.val_documents, m.train_tokens, m.val_tokens, m.labels};
}

nlohmann::json DatasetIdentity::to_json() const {
  return {{"tokenizer_hash", hex64(tokenizer_hash)}, {"vocab_size", vocab_size},
          {"train_documents", train_documents},     {"val_documents", val_documents},
          {"train_tokens", train_tokens},           {"val_tokens", val_tokens},
          {"labels", labels}};
}

DatasetIdentity DatasetIdentity::from_json(const nlohmann::json& json) {
  DatasetIdentity d;
  d.tokenizer_hash = hex_field(json, "tokenizer_hash");
  d.vocab_size = field<int64_t>(json, "vocab_size");
  d.train_documents = field<uint64_t>(json, "train_documents");
  d.val_documents = field<uint64_t>(json, "val_documents");
  d.train_tokens = field<uint64_t>(json, "train_tokens");
  d.val_tokens = field<uint64_t>(json, "val_tokens");
  d.labels = field<std::vector<std::string>>(json, "labels");
  if (d.labels.size() > 100000) throw ProtocolError("field 'labels' is too long");
  return d;
}

std::vector<std::string> DatasetIdentity::differences(const DatasetIdentity& w) const {
  std::vector<std::string> out;
  auto compare = [&](const char* name, auto mine, auto theirs) {
    if (mine != theirs) out.push_back(fmt::format("{}: {} (run) vs {} (worker)", name, mine, theirs));
  };
  if (tokenizer_hash != w.tokenizer_hash) {
    out.push_back(fmt::format("tokenizer: {} (run) vs {} (worker)", hex64(tokenizer_hash), hex64(w.tokenizer_hash)));
  }
  compare("vocab_size", vocab_size, w.vocab_size);
  compare("train_documents", train_documents, w.train_documents);
  compare("val_documents", val_documents, w.val_documents);
  compare("train_tokens", train_tokens, w.train_tokens);
  compare("val_tokens", val_tokens, w.val_tokens);
  if (labels != w.labels) out.push_back(fmt::format("labels: [{}] (run) vs [{}] (worker)", fmt::join(labels, ", "), fmt::join(w.labels, ", ")));
  return out;
}

nlohmann::json JoinRequest::to_json() const {
  nlohmann::json checkpoints_json = nlohmann::json::array();
  for (const auto& c : checkpoints) checkpoints_json.push_back({{"step", c.step}, {"global_hash", hex64(c.global_hash)}});
  return {{"version", version}, {"name", name}, {"rank", rank}, {"config", config_toml}, {"dataset", dataset.to_json()},
          {"resume", resume}, {"checkpoints", checkpoints_json}, {"shards_hash", hex64(shards_hash)}};
}

JoinRequest JoinRequest::from_json(const nlohmann::json& json) {
  JoinRequest r;
  r.version = field<int>(json, "version");
  if (r.version != kVersion) {
    throw ProtocolError(fmt::format("protocol version {} is not this coordinator's ({}); run the same loco everywhere",
                                    r.version, kVersion));
  }
  r.name = field<std::string>(json, "name");
  check_length(r.name, 256, "name");
  r.rank = field<int64_t>(json, "rank");
  r.config_toml = field<std::string>(json, "config");
  check_length(r.config_toml, 1 << 20, "config");
  r.dataset = DatasetIdentity::from_json(field<nlohmann::json>(json, "dataset"));
  r.resume = field<bool>(json, "resume");
  const auto checkpoints = field_or<nlohmann::json>(json, "checkpoints", nlohmann::json::array());
  if (!checkpoints.is_array() || checkpoints.size() > 10000) throw ProtocolError("field 'checkpoints' must be a short array");
  for (const auto& c : checkpoints) r.checkpoints.push_back({field<int64_t>(c, "step"), hex_field(c, "global_hash")});
  r.shards_hash = json.is_object() && json.contains("shards_hash") ? hex_field(json, "shards_hash") : 0;
  return r;
}

namespace {

nlohmann::json position_json(const data::SamplerPosition& p) { return {{"epoch", p.epoch}, {"cursor", p.cursor}}; }

data::SamplerPosition position_from(const nlohmann::json& json, const char* name) {
  const auto p = field<nlohmann::json>(json, name);
  return {field<uint64_t>(p, "epoch"), field<uint64_t>(p, "cursor")};
}

int64_t nonnegative(const nlohmann::json& json, const char* name) {
  const auto value = field<int64_t>(json, name);
  if (value < 0) throw ProtocolError(fmt::format("field '{}' must not be negative, got {}", name, value));
  return value;
}

}  // namespace

nlohmann::json Task::to_json() const {
  return {{"id", id}, {"scope", to_string(scope)}, {"part", part}, {"version", version}, {"shard", shard},
          {"from", position_json(from)}, {"steps", steps}, {"seconds", seconds}, {"report", to_string(report)}};
}

Task Task::from_json(const nlohmann::json& json) {
  Task t;
  t.id = nonnegative(json, "id");
  const auto scope = parse_task_scope(field<std::string>(json, "scope"));
  if (!scope || (*scope != TaskScope::kModel && *scope != TaskScope::kFragment)) {
    throw ProtocolError("field 'scope' must be \"model\" or \"fragment\" (a coordinator's task)");
  }
  t.scope = *scope;
  t.part = field<int64_t>(json, "part");
  if (t.part < -1) throw ProtocolError("field 'part' must be -1 or a part's index");
  t.version = nonnegative(json, "version");
  t.shard = nonnegative(json, "shard");
  if (t.shard >= static_cast<int64_t>(kMaxSlots)) throw ProtocolError("field 'shard' is out of range");
  t.from = position_from(json, "from");
  t.steps = nonnegative(json, "steps");
  t.seconds = field<double>(json, "seconds");
  if (!(t.seconds >= 0) || !std::isfinite(t.seconds)) throw ProtocolError("field 'seconds' must be finite and >= 0");
  t.report = parse_name<TaskReport>(kReportNames, field<std::string>(json, "report"), "report");
  return t;
}

nlohmann::json JoinReply::to_json() const {
  nlohmann::json j = {{"rank", rank}, {"world_size", world_size}, {"run_id", run_id}, {"member", member},
                      {"joiner", joiner}, {"position", position_json(position)}};
  if (resume_step) j["resume_step"] = *resume_step;
  return j;
}

JoinReply JoinReply::from_json(const nlohmann::json& json) {
  JoinReply r{field<int64_t>(json, "rank"), field<int64_t>(json, "world_size"), field<std::string>(json, "run_id")};
  r.member = field_or<int64_t>(json, "member", -1);
  r.joiner = field_or<bool>(json, "joiner", false);
  if (json.contains("position")) r.position = position_from(json, "position");
  if (json.contains("resume_step")) r.resume_step = field<int64_t>(json, "resume_step");
  return r;
}

nlohmann::json HeartbeatRequest::to_json() const {
  nlohmann::json out = {{"member", member}, {"step", step}};
  if (epoch >= 0) out["epoch"] = epoch, out["closed"] = closed;
  return out;
}
HeartbeatRequest HeartbeatRequest::from_json(const nlohmann::json& json) {
  HeartbeatRequest r{nonnegative(json, "member"), field_or<int64_t>(json, "step", -1)};
  r.epoch = field_or<int64_t>(json, "epoch", -1);
  const auto closed = field_or<nlohmann::json>(json, "closed", nlohmann::json::array());
  if (!closed.is_array()) throw ProtocolError("field 'closed' is not a list");
  if (closed.size() > kMaxSlots) throw ProtocolError(fmt::format("field 'closed' lists more than {} ranks", kMaxSlots));
  for (const auto& rank : closed) {
    if (!rank.is_number_integer() || rank.get<int64_t>() < 0) throw ProtocolError("field 'closed' holds a rank that is not an integer >= 0");
    r.closed.push_back(rank.get<int64_t>());
  }
  return r;
}

nlohmann::json HeartbeatReply::to_json() const {
  return {{"member", member}, {"epoch", epoch}, {"epoch_broken", epoch_broken}, {"stopping", stopping}};
}
HeartbeatReply HeartbeatReply::from_json(const nlohmann::json& json) {
  return {field<bool>(json, "member"), field<int64_t>(json, "epoch"), field<bool>(json, "epoch_broken"),
          field<bool>(json, "stopping")};
}

nlohmann::json RoundRequest::to_json() const {
  nlohmann::json out = {{"member", member}, {"round", round}, {"failed_epoch", failed_epoch}, {"step", step},
                        {"position", position_json(position)}};
  if (!failure.empty()) out["failure"] = failure;
  if (!adopted.empty()) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [slot, p] : adopted) list.push_back({{"slot", slot}, {"position", position_json(p)}});
    out["adopted"] = std::move(list);
  }
  return out;
}
RoundRequest RoundRequest::from_json(const nlohmann::json& json) {
  RoundRequest r;
  r.member = nonnegative(json, "member");
  r.round = nonnegative(json, "round");
  r.failed_epoch = field<int64_t>(json, "failed_epoch");
  r.failure = field_or<std::string>(json, "failure", "");
  if (r.failure.size() > kMaxFailureBytes) throw ProtocolError(fmt::format("field 'failure' is over {} bytes", kMaxFailureBytes));
  r.step = nonnegative(json, "step");
  r.position = position_from(json, "position");
  const auto adopted = field_or<nlohmann::json>(json, "adopted", nlohmann::json::array());
  if (!adopted.is_array()) throw ProtocolError("field 'adopted' is not a list");
  if (adopted.size() > kMaxSlots) throw ProtocolError(fmt::format("field 'adopted' lists more than {} slots", kMaxSlots));
  for (const auto& a : adopted) {
    const int64_t slot = nonnegative(a, "slot");
    if (!r.adopted.emplace(slot, position_from(a, "position")).second) {
      throw ProtocolError(fmt::format("field 'adopted' lists slot {} twice", slot));
    }
  }
  return r;
}

nlohmann::json RoundReply::to_json() const {
  nlohmann::json slot_list = nlohmann::json::array();
  for (const auto& s : slots) {
    slot_list.push_back({{"owner", s.owner}, {"position", position_json(s.position)}});
  }
  nlohmann::json task_list = nlohmann::json::array();
  for (const auto& t : tasks) task_list.push_back(t.to_json());
  return {{"action", to_string(action)}, {"round", round}, {"epoch", epoch}, {"rank", rank}, {"size", size},
          {"contributors", contributors}, {"step", step}, {"slots", slot_list}, {"tasks", task_list}, {"reason", reason}};
}
RoundReply RoundReply::from_json(const nlohmann::json& json) {
  RoundReply r;
  r.action = parse_round_action(field<std::string>(json, "action"));
  r.round = field<int64_t>(json, "round");
  r.epoch = field<int64_t>(json, "epoch");
  r.rank = field<int64_t>(json, "rank");
  r.size = field<int64_t>(json, "size");
  r.contributors = field<int64_t>(json, "contributors");
  r.step = field_or<int64_t>(json, "step", 0);
  for (const auto& s : field<nlohmann::json>(json, "slots")) {
    r.slots.push_back({field<int64_t>(s, "owner"), position_from(s, "position")});
  }
  const auto tasks = field_or<nlohmann::json>(json, "tasks", nlohmann::json::array());
  if (!tasks.is_array() || tasks.size() > kMaxSlots) throw ProtocolError("field 'tasks' must be an array of at most 65536 tasks");
  for (const auto& t : tasks) r.tasks.push_back(Task::from_json(t));
  r.reason = field<std::string>(json, "reason");
  return r;
}

nlohmann::json RoundDone::to_json() const {
  return {{"member", member}, {"round", round}, {"epoch", epoch}, {"step", step}, {"params_hash", hex64(params_hash)},
          {"last", last}};
}
RoundDone RoundDone::from_json(const nlohmann::json& json) {
  RoundDone r;
  r.member = nonnegative(json, "member");
  r.round = nonnegative(json, "round");
  r.epoch = nonnegative(json, "epoch");
  r.step = nonnegative(json, "step");
  r.params_hash = hex_field(json, "params_hash");
  r.last = field_or<bool>(json, "last", true);
  return r;
}

nlohmann::json StartReply::to_json() const {
  nlohmann::json j = {{"phase", to_string(phase)}, {"missing", missing}, {"epoch", epoch}, {"error", error}};
  j["resume_step"] = resume_step ? nlohmann::json(*resume_step) : nlohmann::json();
  if (task) j["task"] = task->to_json();
  if (copy) j["copy"] = {{"from", copy->from}, {"to", copy->to}};
  if (host_workers > 0) j["host_workers"] = host_workers;
  return j;
}

StartReply StartReply::from_json(const nlohmann::json& json) {
  StartReply r;
  r.phase = parse_phase(field<std::string>(json, "phase"));
  r.missing = field<std::vector<int64_t>>(json, "missing");
  r.epoch = field<int64_t>(json, "epoch");
  r.error = field<std::string>(json, "error");
  if (json.contains("resume_step") && !json.at("resume_step").is_null()) r.resume_step = field<int64_t>(json, "resume_step");
  if (json.contains("task")) r.task = Task::from_json(json.at("task"));
  if (json.contains("copy")) {
    const auto& c = json.at("copy");
    r.copy = CheckpointCopy{nonnegative(c, "from"), field<std::vector<int64_t>>(c, "to")};
  }
  if (json.contains("host_workers")) r.host_workers = nonnegative(json, "host_workers");
  return r;
}

nlohmann::json DoneRequest::to_json() const {
  return {{"rank", rank}, {"member", member}, {"task", task}, {"status", to_string(status)}, {"error", error}, {"summary", summary}};
}

DoneRequest DoneRequest::from_json(const nlohmann::json& json) {
  DoneRequest r;
  r.rank = field<int64_t>(json, "rank");
  r.member = field_or<int64_t>(json, "member", -1);
  r.task = field_or<int64_t>(json, "task", -1);
  r.status = parse_end_status(field<std::string>(json, "status"));
  r.error = field_or<std::string>(json, "error", "");
  check_length(r.error, 1 << 16, "error");
  r.summary = field_or<nlohmann::json>(json, "summary", nlohmann::json::object());
  if (!r.summary.is_object()) throw ProtocolError("field 'summary' must be an object");
  return r;
}

}  // namespace loco::runtime::protocol
