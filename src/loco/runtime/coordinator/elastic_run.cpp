#include "loco/runtime/coordinator/elastic_run.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "loco/core/hash.h"
#include "loco/core/run_folder.h"
#include "loco/runtime/coordinator/events.h"
#include "loco/runtime/store/checkpoint.h"

namespace loco::runtime {
namespace {

using protocol::Phase;
using protocol::ProtocolError;

// A worker waiting for a slot asks at least this often (its backoff stops at 2 s); quieter, it is
// no longer counted as waiting.
constexpr auto kWaiterSilence = std::chrono::seconds(5);

MembershipOptions membership_options(const RunConfig& config) {
  MembershipOptions o;
  o.slots = config.cluster.workers;
  o.min_workers = config.cluster.min_workers;
  o.dead_after = std::chrono::milliseconds(static_cast<int64_t>(config.cluster.dead_after_s * 1000));
  o.heartbeat = std::chrono::milliseconds(static_cast<int64_t>(config.cluster.heartbeat_s * 1000));
  o.total_steps = config.train.steps;
  if (config.sync.round_seconds > 0) {
    o.round_grace = std::chrono::milliseconds(static_cast<int64_t>(config.sync.round_grace_s * 1000));
  }
  o.inner_steps = config.sync.inner_steps;
  o.fragments = config.sync.algorithm == Algorithm::kStreaming ? config.sync.fragments : 1;
  o.round_seconds = config.sync.round_seconds;
  return o;
}

// The rounds past `after` whose round_complete the tail of metrics.jsonl records (its last 8 MiB:
// a predecessor's last events are there). Nothing when the file cannot be read.
std::set<int64_t> rounds_recorded_after(const fs::path& metrics, int64_t after) {
  constexpr uint64_t kTail = uint64_t{8} << 20;
  std::set<int64_t> out;
  std::string text;
  try {
    text = read_file_tail(metrics, kTail, "coordinator");
  } catch (const Error&) {
    return out;
  }
  size_t at = text.size() == kTail ? text.find('\n') + 1 : 0;  // a line cut by the tail is not read
  while (at < text.size()) {
    const auto end = std::min(text.find('\n', at), text.size());
    const std::string_view line(text.data() + at, end - at);
    at = end + 1;
    if (line.find("\"round_complete\"") == std::string_view::npos) continue;
    const auto e = nlohmann::json::parse(line, nullptr, false);
    if (!e.is_object() || e.value("event", "") != "round_complete" || !e.contains("round") || !e["round"].is_number_integer()) continue;
    if (const auto round = e["round"].get<int64_t>(); round > after) out.insert(round);
  }
  return out;
}

}  // namespace

ElasticRun::ElasticRun(const CoordinatorOptions& options, RunStatus& status, RunIdentity& identity)
    : options_(options),
      status_(status),
      identity_(identity),
      table_(membership_options(options.config)),
      events_(RunFolder(options.config.run.dir).metrics()),
      state_file_(RunFolder(options.config.run.dir).coordinator_state()) {
  if (options_.resume) {
    restore_from_checkpoint();
    persist();  // at once: the file no longer says how the run ended before (a worker reads "finished" there)
  } else if (fs::exists(state_file_)) {
    restore_live_state();
  }
}

void ElasticRun::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

// A coordinator started again on a run whose coordinator died (RUN/coordinator.json says it was
// under way) takes its membership back; its workers kept training and retrying
// (cluster.coordinator_timeout_s), and carry on with it.
void ElasticRun::restore_live_state() {
  nlohmann::json saved;
  try {
    saved = nlohmann::json::parse(read_file_beneath(state_file_.parent_path(), state_file_.filename(), "coordinator", kMaxRunTextBytes));
    // (Before anything copies or dumps it: both recurse, one call per level.)
    if (protocol::nested_deeper_than(saved, protocol::kMaxJsonDepth)) {
      throw ProtocolError(fmt::format("malformed: nested deeper than {} levels", protocol::kMaxJsonDepth));
    }
    const auto was = protocol::parse_phase(saved.at("phase").get<std::string>());
    if (was == Phase::kFinished || was == Phase::kFailed) {
      throw ConfigError("coordinator", fmt::format("{} holds a {} run ({}); pass --resume to continue it from its "
                                                   "checkpoints, or choose another run.dir", options_.config.run.dir,
                                                   protocol::to_string(was), state_file_.string()));
    }
    table_.load(saved.at("table"), Clock::now());
    status_.set_run_id(saved.at("run_id").get<std::string>());
    status_.set_stopping(saved.at("stopping").get<bool>());
  } catch (const nlohmann::json::exception& e) {
    throw DataError("coordinator", fmt::format("{}: malformed ({}); delete it to start a new run there, or continue from "
                                               "the checkpoints with --resume", state_file_.string(), e.what()));
  } catch (const ProtocolError& e) {
    throw DataError("coordinator", fmt::format("{}: {}; delete it to start a new run there, or continue from the "
                                               "checkpoints with --resume", state_file_.string(), e.what()));
  } catch (const std::invalid_argument& e) {
    throw DataError("coordinator", fmt::format("{}: {}; delete it to start a new run there, or continue from the "
                                               "checkpoints with --resume", state_file_.string(), e.what()));
  }
  if (table_.started()) status_.enter(Phase::kRunning);
  recorded_rounds_ = rounds_recorded_after(RunFolder(options_.config.run.dir).metrics(), table_.rounds_completed());
  log(fmt::format("continuing run {} from {}: epoch {}, {} rounds completed, {} live members (each has "
                  "cluster.dead_after_s to be heard from)", status_.run_id(), state_file_.string(), table_.epoch(),
                  table_.rounds_completed(), table_.live_members()));
  events_.write(metrics::CoordinatorRestoredEvent{{}, table_.epoch(), table_.rounds_completed(), table_.live_members()});
  saved_state_ = saved.dump();
}

// Writes RUN/coordinator.json when the durable membership changed (atomically: a crash leaves the
// previous one). Called after every change, before any answer that depends on it.
void ElasticRun::persist() {
  const nlohmann::json state = {{"format_version", 1}, {"run_id", status_.run_id()},
                                {"phase", protocol::to_string(status_.phase())}, {"stopping", status_.stopping()},
                                {"table", table_.save()}};
  auto text = state.dump();
  if (text == saved_state_) return;
  try {
    write_file_atomic(state_file_, text + "\n", "coordinator", Readers::kOwner);
    saved_state_ = std::move(text);
    state_write_failed_ = false;
  } catch (const std::exception& e) {
    if (!state_write_failed_) log(fmt::format("cannot save the membership ({}); a restarted coordinator would not find it", e.what()));
    state_write_failed_ = true;
  }
}

// A resumed elastic run continues from a global checkpoint (docs/failure-model.md): the newest one
// of a round for which every slot's inner state was saved too (then the run continues as if never
// stopped), else the newest. Its round and slot positions become the table's.
void ElasticRun::restore_from_checkpoint() {
  const RunFolder run(options_.config.run.dir);
  const auto global = CheckpointStore(run.checkpoints(), 1).steps();
  if (global.empty()) {
    throw DataError("coordinator", fmt::format("--resume: {} holds no global checkpoint", run.checkpoints().string()));
  }
  std::vector<std::vector<int64_t>> slot_steps;
  for (int64_t s = 0; s < workers(); ++s) slot_steps.push_back(CheckpointStore(run.slot_state(s), 1).steps());
  const auto has = [](const std::vector<int64_t>& steps, int64_t step) {
    return std::find(steps.begin(), steps.end(), step) != steps.end();
  };
  const auto complete = [&](int64_t step) {
    return std::all_of(slot_steps.begin(), slot_steps.end(), [&](const auto& steps) { return has(steps, step); });
  };
  auto chosen = std::find_if(global.rbegin(), global.rend(), complete);
  const int64_t step = chosen != global.rend() ? *chosen : global.back();
  const auto [round, positions] = read_global_checkpoint(step);
  table_.restore(round, step, positions);
  resume_step_ = step;
  std::vector<int64_t> fresh;
  for (int64_t s = 0; s < workers(); ++s) {
    if (!has(slot_steps[static_cast<size_t>(s)], step)) fresh.push_back(s);
  }
  log(fmt::format("resuming from {} (round {}, step {}){}", CheckpointStore(run.checkpoints(), 1).at(step).string(), round,
                  step, fresh.empty() ? "" : fmt::format("; slot(s) {} have no inner state of that step: their AdamW "
                                                         "moments start from the leader's", fmt::join(fresh, ", "))));
  events_.write(metrics::RunResumedEvent{{}, step, round, fresh});
}

std::pair<int64_t, std::vector<data::SamplerPosition>> ElasticRun::read_global_checkpoint(int64_t step) const {
  const auto checkpoint = load_checkpoint(CheckpointStore(RunFolder(options_.config.run.dir).checkpoints(), 1).at(step));
  const auto& run = checkpoint.state.run;
  if (!run || static_cast<int64_t>(run->shards.size()) != workers()) {
    throw DataError("coordinator", fmt::format("{} is not the global checkpoint of an elastic run of {} slots: its "
                                               "state.json has {} (the run section: rounds and each slot's data position)",
                                               checkpoint.dir.string(), workers(),
                                               run ? fmt::format("{} slots in its run section", run->shards.size())
                                                   : std::string("no run section")));
  }
  return {run->rounds, run->shards};
}

// Members wait for the run's state and no active member is left to send it (every one failed):
// they continue from the newest global checkpoint instead (docs/failure-model.md).
void ElasticRun::restart_orphans() {
  const fs::path checkpoints = RunFolder(options_.config.run.dir).checkpoints();
  const auto steps = CheckpointStore(checkpoints, 1).steps();
  try {
    if (steps.empty()) {
      if (table_.rounds_completed() > 0) {
        fail(fmt::format("every worker that held the run's state failed, and {} has no global checkpoint to continue "
                         "from", checkpoints.string()));
        return;
      }
      table_.restart_from(0, std::nullopt, std::vector<data::SamplerPosition>(static_cast<size_t>(workers())), Clock::now());
      log("every worker that held the run's state failed before the first round: the waiting workers start it afresh");
    } else {
      const auto [round, positions] = read_global_checkpoint(steps.back());
      // A member given up on may still save newer checkpoints and prune: this one must stay until
      // every restarting member has loaded it (kept until another restart or the run's end).
      try {
        CheckpointStore(checkpoints, 1).pin(steps.back());
      } catch (const Error& e) {
        log(fmt::format("cannot pin the checkpoint against pruning (a member that loads it late may join again "
                        "instead): {}", e.what()));
      }
      table_.restart_from(round, steps.back(), positions, Clock::now());
      log(fmt::format("every worker that held the run's state failed: the waiting workers continue from the global "
                      "checkpoint of step {} (round {})", steps.back(), round));
    }
  } catch (const Error& e) {
    fail(fmt::format("every worker that held the run's state failed, and the global checkpoint cannot be read: {}", e.what()));
    return;
  }
  flush_events();
}

// Writes the table's events to the log and metrics.jsonl, then saves the table.
void ElasticRun::flush_events() {
  for (const auto& e : table_.take_events()) {
    if (const auto* done = std::get_if<metrics::RoundCompleteEvent>(&e); done != nullptr && recorded_rounds_.erase(done->round)) {
      log(fmt::format("round {} completed again; metrics.jsonl records it already (the coordinator before this one wrote it "
                      "and died before it saved the table): not recorded twice", done->round));
      continue;
    }
    log(describe_event(e));
    try {
      events_.write(e);
    } catch (const std::exception& error) {
      log(fmt::format("cannot write metrics.jsonl: {}", error.what()));
    }
  }
  persist();
}

void ElasticRun::fail(const std::string& why) {
  if (!status_.fail(why)) return;
  persist();
  log("run failed: " + why);
}

void ElasticRun::hold_off(std::chrono::milliseconds behind, Clock::time_point now) {
  if (behind < kBehind) {
    if (holding_off_) log("request handling caught up");
    holding_off_ = false;
    return;
  }
  if (!holding_off_) {
    log(fmt::format("request handling is {:.1f} s behind: members' silence is not held against them until it catches up",
                    std::chrono::duration<double>(behind).count()));
  }
  holding_off_ = true;
  table_.forgive(now);
}

void ElasticRun::start(const std::string& why) {
  table_.start(Clock::now());
  status_.enter(Phase::kRunning);
  log(fmt::format("training starts with {} of {} workers{}", table_.live_members(), workers(), why));
  flush_events();
}

protocol::JoinReply ElasticRun::join(const protocol::JoinRequest& request, const RunConfig& theirs) {
  refuse_join_when_over(status_);  // (a worker whose link was cut through the last round comes back to a finished run)
  identity_.check(request, theirs);
  if (!shards_hash_) {
    shards_hash_ = request.shards_hash;
  } else if (*shards_hash_ != request.shards_hash) {
    throw Refusal(fmt::format("{} divided the data into shards differently ({} vs the run's {}); k-means on different "
                              "hardware can do this: use data.shard = \"iid\" or \"label\"", request.name,
                              hex64(request.shards_hash), hex64(*shards_hash_)));
  }
  std::string why;
  table_.expire(Clock::now());  // a silent member's slot is vacant now, whoever else is asking
  auto joined = table_.join(request.name, request.rank, Clock::now(), why);
  if (!joined && table_.full()) {
    slot_waiters_[request.name] = Clock::now();
    throw Full(fmt::format("{} cannot join yet: {}", request.name, why));
  }
  slot_waiters_.erase(request.name);
  if (!joined && table_.training_complete()) throw Completed(fmt::format("{} cannot join: {}", request.name, why));
  if (!joined) throw Refusal(fmt::format("{} cannot join: {}", request.name, why));
  flush_events();
  if (status_.phase() == Phase::kWaiting && table_.live_members() == workers()) start("");
  protocol::JoinReply reply{joined->slot, workers(), status_.run_id()};
  reply.member = joined->member;
  reply.joiner = joined->joiner;
  reply.position = joined->position;
  if (!joined->joiner) reply.resume_step = resume_step_;  // the initial members load the checkpoint
  return reply;
}

protocol::StartReply ElasticRun::start_reply(int64_t rank) const {
  (void)rank;  // every member starts alike; a joiner's state comes at its first round
  protocol::StartReply reply;
  reply.phase = status_.phase();
  reply.epoch = table_.epoch();
  reply.error = status_.phase() == Phase::kFailed ? status_.reason() : "";
  return reply;
}

void ElasticRun::done(const protocol::DoneRequest& request) {
  if (request.member < 0 || !table_.known(request.member)) {
    throw ProtocolError(fmt::format("member {} is not a member of this run", request.member));
  }
  table_.leave(request.member, request.status, Clock::now());
  ended_[request.member] = Ended{request.rank, request.status, request.error, request.summary};
  log(fmt::format("member {} {}{}", request.member, protocol::to_string(request.status),
                  request.error.empty() ? "" : ": " + request.error));
  flush_events();
  check_end(Clock::now());
}

protocol::HeartbeatReply ElasticRun::heartbeat(const protocol::HeartbeatRequest& request, Clock::time_point now) {
  table_.expire(now);
  // The closed ranks count only for the current epoch's group (an older one's close as it ends).
  const bool current = request.epoch >= 0 && request.epoch == table_.epoch();
  const auto reply = table_.heartbeat(request.member, status_.stopping(), now, request.step,
                                      current ? request.closed : std::vector<int64_t>{});
  flush_events();
  return reply;
}

protocol::RoundReply ElasticRun::arrive(const protocol::RoundRequest& request, Clock::time_point now) {
  table_.expire(now);
  auto reply = table_.arrive(request, status_.stopping(), now);
  flush_events();
  if (status_.phase() == Phase::kFailed) {
    reply.action = protocol::RoundAction::kStop;
    reply.reason = "the run failed: " + status_.reason();
  }
  return reply;
}

bool ElasticRun::round_done(const protocol::RoundDone& report, Clock::time_point now) {
  auto error = table_.round_done(report, now);
  flush_events();
  if (error) fail(*error);
  return !error;
}

void ElasticRun::process_exited(const std::string& host, int64_t pid, int status, Clock::time_point now) {
  if (auto member = table_.member_of_process(host, pid)) {
    table_.declare_failed(*member, fmt::format("its process exited with status {}", status), now);
    flush_events();
  }
}

// Without every slot filled by cluster.join_timeout_s, training starts with the quorum
// (cluster.min_workers), or the run fails naming who is missing.
void ElasticRun::check_start(Clock::time_point now) {
  if (status_.phase() != Phase::kWaiting) return;
  const auto limit = std::chrono::duration<double>(options_.config.cluster.join_timeout_s);
  if (now - created_ < limit) return;
  if (table_.live_members() >= options_.config.cluster.min_workers) {
    start(fmt::format(" (cluster.join_timeout_s = {:g} s passed; the others may join later)",
                      options_.config.cluster.join_timeout_s));
    return;
  }
  fail(fmt::format("only {} of the {} workers needed (cluster.min_workers) joined within {:g} s (cluster.join_timeout_s)",
                   table_.live_members(), options_.config.cluster.min_workers, options_.config.cluster.join_timeout_s));
}

// The end of an elastic run: every member has left (finished, stopped, failed).
void ElasticRun::check_end(Clock::time_point now) {
  if (status_.phase() != Phase::kRunning) return;
  table_.expire(now);
  flush_events();
  if (table_.orphaned()) restart_orphans();
  if (!table_.all_left()) return;
  // A worker that found the run full (it asked before the last members were declared failed) is
  // about to take a slot: it continues the run (from the global checkpoint) rather than finding it
  // failed.
  std::erase_if(slot_waiters_, [&](const auto& w) { return now - w.second > kWaiterSilence; });
  if (!table_.training_complete() && !status_.stopping() && !slot_waiters_.empty()) return;
  if (!table_.training_complete() && !status_.stopping()) {
    fail(fmt::format("every worker left before training completed ({} rounds done); resume with --resume",
                     table_.rounds_completed()));
    return;
  }
  // Not silent: a shard whose slot sat idle for rounds was trained on less than the others.
  const auto& missed = table_.rounds_missed();
  for (size_t s = 0; s < missed.size(); ++s) {
    if (missed[s] > 0) {
      log(fmt::format("slot {} was idle (vacant, or its worker left out) in {} of {} rounds: its shard was trained on "
                      "that much less than the others", s, missed[s], table_.rounds_completed()));
    }
  }
  events_.write(metrics::SlotsSummaryEvent{{}, table_.rounds_completed(), missed});
  CheckpointStore(RunFolder(options_.config.run.dir).checkpoints(), 1).unpin();
  status_.enter(Phase::kFinished);
  persist();
}

CoordinatorResult ElasticRun::result() const {
  // An elastic run fails only as a whole: members that failed were replaced or done without.
  CoordinatorResult result;
  result.message = status_.reason();
  bool any_stopped = false;
  for (const auto& [id, m] : ended_) {
    result.summaries.push_back(metrics::summary_from_json(m.summary));
    if (m.status == protocol::EndStatus::kStopped) any_stopped = true;
  }
  // A run whose every round was done is finished, though a member ended "stopped": a replacement
  // that joined in the last round had nothing left to train (the chaos soak's coordinator exited
  // 130 on a completed run when one did).
  result.outcome = status_.phase() == Phase::kFailed                                      ? RunOutcome::kFailed
                   : !table_.training_complete() && (any_stopped || status_.stopping()) ? RunOutcome::kStopped
                                                                                          : RunOutcome::kFinished;
  return result;
}

nlohmann::json ElasticRun::describe() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [id, m] : ended_) {
    list.push_back({{"member", id}, {"slot", m.slot}, {"status", protocol::to_string(m.status)}});
  }
  return {{"members", list}, {"missing", nlohmann::json::array()}, {"elastic", table_.describe()}};
}

std::vector<std::string> ElasticRun::status_lines() const {
  return {fmt::format("elastic: epoch {}, {} rounds completed, {} live members of {} slots", table_.epoch(),
                      table_.rounds_completed(), table_.live_members(), workers())};
}

}  // namespace loco::runtime
