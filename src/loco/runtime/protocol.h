// The messages between workers and the coordinator (HTTP/JSON over one port; docs/concurrency.md).
// Every message has a to_json() and a from_json() that validates what comes off the network and
// throws ProtocolError naming the bad field, so a malformed or hostile request gets a 400, never a
// crash.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loco/core/error.h"
#include "loco/data/dataset.h"

namespace loco::runtime::protocol {

constexpr int kVersion = 1;

// A request that breaks the protocol (answered with HTTP 400).
class ProtocolError : public Error {
 public:
  explicit ProtocolError(std::string_view message) : Error("protocol", message) {}
};

// What makes two prepared datasets the same dataset, wherever their folders are.
struct DatasetIdentity {
  uint64_t tokenizer_hash = 0;
  int64_t vocab_size = 0;
  uint64_t train_documents = 0, val_documents = 0, train_tokens = 0, val_tokens = 0;
  std::vector<std::string> labels;

  static DatasetIdentity of(const data::Manifest& manifest);
  nlohmann::json to_json() const;
  static DatasetIdentity from_json(const nlohmann::json& json);
  // "train_tokens: 1234 (coordinator) vs 1240 (worker)" for each field that differs.
  std::vector<std::string> differences(const DatasetIdentity& worker) const;
};

// One of a worker's checkpoints, as the coordinator needs it to pick a consistent resume point.
struct CheckpointInfo {
  int64_t step = 0;
  uint64_t global_hash = 0;
};

struct JoinRequest {
  int version = kVersion;
  std::string name;          // "host:pid", for messages
  int64_t rank = -1;         // requested rank; -1 = any free one
  std::string config_toml;   // the worker's resolved config
  DatasetIdentity dataset;
  bool resume = false;
  std::vector<CheckpointInfo> checkpoints;  // when resuming (the rank must then be given)

  nlohmann::json to_json() const;
  static JoinRequest from_json(const nlohmann::json& json);
};

struct JoinReply {
  int64_t rank = 0;
  int64_t world_size = 0;
  std::string run_id;

  nlohmann::json to_json() const;
  static JoinReply from_json(const nlohmann::json& json);
};

// The answer to "may training start?", long-polled by joined workers.
struct StartReply {
  std::string phase;                   // "waiting", "running", "stopping", "finished" or "failed"
  std::vector<int64_t> missing;        // ranks not joined yet (waiting)
  int64_t epoch = 0;                   // membership epoch: the process group to form
  std::optional<int64_t> resume_step;  // the checkpoint this worker resumes from
  std::string error;                   // why the run failed

  nlohmann::json to_json() const;
  static StartReply from_json(const nlohmann::json& json);
};

// A worker's end: "finished", "stopped" or "failed" (with the error), and its summary.
struct DoneRequest {
  int64_t rank = 0;
  std::string status;
  std::string error;
  nlohmann::json summary = nlohmann::json::object();

  nlohmann::json to_json() const;
  static DoneRequest from_json(const nlohmann::json& json);
};

}  // namespace loco::runtime::protocol
