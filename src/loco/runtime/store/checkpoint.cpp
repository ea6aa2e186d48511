#include "loco/runtime/store/checkpoint.h"

#include <nlohmann/json.hpp>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/hash.h"
#include "loco/core/run_folder.h"

namespace loco::runtime {
namespace {

constexpr int kStateVersion = 1;
const char* const kFiles[] = {"model.safetensors", "optimizer.safetensors", "sync.safetensors"};

std::string checkpoint_name(int64_t step) { return fmt::format("step-{:08}", step); }

// state.json's fields, without "files" (the checksums of the files beside it).
nlohmann::ordered_json state_json(const TrainingState& state) {
  nlohmann::ordered_json json = {
      {"format_version", kStateVersion},
      {"step", state.step},
      {"tokens", state.tokens},
      {"sampler", {{"epoch", state.sampler.epoch}, {"cursor", state.sampler.cursor}}},
      {"seed", state.seed},
      {"tokenizer_hash", hex64(state.tokenizer_hash)},
      {"wall_s", state.wall_s},
      {"global_hash", hex64(state.global_hash)},
      {"torch_version", TORCH_VERSION},
      {"config", state.config_toml},
  };
  if (state.copied_from) json["copied_from"] = *state.copied_from;
  if (state.max_positions > 0) json["max_positions"] = state.max_positions;
  if (state.run) {
    nlohmann::ordered_json shards = nlohmann::ordered_json::array();
    for (const auto& p : state.run->shards) shards.push_back({{"epoch", p.epoch}, {"cursor", p.cursor}});
    json["run"] = {{"rounds", state.run->rounds}, {"shards", shards}};
  }
  return json;
}

// The state from state.json's fields; `where` names the source in DataError messages.
TrainingState parse_state(const nlohmann::json& json, const std::string& where) {
  TrainingState s;
  try {
    if (json.at("format_version").get<int>() != kStateVersion) {
      throw DataError("checkpoint", fmt::format("{}: format_version {} is not supported (this loco reads {})", where,
                                                json.at("format_version").get<int>(), kStateVersion));
    }
    s.step = json.at("step").get<int64_t>();
    s.tokens = json.at("tokens").get<int64_t>();
    s.sampler.epoch = json.at("sampler").at("epoch").get<uint64_t>();
    s.sampler.cursor = json.at("sampler").at("cursor").get<uint64_t>();
    s.seed = json.at("seed").get<int64_t>();
    s.tokenizer_hash = parse_hex64(json.at("tokenizer_hash").get<std::string>(), "checkpoint", where);
    s.wall_s = json.value("wall_s", 0.0);
    if (json.contains("global_hash")) s.global_hash = parse_hex64(json.at("global_hash").get<std::string>(), "checkpoint", where);
    s.config_toml = json.at("config").get<std::string>();
    if (json.contains("copied_from")) s.copied_from = json.at("copied_from").get<int64_t>();
    s.max_positions = json.value("max_positions", int64_t{0});
    if (s.max_positions < 0) throw DataError("checkpoint", fmt::format("{}: max_positions is negative", where));
    if (json.contains("run")) {
      RunProgress run;
      run.rounds = json.at("run").at("rounds").get<int64_t>();
      for (const auto& p : json.at("run").at("shards")) {
        run.shards.push_back({p.at("epoch").get<uint64_t>(), p.at("cursor").get<uint64_t>()});
      }
      if (run.rounds < 0) throw DataError("checkpoint", fmt::format("{}: run.rounds is negative", where));
      s.run = std::move(run);
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError("checkpoint", fmt::format("{}: malformed: {}", where, e.what()));
  }
  return s;
}

const char* const kParts[] = {"model/", "optimizer/", "sync/"};  // a checkpoint's parts in one message

}  // namespace

CheckpointStore::CheckpointStore(fs::path root, int64_t keep) : root_(std::move(root)), keep_(keep) {
  LOCO_CHECK(keep_ >= 1, "keep must be >= 1");
}

fs::path CheckpointStore::save(const TrainingState& state, const NamedTensors& model, const NamedTensors& optimizer,
                               const NamedTensors& sync, bool prune) const {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) throw Error("checkpoint", fmt::format("{}: cannot create folder: {}", root_.string(), ec.message()));
  const std::string name = checkpoint_name(state.step);
  const fs::path final_dir = root_ / name;
  const fs::path tmp_dir = root_ / fmt::format(".{}.tmp-{}", name, ::getpid());
  fs::remove_all(tmp_dir, ec);

