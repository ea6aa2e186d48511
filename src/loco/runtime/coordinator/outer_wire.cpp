#include "loco/runtime/coordinator/outer_wire.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "loco/core/files.h"
#include "loco/model/options.h"
#include "loco/runtime/store/safetensors.h"
#include "loco/runtime/coordinator/protocol.h"

namespace loco::runtime::protocol {

namespace {

constexpr size_t kMaxHeaderBytes = 64 << 10;
constexpr size_t kMaxFragments = 4096;

std::string frame(const nlohmann::json& header, const torch::Tensor& values) {
  const int64_t n = values.defined() ? values.numel() : 0;
  std::string line = header.dump();
  std::string out;
  out.reserve(line.size() + 1 + static_cast<size_t>(n) * 4);
  out += line;
  out += '\n';
  if (n > 0) {
    const auto contiguous = values.contiguous();
    out.append(reinterpret_cast<const char*>(contiguous.data_ptr<float>()), static_cast<size_t>(n) * 4);
  }
  return out;
}

// The header line and the values after it (an undefined tensor when there are none).
std::pair<nlohmann::json, torch::Tensor> unframe(const std::string& body, const char* what) {
  const auto end = body.find('\n');
  if (end == std::string::npos || end > kMaxHeaderBytes) throw ProtocolError(fmt::format("{}: no header line", what));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(body.substr(0, end));
  } catch (const nlohmann::json::exception&) {
    throw ProtocolError(fmt::format("{}: the header is not valid JSON", what));
  }
  if (!header.is_object() || nested_deeper_than(header, kMaxJsonDepth)) throw ProtocolError(fmt::format("{}: the header is not an object", what));
  const size_t bytes = body.size() - end - 1;
  if (bytes % 4 != 0) throw ProtocolError(fmt::format("{}: {} bytes of values are not fp32 numbers", what, bytes));
  const int64_t n = static_cast<int64_t>(bytes / 4);
  const int64_t stated = header.contains("values") ? wire::get_integer<int64_t>(header["values"], "values") : -1;
  if (stated != n) throw ProtocolError(fmt::format("{}: {} values stated, {} sent", what, stated, n));
  torch::Tensor values;
  if (n > 0) {
    values = torch::empty({n}, torch::kFloat32);
    std::memcpy(values.data_ptr<float>(), body.data() + end + 1, bytes);
  }
  return {std::move(header), std::move(values)};
}

// A list of integers (a fragment's sizes or versions), at most `most` of them.
std::vector<int64_t> get_integers(const nlohmann::json& j, const char* key, const char* what, size_t most) {
  if (!j.contains(key)) return {};
  const auto& list = j.at(key);
  if (!list.is_array() || list.size() > most) throw ProtocolError(fmt::format("{}: field '{}' is not a list of at most {}", what, key, most));
  std::vector<int64_t> out;
  for (const auto& item : list) out.push_back(wire::get_integer<int64_t>(item, fmt::format("{}: field '{}'", what, key)));
  return out;
}

template <typename T>
T get(const nlohmann::json& j, const char* key, const char* what) {
  if (!j.contains(key)) throw ProtocolError(fmt::format("{}: field '{}' is missing", what, key));
  if constexpr (std::is_same_v<T, int64_t>) {
    return wire::get_integer<int64_t>(j.at(key), fmt::format("{}: field '{}'", what, key));
  }
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw ProtocolError(fmt::format("{}: field '{}' has the wrong type", what, key));
  }
}

}  // namespace

std::string encode_outer_push(const algorithms::AsyncPush& p) {
  const int64_t n = p.values.defined() ? p.values.numel() : 0;
  nlohmann::json header = {{"worker", p.worker}, {"base_version", p.base_version}, {"steps", p.steps}, {"seconds", p.seconds},
                           {"cycle", p.cycle}, {"member", p.member}, {"values", n}};
  if (p.fragment >= 0) header["fragment"] = p.fragment;
  if (!p.fragment_sizes.empty()) header["fragment_sizes"] = p.fragment_sizes;
  return frame(header, p.values);
}

