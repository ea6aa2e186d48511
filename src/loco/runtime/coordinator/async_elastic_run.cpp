#include "loco/runtime/coordinator/async_elastic_run.h"

#include <fmt/format.h>

#include <algorithm>

#include "loco/core/run_folder.h"
#include "loco/runtime/coordinator/membership.h"

namespace loco::runtime {

using protocol::EndStatus;
using protocol::Phase;
using protocol::ProtocolError;

AsyncElasticRun::AsyncElasticRun(const CoordinatorOptions& options, RunStatus& status, RunIdentity& identity,
                                 algorithms::AsyncOuterServer& outer)
    : options_(options), status_(status), identity_(identity), outer_(outer),
      events_(RunFolder(options.config.run.dir).metrics()),
      slots_(static_cast<size_t>(options.config.cluster.workers)) {
  // Nobody's until a member takes it: no exchange is taken for a slot without one, and a resumed
  // run's saved speeds count for nothing (each new member measures its own).
  for (int64_t slot = 0; slot < workers(); ++slot) outer_.seat(slot, algorithms::AsyncOuterServer::kVacant);
}

void AsyncElasticRun::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void AsyncElasticRun::write(const metrics::Event& event) {
  try {
    events_.write(event);
  } catch (const std::exception& e) {
    log(fmt::format("cannot write metrics.jsonl: {}", e.what()));
  }
}

int64_t AsyncElasticRun::live() const {
  return std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.holder && !s.holder->status; });
}

// Vacant: nobody ever held it, its member ended, or its member went silent past its cycle or made
// no exchange within cluster.join_timeout_s of its join and the start (then it is taken as gone now).
bool AsyncElasticRun::vacant(int64_t slot, Clock::time_point now) {
  auto& s = slots_[static_cast<size_t>(slot)];
  if (!s.holder || s.holder->status) return true;
  if (status_.phase() != Phase::kRunning) return false;
  const double quiet = s.holder->heartbeat ? std::chrono::duration<double>(now - *s.holder->heartbeat).count() : 0;
  if (quiet > options_.config.cluster.dead_after_s) {
    lose(slot, fmt::format("no heartbeat for {:.1f} s (cluster.dead_after_s = {:g} s)", quiet, options_.config.cluster.dead_after_s));
    return true;
  }
  if (outer_.silent(slot, now)) {
    lose(slot, fmt::format("silent past its cycle's time (sync.async_silence_s = {:g} s)", options_.config.sync.async_silence_s));
    return true;
  }
  const auto limit = std::chrono::duration<double>(options_.config.cluster.join_timeout_s);
  if (outer_.heard(slot) || now - std::max(s.holder->joined_at, started_) < limit) return false;
  lose(slot, fmt::format("no exchange within {:g} s (cluster.join_timeout_s) of its join and the start",
                         options_.config.cluster.join_timeout_s));
  return true;
}

// The slot asked for when it is vacant, else the first vacant one; Full when none is.
int64_t AsyncElasticRun::take_slot(const protocol::JoinRequest& request, Clock::time_point now) {
  if (request.rank >= workers()) {
    throw Refusal(fmt::format("slot {} is outside the run's {} (0..{})", request.rank, workers(), workers() - 1));
  }
  if (request.rank >= 0 && vacant(request.rank, now)) return request.rank;
  for (int64_t slot = 0; slot < workers(); ++slot) {
    if (vacant(slot, now)) return slot;
  }
  throw Full(fmt::format("{} cannot join yet: all {} slots are held by live members (a member that died frees its slot "
                         "when `loco launch` sees its process exit, else once its heartbeats stop for cluster.dead_after_s = "
                         "{:g} s, or it is silent for sync.async_silence_s = {:g} s)",
                         request.name, workers(), options_.config.cluster.dead_after_s, options_.config.sync.async_silence_s));
}

protocol::JoinReply AsyncElasticRun::join(const protocol::JoinRequest& request, const RunConfig& theirs) {
  refuse_join_when_over(status_);
  identity_.check(request, theirs);
  const bool started = status_.phase() == Phase::kRunning;
  if (started && outer_.totals().finished) throw Completed(fmt::format("{} cannot join: the run's steps are all done", request.name));
  if (!started && request.resume != options_.resume) {
    throw Refusal(options_.resume ? fmt::format("the run is resuming but {} was started without --resume", request.name)
                                  : fmt::format("{} asks to resume but the run starts fresh (start the coordinator "
                                                "with --resume)", request.name));
  }
  if (!started && !options_.resume && !request.checkpoints.empty()) {
    throw Refusal(fmt::format("{} holds checkpoints of slot {} of a run, but this one starts fresh: pass --resume to "
                              "continue it, or choose another run.dir (nothing was overwritten)", request.name, request.rank));
  }
  const int64_t slot = take_slot(request, Clock::now());
  Member member;
  member.id = next_member_++;
  member.name = request.name;
  member.joiner = started;
  member.joined_at = Clock::now();
  // Its own slot's checkpoints: it continues that shard from the newest (a restarted worker finds
  // its predecessor's; a resumed run's workers their own).
  if (slot == request.rank && !request.checkpoints.empty()) {
    member.resume_step = std::max_element(request.checkpoints.begin(), request.checkpoints.end(),
                                          [](const auto& a, const auto& b) { return a.step < b.step; })->step;
  }
  auto& s = slots_[static_cast<size_t>(slot)];
  if (s.holder) ended_.push_back(*s.holder);
  s.holder = member;
  outer_.seat(slot, member.id);
  for (const auto& note : outer_.take_notes()) log(note);
  write(metrics::MemberJoinEvent{{}, member.id, member.name, slot, member.joiner});
  log(fmt::format("{} joined as member {} (slot {}{}){}", member.name, member.id, slot,
                  member.resume_step ? fmt::format(", from its checkpoint of step {}", *member.resume_step) : "",
                  started ? ": it continues from the current parameters" : ""));
  empty_since_.reset();
  if (!started && live() == workers()) start("");
  protocol::JoinReply reply{slot, workers(), status_.run_id()};
  reply.member = member.id;
  reply.joiner = member.joiner;
  return reply;
}

