// The coordinator's record of an elastic run (cluster.elastic): who is a member, which membership
// epoch is current, and which round is being synchronized by whom (docs/failure-model.md).
//
// The data is cut into `slots` shards (cluster.workers); each member holds one slot and reads its
// shard from the slot's position. A round is convened when every active member has arrived at its
// end (or has been declared failed) and at least `min_workers` have: its participants are those
// members, plus any joiners waiting, who add nothing and receive the state after the round. A
// participant set that differs from the current epoch's, or a broken epoch, opens a new epoch
// (a fresh process group). A round completes when its first participant reports it done; then
// the slots of its contributors advance to the positions they arrived with. The shard of a slot no
// participant holds does not wait: the plan names a participant its reader, which reads it in
// turn with its own and reports where it stands. With a round grace (time-budgeted rounds) a round
// does not wait longer than the grace after its first arrival: the members still training are
// left out of it, and rejoin when they arrive.
//
// The work itself is tasks (tasks.h): each plan issues the next round's task for every shard that
// has a reader, leased to it; an arrival's claims (its own shard's position, and the shards it
// adopted) count only for tasks it leases; a round's completion completes them and advances the
// shards. A member that fails loses its leases, and its shard's task is issued again at the next
// plan, from where the shard stood.
//
// save/load carry the durable part across a coordinator restart (RUN/coordinator.json), restore
// and restart_from set the round and slots from a global checkpoint.
//
// A pure state machine: no I/O, no threads, no clock of its own (every call takes `now`), so tests
// drive it step by step. The coordinator calls it under its lock.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loco/metrics/events.h"
#include "loco/runtime/coordinator/protocol.h"
#include "loco/runtime/coordinator/tasks.h"

namespace loco::runtime {

struct MembershipOptions {
  int64_t slots = 1;
  int64_t min_workers = 1;
  std::chrono::milliseconds dead_after{10000};
  int64_t total_steps = 0;  // the round that reaches it is the last
  // Time-budgeted rounds (sync.round_seconds): how long a round waits, after its first arrival,
  // for the other active members; those still missing then are left out of it. None: wait for all.
  std::optional<std::chrono::milliseconds> round_grace;
  // What a round's task covers: H inner steps (sync.inner_steps), or with Streaming DiLoCo
  // (fragments > 1) the steps until the next fragment's sync starts; time-budgeted rounds run for
  // round_seconds instead.
  int64_t inner_steps = 1;
  int64_t fragments = 1;
  double round_seconds = 0;
  std::chrono::milliseconds heartbeat{1000};  // cluster.heartbeat_s: the members' interval
};

// Whether a worker named `name` ("host:pid" or "host[address]:pid") is process `pid` of `host`.
bool is_process(const std::string& name, const std::string& host, int64_t pid);
// The host part of a worker's name: all before its last ':' (the pid).
inline std::string host_of(const std::string& name) { return name.substr(0, name.rfind(':')); }

class MembershipTable {
 public:
  using Clock = std::chrono::steady_clock;
  explicit MembershipTable(MembershipOptions options);

  // A worker asks to join. Before the start it becomes an initial member; afterwards a joiner.
  // `wanted_slot` (-1: any) is honoured when that slot is vacant. Returns the member id and slot,
  // or nullopt with `why` set when every slot is taken.
  struct Joined {
    int64_t member = 0, slot = 0;
    bool joiner = false;
    data::SamplerPosition position;
  };
  std::optional<Joined> join(const std::string& name, int64_t wanted_slot, Clock::time_point now, std::string& why);
  // Training starts with the members joined so far (each starts from the same initial θ).
  void start(Clock::time_point now);
  bool started() const { return started_; }
  int64_t live_members() const;  // active and joining
  // Every slot has a live member (a join now is refused, and may succeed once one fails or leaves).
  bool full() const { return !complete_ && !vacant_slot(-1); }