algorithms::AsyncPush decode_outer_push(const std::string& body) {
  constexpr const char* what = "outer exchange";
  auto [header, values] = unframe(body, what);
  algorithms::AsyncPush p;
  p.worker = get<int64_t>(header, "worker", what);
  p.base_version = get<int64_t>(header, "base_version", what);
  p.steps = get<int64_t>(header, "steps", what);
  p.seconds = get<double>(header, "seconds", what);
  p.cycle = get<int64_t>(header, "cycle", what);
  if (header.contains("member")) p.member = get<int64_t>(header, "member", what);  // elastic runs' slot holder
  if (header.contains("fragment")) p.fragment = get<int64_t>(header, "fragment", what);
  p.fragment_sizes = get_integers(header, "fragment_sizes", what, kMaxFragments);
  if (!std::isfinite(p.seconds) || p.seconds < 0 || p.steps < 0) throw ProtocolError(fmt::format("{}: negative steps or seconds", what));
  p.values = std::move(values);
  return p;
}

std::string encode_outer_reply(const algorithms::AsyncReply& r) {
  const int64_t n = r.theta.defined() ? r.theta.numel() : 0;
  nlohmann::json header = {{"version", r.version}, {"steps_next", r.steps_next}, {"schedule_step", r.schedule_step},
                           {"schedule_rate", r.schedule_rate}, {"applied", r.applied}, {"staleness", r.staleness},
                           {"rejected", r.rejected}, {"finished", r.finished}, {"values", n}};
  if (!r.versions.empty()) header["versions"] = r.versions;
  return frame(header, r.theta);
}

algorithms::AsyncReply decode_outer_reply(const std::string& body, int64_t values) {
  constexpr const char* what = "the coordinator's outer answer";
  auto [header, theta] = unframe(body, what);
  algorithms::AsyncReply r;
  r.version = get<int64_t>(header, "version", what);
  r.steps_next = get<int64_t>(header, "steps_next", what);
  r.schedule_step = get<double>(header, "schedule_step", what);
  r.schedule_rate = get<double>(header, "schedule_rate", what);
  r.applied = get<bool>(header, "applied", what);
  r.staleness = get<int64_t>(header, "staleness", what);
  r.rejected = get<std::string>(header, "rejected", what);
  r.finished = get<bool>(header, "finished", what);
  r.versions = get_integers(header, "versions", what, kMaxFragments);
  // A worker told to wait gets none; one fragment's exchange, that fragment's values.
  const bool needs_theta = r.steps_next > 0 || r.finished;
  if (needs_theta != theta.defined() || (theta.defined() && values > 0 && theta.numel() > values)) {
    throw ProtocolError(fmt::format("{}: {} parameters, the model has {}", what, theta.defined() ? theta.numel() : 0, values));
  }
  if (r.steps_next < 0 || !std::isfinite(r.schedule_step) || !std::isfinite(r.schedule_rate) || r.schedule_rate <= 0) {
    throw ProtocolError(fmt::format("{}: a share or schedule no run has", what));
  }
  r.theta = std::move(theta);
  return r;
}

void save_outer_state(const algorithms::AsyncOuterServer& server, const std::filesystem::path& file) {
  const auto state = server.state();
  if (state.empty()) return;  // no worker has arrived: nothing to keep
  write_file_atomic(file, encode_safetensors(state, {{"loco.kind", "async-outer-state"}}), "coordinator", Readers::kOwner);
}

bool load_outer_state(algorithms::AsyncOuterServer& server, const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return false;
  try {
    const auto loaded = load_safetensors(file);
    require_verified(loaded, file.string());
    server.load_state(loaded.tensors);
  } catch (const DataError& e) {
    throw DataError("coordinator", fmt::format("{}: {}", file.string(), e.what()));
  }
  return true;
}

int64_t model_values(const RunConfig& config, int64_t dataset_vocab) {
  auto model = config.model;
  if (model.vocab_size == 0) model.vocab_size = dataset_vocab;
  return model.vocab_size > 0 ? model::parameter_count(model) : 0;
}

void widen_for_outer_exchanges(HttpServerOptions& http, const RunConfig& config, int64_t dataset_vocab) {
  const int64_t values = model_values(config, dataset_vocab);
  const size_t body = values > 0 ? static_cast<size_t>(values) * 4 + (64 << 10) : size_t{1} << 30;
  const auto patience = std::chrono::milliseconds(static_cast<int64_t>(config.cluster.timeout_s * 1000));
  // Only the outer-gradient route takes model-sized bodies, and only from a request whose signed
  // head says how large (the coordinator's wide gate); every other route keeps the server's bounds.
  http.wide_routes[kOuterPath] = {std::max(http.max_body_bytes, body), std::max(http.body_deadline, patience)};
  http.max_held_wide_body_bytes = body * static_cast<size_t>(config.cluster.workers + 1);
  http.write_deadline = std::max(http.write_deadline, patience);  // the answers, θ, are model-sized too
}

}  // namespace loco::runtime::protocol