  try {
    nlohmann::ordered_json files = nlohmann::ordered_json::object();
    const NamedTensors* parts[] = {&model, &optimizer, &sync};
    for (size_t i = 0; i < 3; ++i) {
      std::string bytes = encode_safetensors(*parts[i], {{"format", "pt"}});
      write_file_atomic(tmp_dir / kFiles[i], bytes, "checkpoint", Readers::kOwner);
      files[kFiles[i]] = {{"bytes", bytes.size()}, {"xxh3", hex64(hash64(bytes))}};
    }
    nlohmann::ordered_json json = state_json(state);
    json["files"] = files;
    write_file_atomic(tmp_dir / "state.json", json.dump(2) + "\n", "checkpoint", Readers::kOwner);
    // Replacing a checkpoint of the same step (a resumed run that saves again) is fine: move the
    // old one aside first so the rename cannot fail on a non-empty folder.
    if (fs::exists(final_dir)) {
      const fs::path old_dir = root_ / fmt::format(".{}.old-{}", name, ::getpid());
      fs::rename(final_dir, old_dir);
      fs::rename(tmp_dir, final_dir);
      fs::remove_all(old_dir, ec);
    } else {
      fs::rename(tmp_dir, final_dir);
    }
    sync_directory(root_, "checkpoint");
    write_file_atomic(root_ / "latest", name + "\n", "checkpoint", Readers::kOwner);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp_dir, ec);
    throw Error("checkpoint", fmt::format("{}: {}", final_dir.string(), e.what()));
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    throw;
  }

  if (!prune) return final_dir;
  // Prune: keep the newest `keep` complete checkpoints (names sort by step).
  std::vector<fs::path> existing;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::string n = entry.path().filename().string();
    if (entry.is_directory() && n.starts_with("step-")) existing.push_back(entry.path());
  }
  std::sort(existing.begin(), existing.end());
  const std::string pinned = pinned_name();
  for (size_t i = 0; i + static_cast<size_t>(keep_) < existing.size(); ++i) {
    if (existing[i] != final_dir && existing[i].filename() != pinned) fs::remove_all(existing[i], ec);
  }
  return final_dir;
}

void CheckpointStore::pin(int64_t step) const {
  write_file_atomic(root_ / "pinned", checkpoint_name(step) + "\n", "checkpoint", Readers::kOwner);
}

void CheckpointStore::unpin() const {
  std::error_code ec;
  fs::remove(root_ / "pinned", ec);
}

// The checkpoint folder `pinned` names, or "" (none, or unreadable: then nothing is spared).
std::string CheckpointStore::pinned_name() const {
  std::error_code ec;
  if (!fs::exists(root_ / "pinned", ec)) return "";
  try {
    std::string name = read_file_beneath(root_, "pinned", "checkpoint", kMaxRunTextBytes);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    return name;
  } catch (const Error&) {
    return "";
  }
}

std::optional<fs::path> CheckpointStore::latest() const {
  std::error_code ec;
  if (!fs::exists(root_ / "latest", ec)) return std::nullopt;
  std::string name = read_file_beneath(root_, "latest", "checkpoint", kMaxRunTextBytes);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos) {
    throw DataError("checkpoint", fmt::format("{}: malformed (expected a checkpoint folder name)", (root_ / "latest").string()));
  }
  return root_ / name;
}