void AsyncElasticRun::start(const std::string& why) {
  status_.enter(Phase::kRunning);
  started_ = Clock::now();
  log(fmt::format("training starts with {} of {} slots held{}: asynchronous DiLoCo, the others may join at any time", live(),
                  workers(), why));
}

protocol::StartReply AsyncElasticRun::start_reply(int64_t rank) const {
  protocol::StartReply reply;
  reply.phase = status_.phase();
  reply.error = status_.phase() == Phase::kFailed ? status_.reason() : "";
  if (rank < 0 || rank >= workers() || !slots_[static_cast<size_t>(rank)].holder) return reply;
  const auto& holder = *slots_[static_cast<size_t>(rank)].holder;
  reply.resume_step = holder.resume_step;
  if (status_.phase() == Phase::kRunning) {
    protocol::Task task;  // its slot's shard until the run's steps are done (their share is the outer state's)
    task.id = rank;
    task.shard = rank;
    task.steps = options_.config.train.steps;
    task.report = protocol::TaskReport::kRun;
    reply.task = task;
  }
  for (const auto& s : slots_) reply.host_workers += s.holder && !s.holder->status && host_of(s.holder->name) == host_of(holder.name) ? 1 : 0;
  return reply;
}

void AsyncElasticRun::lose(int64_t slot, const std::string& how) {
  auto& holder = *slots_[static_cast<size_t>(slot)].holder;
  holder.status = EndStatus::kFailed;
  holder.error = how;
  const bool was_training = outer_.release(slot, /*vacate=*/true);
  for (const auto& note : outer_.take_notes()) log(note);
  write(metrics::MemberFailureEvent{{}, holder.id, holder.name, slot, how, 0, was_training, 0});
  log(fmt::format("member {} ({}) of slot {} is gone: {}; the slot is vacant", holder.id, holder.name, slot, how));
}

void AsyncElasticRun::done(const protocol::DoneRequest& request) {
  if (request.rank < 0 || request.rank >= workers()) throw ProtocolError(fmt::format("slot {} is not one of this run's", request.rank));
  auto& s = slots_[static_cast<size_t>(request.rank)];
  Member* member = s.holder && s.holder->id == request.member ? &*s.holder : nullptr;
  if (member == nullptr) {  // one whose slot another holds now (it was taken as gone)
    const auto it = std::find_if(ended_.begin(), ended_.end(), [&](const Member& m) { return m.id == request.member; });
    if (it == ended_.end()) throw ProtocolError(fmt::format("member {} never held slot {}", request.member, request.rank));
    member = &*it;
  }
  const bool was_live = !member->status;
  member->reported = true;
  member->status = request.status;
  member->error = request.error;
  member->summary = request.summary;
  write(metrics::MemberLeaveEvent{{}, member->id, member->name, request.rank, std::string(protocol::to_string(request.status))});
  log(fmt::format("member {} (slot {}) {}{}", member->id, request.rank, protocol::to_string(request.status),
                  request.error.empty() ? "" : ": " + request.error));
  if (was_live && request.status != EndStatus::kFinished && s.holder && &*s.holder == member && outer_.release(request.rank, /*vacate=*/true)) {
    for (const auto& note : outer_.take_notes()) log(note);
  }
  check_end(Clock::now());
}

void AsyncElasticRun::process_exited(const std::string& host, int64_t pid, int status, Clock::time_point now) {
  (void)now;
  for (int64_t slot = 0; slot < workers(); ++slot) {
    const auto& s = slots_[static_cast<size_t>(slot)];
    if (s.holder && !s.holder->status && is_process(s.holder->name, host, pid)) {
      lose(slot, fmt::format("its process exited with status {}", status));
    }
  }
}