  // `step` (when >= 0) is the member's inner steps so far: what a failure now would discard.
  // `closed`: the ranks of the current epoch's group whose connections to `member` closed (a
  // killed process's close at once), said by a member of that epoch: each of them that sent no
  // heartbeat for max(3 intervals, 1 interval + 1 s) is declared failed now, not after
  // dead_after. A live one, heartbeating, is not touched (a hint, not a verdict: no member can
  // evict another that lives).
  protocol::HeartbeatReply heartbeat(int64_t member, bool stopping, Clock::time_point now, int64_t step = -1,
                                     const std::vector<int64_t>& closed = {});
  // An arrival at a round's end (or a joiner's). Returns "go" when the round is (or was just)
  // convened with this member, "wait" until then.
  protocol::RoundReply arrive(const protocol::RoundRequest& request, bool stopping, Clock::time_point now);
  // A participant's report that the round completed with θ hashing to `params_hash`. Returns an
  // error text when its hash differs from the round's (the workers disagree on θ).
  std::optional<std::string> round_done(const protocol::RoundDone& report, Clock::time_point now);
  // The member ended (finished, stopped or failed, as it reported): it leaves, its slot is vacant.
  void leave(int64_t member, protocol::EndStatus status, Clock::time_point now);
  // A member known to be dead without waiting for its heartbeats (its process exited).
  void declare_failed(int64_t member, const std::string& how, Clock::time_point now);
  // Declares failed the members whose heartbeats stopped longer than dead_after ago. Meant to be
  // called often (the coordinator does, every 200 ms or so): after a gap longer than dead_after / 2
  // since the last call, every member's silence is forgiven once (the coordinator was stalled).
  void expire(Clock::time_point now);
  // The coordinator could not read its members in time (its request handling fell behind): every
  // member's silence so far is forgiven, as after a stall of its own.
  void forgive(Clock::time_point now);

  // Whether `member` ever joined.
  bool known(int64_t member) const { return members_.count(member) > 0; }
  // The live member that is process `pid` of `host` (named "host:pid" or "host[address]:pid").
  std::optional<int64_t> member_of_process(const std::string& host, int64_t pid) const;
  int64_t rounds_completed() const { return round_; }
  int64_t epoch() const { return epoch_; }
  bool training_complete() const { return complete_; }
  // Whether every member that trained has left (reported its end or failed).
  bool all_left() const;
  // Events for the log and metrics.jsonl since the last call (metrics/events.h: membership, failure,
  // collective_failed, round_retried, round_complete, join, slot_taken, leave, rejoin, left_out,
  // restored_from_checkpoint).
  std::vector<metrics::Event> take_events();
  // GET /v1/state's "elastic": epoch, rounds completed, the members (each with the round it waits
  // at, "arrived", -1 while training), the slots, and the round convened last.
  nlohmann::json describe() const;
  // The tasks: the next round's, leased to its readers, and those still being reported.
  const TaskTable& tasks() const { return tasks_; }
  // Per slot: the completed rounds in which nobody trained it (vacant, or its member left out).
  const std::vector<int64_t>& rounds_missed() const { return rounds_missed_; }
  // The durable part of the table (members, slots, epoch, the round under way), for the
  // coordinator's state file; `load` takes it back after a coordinator restart, giving every live
  // member a fresh dead_after allowance. Throws std::invalid_argument saying what is malformed.
  nlohmann::json save() const;
  void load(const nlohmann::json& saved, Clock::time_point now);

  // Whether members wait to receive the run's state and no active member is left to send it.
  bool orphaned() const;
  // Then the coordinator restarts the run from a global checkpoint (`step`; none: from the start):
  // the round counter and slot positions go back to it, and the waiting members become active
  // members told to load it (round action "restore").
  void restart_from(int64_t rounds_completed, std::optional<int64_t> step,
                    const std::vector<data::SamplerPosition>& positions, Clock::time_point now);

  // A resumed run starts from a global checkpoint: rounds completed, the step they reached, and
  // each slot's data position.
  void restore(int64_t rounds_completed, int64_t step, const std::vector<data::SamplerPosition>& positions);

 private:
  // A member's state. Legal transitions:
  //   kJoining -> kActive   at the start (an initial member), or once its first round completed
  //                         (a joiner, which then holds θ), or told to restore from a checkpoint
  //   kJoining -> kGone     it failed or left before that
  //   kActive  -> kGone     it failed, left, or its round completed without it (it must rejoin)
  // kGone is final: a worker that comes back joins as a new member.
  enum class State { kJoining, kActive, kGone };
  struct Member {
    std::string name;
    int64_t slot = -1;
    State state = State::kJoining;
    Clock::time_point last_seen;
    int64_t step = 0;         // inner steps done, as last reported
    int64_t synced_step = 0;  // the step of the last completed round it took part in
    std::optional<protocol::RoundRequest> arrival;  // waiting at a round's end
    std::optional<protocol::RoundReply> go;          // the round it was convened into
  };

