// The messages between workers and the coordinator (HTTP/JSON over one port; docs/concurrency.md).
// Every message has a to_json() and a from_json() that validates what comes off the network and
// throws ProtocolError naming the bad field, so a malformed or hostile request gets a 400, never a
// crash.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loco/runtime/tasks/task.h"
#include "loco/core/error.h"
#include "loco/runtime/net/wire.h"
#include "loco/data/dataset.h"
#include "loco/data/sampler_position.h"

namespace loco::runtime::protocol {

constexpr int kVersion = 4;  // 2: tasks in the round plan (RoundReply::tasks), StartReply::task;
                             // 3: signed requests (auth.h), no token in JoinRequest;
                             // 4: the sealed data plane (a 3's groups are open: they would not meet)

// The wire's JSON helpers (net/wire.h), under the names the messages use.
using wire::get_integer;
using wire::get_integers;

// A number of a state saved to disk (RUN/coordinator.json), and a position in the data: a float or
// an out-of-range number is malformed, not converted (nlohmann's own conversion of them is unchecked).
inline int64_t saved_integer(const nlohmann::json& value) { return get_integer<int64_t>(value, "a saved number"); }
inline uint64_t saved_position(const nlohmann::json& value) { return get_integer<uint64_t>(value, "a saved position"); }
using wire::kMaxJsonDepth;
using wire::nested_deeper_than;
using wire::ProtocolError;
using wire::to_wire;

// The phase of a run, as the coordinator holds it. Its legal transitions:
//   kWaiting -> kRunning    every worker joined (elastic: the slots filled, or the quorum at the join deadline)
//   kWaiting -> kFinished   every worker ended before the start (the run was stopped while waiting)
//   kWaiting -> kFailed     a worker never joined, or the resume points disagree
//   kRunning -> kFinished   every worker reported its end (elastic: every member left, training complete or stopped)
//   kRunning -> kFailed     a worker failed (fixed), every member left early or θ diverged (elastic)
// kFinished and kFailed are final. kStopping is never the coordinator's: a StartReply says it to a
// worker that was interrupted while it waited for the start.
enum class Phase { kWaiting, kRunning, kStopping, kFinished, kFailed };
bool legal_transition(Phase from, Phase to);

// What the coordinator tells a member at a round's end (RoundReply::action).
enum class RoundAction {
  kWait,      // the round is not convened yet: ask again
  kGo,        // synchronize now, in RoundReply::epoch
  kRejoin,    // no longer a member (declared failed, or its round completed without it): join again
  kStop,      // the run is stopping
  kFinished,  // training is over
  kRestore,   // nobody holds θ: continue from the global checkpoint of RoundReply::step
};

// How a worker's part in the run ended (DoneRequest::status).
enum class EndStatus { kFinished, kStopped, kFailed };

// Wire names ("waiting", "go", "finished"...): to_string for messages and logs, and parse_* for
// what comes off the network (ProtocolError naming the field for an unknown name).
std::string_view to_string(Phase phase);
std::string_view to_string(RoundAction action);
std::string_view to_string(EndStatus status);
Phase parse_phase(std::string_view text, const char* field = "phase");
RoundAction parse_round_action(std::string_view text, const char* field = "action");
EndStatus parse_end_status(std::string_view text, const char* field = "status");

// A task of the coordinator's (coordinator/tasks.h; the vocabulary of tasks/task.h): what a worker
// trains (kModel or kFragment), from where, for how long, and what it sends back.
using runtime::TaskScope;
enum class TaskReport {
  kRun,    // a fixed run's whole part: every synchronization happens inside it; reported at the end
  kRound,  // one round of an elastic run: the outer gradient in the round's collective, then the shard's position
};
std::string_view to_string(TaskReport report);

struct Task {
  int64_t id = 0;
  TaskScope scope = TaskScope::kModel;
  int64_t part = -1;            // kFragment / kPath: which one (-1: the strategy's schedule says)
  int64_t version = 0;          // the global version it trains from: rounds completed
  int64_t shard = 0;            // the slot whose shard of the data it reads
  data::SamplerPosition from;   // where that reading starts
  int64_t steps = 0;            // inner steps (kRun: the run's; kRound: H); 0: by time
  double seconds = 0;           // kRound of a time-budgeted run: the round's budget; 0: by steps
  TaskReport report = TaskReport::kRound;
  nlohmann::json to_json() const;
  static Task from_json(const nlohmann::json& json);
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
  uint64_t shards_hash = 0;  // elastic: hash of the worker's division of the data into slots

  nlohmann::json to_json() const;
  static JoinRequest from_json(const nlohmann::json& json);
};

struct JoinReply {
  int64_t rank = 0;         // fixed membership: the rank; elastic: the slot (shard) taken
  int64_t world_size = 0;   // fixed: the workers; elastic: the slots (cluster.workers)
  std::string run_id;
  // Elastic runs only.
  int64_t member = -1;              // this member's id (a rejoining worker gets a new one)
  bool joiner = false;              // joins a run under way: receives the state at the next round
                                    // (asynchronous DiLoCo: continues from the current θ)
  data::SamplerPosition position;   // where the slot's sampler stands (its last completed round)
  std::optional<int64_t> resume_step;  // a resumed run: the global checkpoint every member loads