protocol::HeartbeatReply AsyncElasticRun::heartbeat(const protocol::HeartbeatRequest& request, Clock::time_point now) {
  protocol::HeartbeatReply reply;
  reply.member = false;
  reply.stopping = status_.stopping();
  for (auto& s : slots_) {
    if (s.holder && !s.holder->status && s.holder->id == request.member) {
      s.holder->heartbeat = now;
      reply.member = true;
    }
  }
  return reply;
}

void AsyncElasticRun::hold_off(std::chrono::milliseconds behind, Clock::time_point now) {
  if (behind < kBehind) return;
  for (auto& s : slots_) {
    if (s.holder && s.holder->heartbeat) s.holder->heartbeat = now;
  }
}

// Without every slot held by cluster.join_timeout_s, training starts with the quorum
// (cluster.min_workers), or the run fails.
void AsyncElasticRun::check_start(Clock::time_point now) {
  if (status_.phase() != Phase::kWaiting) return;
  const auto limit = std::chrono::duration<double>(options_.config.cluster.join_timeout_s);
  if (now - created_ < limit) return;
  if (live() >= options_.config.cluster.min_workers) {
    start(fmt::format(" (cluster.join_timeout_s = {:g} s passed)", options_.config.cluster.join_timeout_s));
    return;
  }
  if (status_.fail(fmt::format("only {} of the {} workers needed (cluster.min_workers) joined within {:g} s (cluster.join_timeout_s)",
                               live(), options_.config.cluster.min_workers, options_.config.cluster.join_timeout_s))) {
    log("run failed: " + status_.reason());
  }
}

// Members silent past their cycle are gone; once nobody holds a slot the run ends: finished when
// its steps are all done, stopped on request, else it waits cluster.join_timeout_s for a worker.
void AsyncElasticRun::check_end(Clock::time_point now) {
  if (status_.phase() != Phase::kRunning) return;
  const auto stall = std::chrono::duration<double>(options_.config.cluster.dead_after_s / 2);
  if (last_look_ && now - *last_look_ > stall) hold_off(std::chrono::hours(1), now);
  last_look_ = now;
  for (int64_t slot = 0; slot < workers(); ++slot) (void)vacant(slot, now);
  if (live() > 0) {
    empty_since_.reset();
    return;
  }
  const auto totals = outer_.totals();
  if (totals.finished || status_.stopping()) {
    status_.enter(Phase::kFinished);
    return;
  }
  if (!empty_since_) empty_since_ = now;
  const auto limit = std::chrono::duration<double>(options_.config.cluster.join_timeout_s);
  if (now - *empty_since_ < limit) return;
  if (status_.fail(fmt::format("every worker left with {} of the run's {} inner steps done, and none took a slot within "
                               "{:g} s (cluster.join_timeout_s); continue it with --resume",
                               totals.steps_done, totals.budget, options_.config.cluster.join_timeout_s))) {
    log("run failed: " + status_.reason());
  }
}

CoordinatorResult AsyncElasticRun::result() const {
  // Like any elastic run it fails only as a whole: members that failed were replaced or done without.
  CoordinatorResult result;
  result.message = status_.reason();
  bool any_stopped = false;
  auto add = [&](const Member& m) {
    if (!m.reported) return;  // (one lost without a word wrote no summary)
    result.summaries.push_back(metrics::summary_from_json(m.summary));
    any_stopped = any_stopped || m.status == EndStatus::kStopped;
  };
  for (const auto& m : ended_) add(m);
  for (const auto& s : slots_) {
    if (s.holder) add(*s.holder);
  }
  const bool complete = outer_.totals().finished;
  result.outcome = status_.phase() == Phase::kFailed                      ? RunOutcome::kFailed
                   : !complete && (any_stopped || status_.stopping()) ? RunOutcome::kStopped
                                                                          : RunOutcome::kFinished;
  return result;
}

nlohmann::json AsyncElasticRun::describe() const {
  nlohmann::json list = nlohmann::json::array(), missing = nlohmann::json::array();
  for (size_t slot = 0; slot < slots_.size(); ++slot) {
    const auto& s = slots_[slot];
    if (!s.holder || s.holder->status) missing.push_back(slot);
    if (!s.holder) continue;
    list.push_back({{"rank", slot}, {"member", s.holder->id}, {"name", s.holder->name},
                    {"status", s.holder->status ? protocol::to_string(*s.holder->status) : "training"}});
  }
  return {{"members", list}, {"missing", missing}};
}

std::vector<std::string> AsyncElasticRun::status_lines() const {
  std::vector<std::string> lines;
  for (size_t slot = 0; slot < slots_.size(); ++slot) {
    const auto& s = slots_[slot];
    if (!s.holder) {
      lines.push_back(fmt::format("slot {}: vacant", slot));
      continue;
    }
    const std::string_view doing = s.holder->status ? protocol::to_string(*s.holder->status)
                                   : status_.phase() == Phase::kWaiting ? "joined"
                                                                        : "training";
    lines.push_back(fmt::format("slot {}: member {} ({}) {}", slot, s.holder->id, s.holder->name, doing));
  }
  return lines;
}

}  // namespace loco::runtime
