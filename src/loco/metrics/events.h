// A run's events, typed: what its processes write to RUN/metrics.jsonl (one JSON object per line,
// with "event", the kind, and "time", seconds since the Unix epoch), what a worker's telemetry
// carries to the coordinator's status page, and what `loco report`, `loco simulate`, the
// launchers' summaries and the DiPaCo launcher's status page read back. This module alone turns
// them into JSON and back, so that a writer and its readers cannot drift apart.
//
//   start / resume   a training loop began (StartEvent)         train   a logged inner step
//   sync             one synchronization (a round or a fragment) eval    the global parameters scored
//   summary          a training loop's end (TrainSummary)
//   path_task, step_task, route_task, worker_summary            a DiPaCo worker's tasks and its end
//   joined, shards, checkpoint, peer_failure                     a dense worker's own moments
//   join, slot_taken, failure, leave, rejoin, collective_failed, left_out, membership,
//   round_retried, round_complete, restored_from_checkpoint,
//   coordinator_restored, run_resumed, slots_summary              an elastic run's coordinator
// A kind this loco does not know (a newer writer's) reads as an OtherEvent: its kind, its worker, its
// fields as written. Nothing writes one.
//
// Reading never throws on a bad line or a bad field (a line cut short by a killed process, a
// hostile telemetry body): a line that is no event is skipped, a missing or mistyped number reads
// as its default.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace loco::metrics {

// Who wrote an event: a dense run's worker by rank (an integer on the wire), a DiPaCo worker by
// name ("host:pid", a string on the wire), or nobody (the coordinator).
struct WorkerId {
  int64_t rank = -1;
  std::string name;
  bool known() const { return rank >= 0 || !name.empty(); }
  std::string label() const;  // "0", "host:pid", or "" for nobody
  auto operator<=>(const WorkerId&) const = default;
};

// One training loop's totals (the `summary` event, and what a worker reports at its end).
struct TrainSummary {
  int64_t first_step = 0;  // 0, or the step resumed from
  int64_t steps = 0;       // steps completed in total
  int64_t tokens = 0;
  double val_loss = NAN, val_ppl = NAN;  // NaN: not evaluated in this process
  double val_unigram_entropy = 0;  // of the dataset, for comparison
  double wall_s = 0;
  bool interrupted = false;     // stopped early (a signal, or the run stopping); a checkpoint was saved
  std::vector<double> losses;  // training loss of each step taken by this call (not in JSON)
  // Synchronization totals of this call: rounds, payload bytes and time in collectives.
  int64_t rounds = 0;
  int64_t bytes_sent = 0, bytes_received = 0;
  double sync_s = 0;
  double stall_s = 0;               // time the loop waited for communication
  int64_t peak_step_bytes = 0;      // most bytes sent during any one inner step but the last
  double compute_utilization = 0;   // share of the inner steps' wall time not spent in sync hooks
  // End to end (this call): seconds computing inner steps (outside sync hooks), and their share of
  // the call's whole wall time, start-up, evaluation and checkpoints included.
  double compute_s = 0, end_to_end_utilization = 0;
  uint64_t global_hash = 0;    // of the global parameters after the last synchronization
};
nlohmann::json summary_json(const TrainSummary& summary);
// nullopt for JSON that is no summary (no "steps": a worker that ended before it had one); a
// missing or null val_loss / val_ppl reads as NaN (a worker that did not evaluate).
std::optional<TrainSummary> summary_from_json(const nlohmann::json& json);

struct StartEvent {
  WorkerId worker;
  bool resumed = false;  // "resume" rather than "start"
  int64_t world_size = 1, step = 0, parameters = 0;
  std::string device, sync;
  int64_t threads = 1;
};

struct TrainEvent {
  WorkerId worker;
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  int64_t tokens = 0;  // trained on so far by this worker
  double tokens_per_s = 0;
  int64_t bytes_sent = 0;
  double utilization = 0;  // the inner steps' share of their time outside sync hooks, so far
  double wall_s = 0;
};