std::vector<int64_t> CheckpointStore::steps() const {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::string n = entry.path().filename().string();
    if (!entry.is_directory() || !n.starts_with("step-") || !fs::exists(entry.path() / "state.json", ec)) continue;
    try {
      out.push_back(std::stoll(n.substr(5)));
    } catch (const std::exception&) {
      // not one of ours
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

fs::path CheckpointStore::at(int64_t step) const { return root_ / checkpoint_name(step); }

NamedTensors inference_weights(const Checkpoint& checkpoint) {
  NamedTensors global;
  for (const auto& [name, tensor] : checkpoint.sync) {
    if (name.starts_with("global.")) global.emplace_back(name.substr(7), tensor);
  }
  return global.empty() ? checkpoint.model : global;
}

fs::path resolve_checkpoint_dir(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw DataError("checkpoint", fmt::format("{}: no such checkpoint or run folder", path.string()));
  if (fs::exists(path / "state.json", ec)) return path;
  const RunFolder run(path);
  for (const fs::path& root : {path, run.checkpoints(), run.worker_checkpoints(0)}) {
    if (fs::exists(root / "latest", ec)) return *CheckpointStore(root, 1).latest();
  }
  throw DataError("checkpoint", fmt::format("{}: neither a checkpoint (no state.json) nor a run folder with "
                                            "checkpoints/latest or workers/0/checkpoints/latest", path.string()));
}

Checkpoint load_checkpoint(const fs::path& path) {
  Checkpoint ckpt;
  ckpt.dir = resolve_checkpoint_dir(path);
  const fs::path state_path = ckpt.dir / "state.json";
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_file_beneath(ckpt.dir, "state.json", "checkpoint", kMaxRunTextBytes));
  } catch (const nlohmann::json::exception& e) {
    throw DataError("checkpoint", fmt::format("{}: malformed: {}", state_path.string(), e.what()));
  }
  ckpt.state = parse_state(json, state_path.string());
  NamedTensors* parts[] = {&ckpt.model, &ckpt.optimizer, &ckpt.sync};
  for (size_t i = 0; i < 3; ++i) {
    const fs::path file = ckpt.dir / kFiles[i];
    std::string bytes;
    try {
      const auto& entry = json.at("files").at(kFiles[i]);
      // No link inside the checkpoint is followed, and no more is read than state.json says.
      bytes = read_file_beneath(ckpt.dir, kFiles[i], "checkpoint", entry.at("bytes").get<uint64_t>());
      if (entry.at("bytes").get<uint64_t>() != bytes.size()) {
        throw DataError("checkpoint", fmt::format("{}: {} bytes, state.json says {} (truncated?)", file.string(),
                                                  bytes.size(), entry.at("bytes").get<uint64_t>()));
      }
      if (parse_hex64(entry.at("xxh3").get<std::string>(), "checkpoint", state_path.string()) != hash64(bytes)) {
        throw DataError("checkpoint", fmt::format("{}: checksum mismatch (the file is corrupted)", file.string()));
      }
    } catch (const nlohmann::json::exception& e) {
      throw DataError("checkpoint", fmt::format("{}: malformed files entry: {}", state_path.string(), e.what()));
    }
    *parts[i] = decode_safetensors(bytes, file.string()).tensors;
  }
  return ckpt;
}

std::string encode_checkpoint(const Checkpoint& checkpoint) {
  NamedTensors all;
  const NamedTensors* parts[] = {&checkpoint.model, &checkpoint.optimizer, &checkpoint.sync};
  for (size_t i = 0; i < 3; ++i) {
    for (const auto& [name, tensor] : *parts[i]) all.emplace_back(kParts[i] + name, tensor);
  }
  return encode_safetensors(all, {{"state", state_json(checkpoint.state).dump()}});
}

Checkpoint decode_checkpoint(const std::string& bytes, const std::string& where) {
  auto file = decode_safetensors(bytes, where);
  require_verified(file, where);
  const auto state = file.metadata.find("state");
  if (state == file.metadata.end()) throw DataError("checkpoint", fmt::format("{}: holds no training state", where));
  Checkpoint ckpt;
  try {
    ckpt.state = parse_state(nlohmann::json::parse(state->second), where);
  } catch (const nlohmann::json::exception& e) {
    throw DataError("checkpoint", fmt::format("{}: malformed state: {}", where, e.what()));
  }
  NamedTensors* parts[] = {&ckpt.model, &ckpt.optimizer, &ckpt.sync};
  for (auto& [name, tensor] : file.tensors) {
    size_t i = 0;
    while (i < 3 && !name.starts_with(kParts[i])) ++i;
    if (i == 3) throw DataError("checkpoint", fmt::format("{}: tensor {} belongs to no part of a checkpoint", where, name));
    parts[i]->emplace_back(name.substr(std::string_view(kParts[i]).size()), std::move(tensor));
  }
  return ckpt;
}

}  // namespace loco::runtime