  nlohmann::json to_json() const;
  static JoinReply from_json(const nlohmann::json& json);
};

// A fixed run's resume where some workers hold no checkpoint: `from` sends a copy of its checkpoint
// of the resume step to each of `to` over the run's group, before training starts.
struct CheckpointCopy {
  int64_t from = 0;
  std::vector<int64_t> to;
};

// The answer to "may training start?", long-polled by joined workers.
struct StartReply {
  Phase phase = Phase::kWaiting;
  std::vector<int64_t> missing;        // ranks not joined yet (waiting)
  int64_t epoch = 0;                   // membership epoch: the process group to form
  std::optional<int64_t> resume_step;  // the checkpoint this worker resumes from
  std::string error;                   // why the run failed
  std::optional<Task> task;            // fixed runs, once running: this worker's task (the whole run)
  std::optional<CheckpointCopy> copy;  // fixed runs: checkpoints to copy first (every worker is told)
  // Fixed runs: the run's workers whose name gives the same host as this one's (itself included;
  // 0: not said), so that workers started by hand on one host can split its cores.
  int64_t host_workers = 0;

  nlohmann::json to_json() const;
  static StartReply from_json(const nlohmann::json& json);
};

// A worker's end: "finished", "stopped" or "failed" (with the error), and its summary.
struct DoneRequest {
  int64_t rank = 0;
  EndStatus status = EndStatus::kFinished;
  std::string error;
  nlohmann::json summary = nlohmann::json::object();
  int64_t member = -1;  // elastic runs: the member id (rank is then its slot)
  int64_t task = -1;    // fixed runs: the task it reports (-1: none was leased, e.g. stopped before the start)

  nlohmann::json to_json() const;
  static DoneRequest from_json(const nlohmann::json& json);
};

// Elastic runs (docs/failure-model.md). A member proves it is alive with heartbeats; the answer
// says whether it is still a member and which membership epoch is current, so that a collective
// of a superseded or broken epoch can be abandoned at once.
struct HeartbeatRequest {
  int64_t member = 0;
  int64_t step = -1;  // inner steps done (-1: not said), for the work a failure discards
  // The ranks of epoch `epoch`'s group that closed their connections to this member (-1: none
  // said): a hint that they died, which the coordinator checks against their own heartbeats.
  int64_t epoch = -1;
  std::vector<int64_t> closed;
  nlohmann::json to_json() const;
  static HeartbeatRequest from_json(const nlohmann::json& json);
};

struct HeartbeatReply {
  bool member = true;        // false: declared failed (or never joined): rejoin as a new member
  int64_t epoch = 0;         // the current membership epoch
  bool epoch_broken = false; // a collective of the current epoch failed, or one of its members did
  bool stopping = false;     // the run is stopping
  nlohmann::json to_json() const;
  static HeartbeatReply from_json(const nlohmann::json& json);
};

// The longest RoundRequest::failure a coordinator takes (a worker cuts its error to it).
inline constexpr size_t kMaxFailureBytes = 2000;

// "I am at the end of round `round`": long-polled until the coordinator convenes the round.
struct RoundRequest {
  int64_t member = 0;
  int64_t round = 0;          // the round to synchronize (rounds completed + 1); 0: a joiner
  int64_t failed_epoch = -1;  // the last attempt at this round failed in this epoch (-1: none)
  int64_t step = 0;           // inner steps done
  data::SamplerPosition position;  // the slot's sampler after this round's inner steps
  // The shards of vacant slots this member read besides its own (the last plan made it their
  // reader): slot -> where that shard's sampler stands now. At most one entry per slot.
  std::map<int64_t, data::SamplerPosition> adopted;
  std::string failure;  // how the attempt in failed_epoch failed (the member's error; at most kMaxFailureBytes)
  nlohmann::json to_json() const;
  static RoundRequest from_json(const nlohmann::json& json);
};

struct SlotInfo {
  int64_t owner = -1;  // member id, -1: vacant
  data::SamplerPosition position;
};

struct RoundReply {
  RoundAction action = RoundAction::kWait;
  int64_t round = 0, epoch = 0, rank = 0, size = 0;
  int64_t contributors = 0;     // ranks 0..contributors-1 add their outer gradients; the rest are joiners
  int64_t step = 0;             // the round's step: the furthest contributor's
  std::vector<SlotInfo> slots;  // every slot's data position as of this round's end, if it completes
  // kGo: the tasks leased to this member for the next round (its own shard's, and the shards of
  // vacant slots dealt to it), each from where its shard stands at this round's end.
  std::vector<Task> tasks;
  std::string reason;
  nlohmann::json to_json() const;
  static RoundReply from_json(const nlohmann::json& json);
};

struct RoundDone {
  int64_t member = 0, round = 0, epoch = 0, step = 0;
  uint64_t params_hash = 0;
  // Whether the member has no round after this one (its strategy's last sync of the run): a round
  // at the run's last step completes the training only when it is the last (Streaming DiLoCo syncs
  // several fragments there, eager updates average θ after their last exchange). Absent: true.
  bool last = true;
  nlohmann::json to_json() const;
  static RoundDone from_json(const nlohmann::json& json);
};

}  // namespace loco::runtime::protocol