struct SyncEvent {
  WorkerId worker;
  int64_t round = 0, step = 0, world_size = 1;
  int64_t bytes_sent = 0, bytes_received = 0;
  double seconds = 0, stall_s = 0;
  std::string params_hash;
  int64_t fragment = -1;  // Streaming DiLoCo's fragment (-1: the whole model)
  std::string route;      // the transport's route ("gather", "scatter", "ring"; "" before it named one)
  int64_t attempts = 1;
  double weight = -1;     // this worker's weight in the average (-1: not recorded)
  int64_t tokens = -1;
  double round_trip_s = 0;  // the group's measured round trip (comm::CommStats); 0 = not measured
  int64_t rejected = 0;     // outer gradients screening left out (algorithms::Screening)
  std::string screening;    // ... who was left out or clipped, and why
  int64_t staleness = -1;   // asynchronous DiLoCo: versions of θ applied since this worker's Δ began (-1: not async)
  int64_t epoch = -1;       // elastic runs: the membership epoch the round completed in (-1: not elastic)
};

struct EvalEvent {
  WorkerId worker;
  int64_t step = 0;
  double val_loss = NAN, val_ppl = NAN;  // NaN: not evaluated in this process
  int64_t tokens = 0;  // scored
};

struct SummaryEvent {
  WorkerId worker;
  int64_t world_size = 1;
  std::string sync;
  TrainSummary summary;
};

// DiPaCo (runtime/dipaco): bytes are those of the shared store a worker wrote and read.
struct PathTaskEvent {
  WorkerId worker;
  int64_t path = 0, phase = 0, steps = 0;
  double loss = 0;
  int64_t tokens = 0;
  double compute_s = 0;
  int64_t bytes_read = 0, bytes_written = 0;
  std::map<std::string, int64_t> module_bytes_read, module_bytes_written;
};

struct StepTaskEvent {
  WorkerId worker;
  std::string module;
  int64_t version = 0, paths = 0;
  int64_t bytes_read = 0, bytes_written = 0;
  int64_t rejected = 0;   // paths' outer gradients screening left out of the step
  std::string screening;  // which, and why (and any clipped)
};

struct RouteTaskEvent {
  WorkerId worker;
  int64_t phase = 0, router_documents = 0;
  std::string documents_per_path;
};

struct WorkerSummaryEvent {
  WorkerId worker;
  int64_t path_tasks = 0, step_tasks = 0, lost_tasks = 0, inner_steps = 0, tokens = 0;
  int64_t bytes_read = 0, bytes_written = 0;
  double wall_s = 0, busy_s = 0;
  int64_t peak_rss_bytes = 0;
  bool interrupted = false;
};

// A dense worker's moments (runtime/worker).
struct JoinedEvent {  // "joined": a worker that joined a running elastic run, at `step`
  WorkerId worker;
  int64_t step = 0;
};
struct ShardsEvent {  // "shards": the shards a worker reads changed; `adopted`: the vacant slots it reads
  WorkerId worker;
  int64_t step = 0;
  std::vector<int64_t> adopted;
};
struct CheckpointEvent {
  WorkerId worker;
  int64_t step = 0;
  std::string path;
};
struct PeerFailureEvent {  // the worker's collective failed: a peer died, or the run is stopping
  WorkerId worker;
  int64_t step = 0;
  std::string error;
  bool run_stopping = false;
};