  static const char* state_name(State state);
  // Slot -> the member that read its shard in a round, as [{"slot", "member"}].
  static nlohmann::json adopted_json(const std::map<int64_t, int64_t>& adopted);
  static std::vector<metrics::SlotReader> slot_readers(const std::map<int64_t, int64_t>& adopted);
  // Heard from `id` now: it is alive, and so are its leases.
  void touch(Member& m, int64_t id, Clock::time_point now);
  // The member is gone: its leases are open again, to be issued at the next plan.
  void drop(Member& m, int64_t id);
  // A task for `slot`'s shard of version `version` from `from`, starting at `step`, leased to
  // `member` (issued again when that shard's earlier task is open: its holder failed).
  int64_t issue_task(int64_t slot, int64_t version, const data::SamplerPosition& from, int64_t step, int64_t member,
                     Clock::time_point now);
  // The inner steps from `step` to the next synchronization (0 for time-budgeted rounds).
  int64_t steps_of_round_from(int64_t step) const;
  void fail_member(int64_t id, const std::string& how, double noticed_after_s, Clock::time_point now);
  // The inner steps a member took since the last completed round: lost when it fails.
  int64_t unsynchronized_steps(const Member& m) const;
  void try_convene(Clock::time_point now);
  std::vector<protocol::SlotInfo> slot_table() const;
  // Who reads each slot's shard until the next plan (slot -> member): a participant its own; the
  // slots no participant holds go to the participants in turn, in slot order (docs/failure-model.md).
  std::vector<int64_t> readers_for(const std::vector<int64_t>& participants) const;
  std::optional<int64_t> vacant_slot(int64_t wanted) const;
  void event(metrics::Event e) { events_.push_back(std::move(e)); }

  MembershipOptions options_;
  std::map<int64_t, Member> members_;
  std::vector<protocol::SlotInfo> slots_;  // committed positions (as of the last completed round)
  std::vector<int64_t> rounds_missed_;     // per slot: completed rounds nobody trained it in
  int64_t next_id_ = 0;
  bool started_ = false, complete_ = false;
  int64_t round_ = 0;                 // rounds completed
  int64_t round_step_ = 0;            // the step the last completed round reached
  int64_t epoch_ = 0;                 // current membership epoch (0: none formed yet)
  std::vector<int64_t> epoch_members_;
  bool epoch_broken_ = false;
  // The round convened last, until it completes.
  struct Convened {
    int64_t round = 0, epoch = 0, step = 0, contributors = 0;
    std::vector<int64_t> participants;
    std::vector<protocol::SlotInfo> slots;  // positions if it completes, and who reads each shard next
    std::vector<int64_t> done;              // participants that reported it complete
    std::map<int64_t, int64_t> adopted;     // slot -> the contributor that read its shard (no owner did)
    // The claims taken: task -> where its shard stands, completed when the round completes.
    std::map<int64_t, data::SamplerPosition> reports;
    std::vector<int64_t> issued;            // the next round's tasks this plan issued
  };
  std::optional<Convened> convened_;
  void take_claims(Convened& convened, const std::vector<int64_t>& active);
  // Whether round `next`, convened before and broken, still waits for a participant of that attempt.
  bool retry_waits(int64_t next) const;
  // The answer to the participant of rank `rank`: the round's group and the tasks it leases next.
  protocol::RoundReply go_reply(const Convened& convened, size_t rank) const;
  TaskTable tasks_;
  std::optional<uint64_t> last_hash_;     // of the last completed round
  std::optional<Clock::time_point> failure_noticed_;  // for the recovery time
  std::optional<Clock::time_point> last_expire_;      // the coordinator checks often; a long gap is its own stall
  std::optional<Clock::time_point> first_arrival_;    // at the end of the round not convened yet
  std::vector<metrics::Event> events_;
};

}  // namespace loco::runtime