// An elastic run's membership as its coordinator sees it (runtime/coordinator/membership.h);
// written by nobody (worker unknown). Members are numbered as admitted; slots are the shards.
struct MemberJoinEvent {  // "join": a process admitted as `member` for `slot`
  WorkerId worker;
  int64_t member = 0;
  std::string name;
  int64_t slot = 0;
  bool joiner = false;  // joined a started run: it receives the state at the next round
};
struct SlotTakenEvent {  // "slot_taken": a joiner took part in `round` and now trains `slot`
  WorkerId worker;
  int64_t member = 0;
  std::string name;
  int64_t slot = 0, round = 0;
};
struct MemberFailureEvent {  // "failure"
  WorkerId worker;
  int64_t member = 0;
  std::string name;
  int64_t slot = 0;
  std::string how;
  double noticed_after_s = 0;
  bool was_training = false;
  int64_t discarded_steps = 0;
};
struct MemberLeaveEvent {  // "leave": a member ended on its own (`status`: finished, failed, ...)
  WorkerId worker;
  int64_t member = 0;
  std::string name;
  int64_t slot = 0;
  std::string status;
};
struct RejoinEvent {  // a member whose round completed without it must join again
  WorkerId worker;
  int64_t member = 0;
  std::string name;
  int64_t slot = 0, round = 0;
  std::string reason;
  int64_t discarded_steps = 0;
};
struct CollectiveFailedEvent {
  WorkerId worker;
  int64_t reported_by = 0;
  std::string name;
  int64_t epoch = 0, round = 0;
  std::string error;  // the reporting member's, as it told it ("" when it did not)
};
struct LeftOutEvent {  // the round went on without `members`, later than sync.round_grace_s
  WorkerId worker;
  int64_t round = 0;
  std::vector<int64_t> members;
  double waited_s = 0;
};
struct SlotReader {  // a shard read by a member other than its slot's
  int64_t slot = 0, member = 0;
  bool operator==(const SlotReader&) const = default;
};
struct EpochMember {
  int64_t rank = 0, member = 0;
  std::string name;
  int64_t slot = 0;
  bool joining = false;
  bool operator==(const EpochMember&) const = default;
};
struct MembershipEvent {  // "membership": a new epoch, the members by rank
  WorkerId worker;
  int64_t epoch = 0, round = 0;
  std::vector<EpochMember> members;
  int64_t contributors = 0, joiners = 0;
  std::vector<SlotReader> adopted;
};
struct RoundRetriedEvent {
  WorkerId worker;
  int64_t round = 0, epoch = 0, failed_epoch = 0, participants = 0;
};
struct RoundCompleteEvent {
  WorkerId worker;
  int64_t round = 0, epoch = 0, step = 0;
  int64_t participants = 0, contributors = 0, slots = 0;
  bool short_handed = false;
  std::vector<int64_t> idle_slots;
  std::vector<SlotReader> adopted;
  std::string params_hash;
  double recovery_s = -1;  // since the failure that broke the epoch (-1: none)
};
struct RestoredFromCheckpointEvent {  // no live member held the run's state
  WorkerId worker;
  int64_t round = 0;
  int64_t step = -1;  // -1: none
  std::vector<int64_t> members;
  // The rounds completed past the checkpoint's, now undone (their θ died with their holders):
  // round + 1 ... round + undone, completed before in epochs up to `epoch`, complete again later.
  int64_t undone = 0;
  int64_t epoch = 0;  // the table's epoch when it restarted (every later round forms a newer one)
};
struct CoordinatorRestoredEvent {  // a restarted coordinator read its table back
  WorkerId worker;
  int64_t epoch = 0, round = 0, live_members = 0;
};
struct RunResumedEvent {
  WorkerId worker;
  int64_t step = 0, round = 0;
  std::vector<int64_t> slots_without_inner_state;
};
struct SlotsSummaryEvent {  // at the end: rounds each slot sat idle
  WorkerId worker;
  int64_t rounds = 0;
  std::vector<int64_t> rounds_missed;
};

struct OtherEvent {
  std::string kind;
  WorkerId worker;
  nlohmann::json fields = nlohmann::json::object();  // without "event" and "time"
};

using Event = std::variant<StartEvent, TrainEvent, SyncEvent, EvalEvent, SummaryEvent, PathTaskEvent, StepTaskEvent,
                           RouteTaskEvent, WorkerSummaryEvent, JoinedEvent, ShardsEvent, CheckpointEvent,
                           PeerFailureEvent, MemberJoinEvent, SlotTakenEvent, MemberFailureEvent, MemberLeaveEvent,
                           RejoinEvent, CollectiveFailedEvent, LeftOutEvent, MembershipEvent, RoundRetriedEvent,
                           RoundCompleteEvent, RestoredFromCheckpointEvent, CoordinatorRestoredEvent, RunResumedEvent,
                           SlotsSummaryEvent, OtherEvent>;

struct TimedEvent {
  double time = 0;  // seconds since the Unix epoch
  Event event;
};

// The event's kind on the wire ("train", ...).
std::string kind_of(const Event& event);
const WorkerId& worker_of(const Event& event);
// The event's fields, "event" first ("time" is the writer's to add).
nlohmann::json to_json(const Event& event);
// An event from its JSON (an object with a string "event"; nullopt otherwise).
std::optional<TimedEvent> parse_event(const nlohmann::json& json);

// Every event of a metrics.jsonl file, in order; DataError when it cannot be read.
std::vector<TimedEvent> read_events(const std::filesystem::path& file);

// The events appended to a metrics.jsonl file since the last call (a file that does not exist yet
// has none); a line not yet complete waits for the next call.
class EventTail {
 public:
  explicit EventTail(std::filesystem::path file) : file_(std::move(file)) {}
  std::vector<TimedEvent> read_new();

 private:
  std::filesystem::path file_;
  size_t offset_ = 0;
};

}  // namespace loco::metrics
