#include "loco/runtime/coordinator/fixed_run.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

#include "loco/algorithms/async_outer.h"
#include "loco/core/command.h"
#include "loco/core/hash.h"
#include "loco/runtime/coordinator/membership.h"

namespace loco::runtime {

using protocol::EndStatus;
using protocol::Phase;
using protocol::ProtocolError;

FixedRun::FixedRun(const CoordinatorOptions& options, RunStatus& status, RunIdentity& identity,
                   algorithms::AsyncOuterServer* outer)
    : options_(options), status_(status), identity_(identity), outer_(outer),
      members_(static_cast<size_t>(options.config.cluster.workers)) {}

void FixedRun::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

std::vector<int64_t> FixedRun::missing() const {
  std::vector<int64_t> out;
  for (size_t r = 0; r < members_.size(); ++r) {
    if (!members_[r]) out.push_back(static_cast<int64_t>(r));
  }
  return out;
}

int64_t FixedRun::take_rank(const protocol::JoinRequest& request) const {
  const int64_t rank = request.rank;
  if (rank >= workers()) {
    throw Refusal(fmt::format("rank {} is outside the run's {} workers (0..{})", rank, workers(), workers() - 1));
  }
  if (rank >= 0 && members_[static_cast<size_t>(rank)]) {
    const auto& holder = *members_[static_cast<size_t>(rank)];
    throw Refusal(fmt::format("rank {} is already taken by {}{}", rank, holder.name,
                              holder.request.rank < 0 ? " (which asked for any rank: give every worker a --rank, or none)" : ""));
  }
  if (rank >= 0) return rank;
  const auto free = missing();
  if (free.empty()) throw Refusal(fmt::format("the run already has its {} workers", workers()));
  return free.front();
}

protocol::JoinReply FixedRun::join(const protocol::JoinRequest& request, const RunConfig& theirs) {
  if (status_.phase() != Phase::kWaiting) {
    throw Refusal(fmt::format("the run is {} ({}); this version does not take workers after the start",
                              protocol::to_string(status_.phase()),
                              status_.phase() == Phase::kFailed ? status_.reason() : fmt::format("{} workers", workers())));
  }
  identity_.check(request, theirs);
  if (request.resume != options_.resume) {
    throw Refusal(options_.resume ? fmt::format("the run is resuming but {} was started without --resume", request.name)
                                  : fmt::format("{} asks to resume but the run starts fresh (start the coordinator "
                                                "with --resume)", request.name));
  }
  const int64_t rank = take_rank(request);
  if (request.resume && request.rank < 0) throw Refusal("a resuming worker must say its rank (--rank)");
  members_[static_cast<size_t>(rank)] = Member{request.name, request, std::nullopt, "", nlohmann::json::object()};
  const auto still_missing = missing();
  log(fmt::format("worker {} joined from {} ({}/{})", rank, request.name,
                  workers() - static_cast<int64_t>(still_missing.size()), workers()));
  if (still_missing.empty()) {
    if (options_.resume) plan_resume();
    if (status_.phase() == Phase::kWaiting) start();
  }
  return {rank, workers(), status_.run_id()};
}

void FixedRun::start() {
  status_.enter(Phase::kRunning);
  for (int64_t rank = 0; rank < workers(); ++rank) {
    protocol::Task task;
    task.scope = protocol::TaskScope::kModel;
    task.version = resume_steps_.count(rank) > 0 ? resume_steps_.at(rank) : 0;
    task.shard = rank;
    task.steps = options_.config.train.steps;
    task.report = protocol::TaskReport::kRun;
    const int64_t id = tasks_.issue(task);
    tasks_.lease(id, rank, std::nullopt);
    task_of_[rank] = id;
  }
  log(fmt::format("all {} workers joined: training starts (epoch 0), one task each", workers()));
}

namespace {

// "worker 1 holds no checkpoint", "workers 1, 2 hold no checkpoint".
std::string holding_none(const std::vector<int64_t>& ranks) {
  return ranks.size() > 1 ? fmt::format("workers {} hold no checkpoint", fmt::join(ranks, ", "))
                          : fmt::format("worker {} holds no checkpoint", ranks.front());
}

}  // namespace

// Each worker resumes from its newest checkpoint whose global parameters all workers have a
// checkpoint of; among such parameters, the newest set (the one losing least work) wins. A worker
// that holds no checkpoint (it stopped before its first, or lost them) resumes from a copy of the
// furthest checkpoint of that set, which its holder sends it over the run's group before training.
void FixedRun::plan_resume() {
  if (options_.config.sync.async) {
    plan_async_resume();
    return;
  }
  std::map<uint64_t, std::vector<int64_t>> newest;  // global hash -> newest step per rank (-1: none)
  std::vector<int64_t> without;                     // ranks holding no checkpoint
  for (size_t r = 0; r < members_.size(); ++r) {
    const auto& checkpoints = members_[r]->request.checkpoints;
    if (checkpoints.empty()) without.push_back(static_cast<int64_t>(r));
    for (const auto& c : checkpoints) {
      auto& steps = newest.try_emplace(c.global_hash, std::vector<int64_t>(members_.size(), -1)).first->second;
      steps[r] = std::max(steps[r], c.step);
    }
  }
  const bool communicates = options_.config.sync.algorithm != Algorithm::kLocal && options_.config.sync.algorithm != Algorithm::kNone;
  if (newest.empty() || (!without.empty() && !communicates)) {
    no_state_to_resume(without);
    return;
  }
  std::optional<std::pair<int64_t, uint64_t>> best;  // (least step among the ranks that hold checkpoints, hash)
  for (const auto& [hash, steps] : newest) {
    int64_t least = std::numeric_limits<int64_t>::max();
    for (size_t r = 0; r < steps.size(); ++r) {
      if (!members_[r]->request.checkpoints.empty()) least = std::min(least, steps[r]);
    }
    if (least >= 0 && (!best || least > best->first)) best = {least, hash};
  }
  if (!best) {
    std::vector<std::string> listing;
    for (size_t r = 0; r < members_.size(); ++r) {
      std::vector<std::string> entries;
      for (const auto& c : members_[r]->request.checkpoints) entries.push_back(fmt::format("{} ({})", c.step, hex64(c.global_hash)));
      listing.push_back(fmt::format("worker {}: {}", r, fmt::join(entries, ", ")));
    }
    if (status_.fail(fmt::format("--resume: the workers' checkpoints share no global parameters (step (hash)): {}",
                                 fmt::join(listing, "; ")))) {
      log("run failed: " + status_.reason());
    }
    return;
  }
  auto steps = newest.at(best->second);
  if (!without.empty()) {
    const auto donor = std::max_element(steps.begin(), steps.end()) - steps.begin();  // the furthest; the lowest rank of ties
    copy_ = protocol::CheckpointCopy{donor, without};
    for (const int64_t r : without) steps[static_cast<size_t>(r)] = steps[static_cast<size_t>(donor)];
    log(fmt::format("{}: {} from a copy of worker {}'s of step {}, sent over the run's group (the steps since the last "
                    "checkpoint of each are lost)",
                    holding_none(without), without.size() > 1 ? "they resume" : "it resumes", donor,
                    steps[static_cast<size_t>(donor)]));
  }
  for (size_t r = 0; r < members_.size(); ++r) resume_steps_[static_cast<int64_t>(r)] = steps[r];
  log(fmt::format("resuming: worker steps {} (global parameters {})", fmt::join(steps, ", "), hex64(best->second)));
}

// Asynchronous DiLoCo: the global parameters are the coordinator's outer state (outer_service.h),
// so each worker resumes from its own newest checkpoint (its inner state and data position), and
// one that holds none starts its shard afresh; either way it continues from the outer state's θ.
void FixedRun::plan_async_resume() {
  std::vector<std::string> steps;
  for (size_t r = 0; r < members_.size(); ++r) {
    const auto& checkpoints = members_[r]->request.checkpoints;
    if (checkpoints.empty()) {
      steps.push_back("none");
      continue;
    }
    const auto newest = std::max_element(checkpoints.begin(), checkpoints.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
    resume_steps_[static_cast<int64_t>(r)] = newest->step;
    steps.push_back(std::to_string(newest->step));
  }
  log(fmt::format("resuming asynchronous DiLoCo: each worker from its own newest checkpoint (steps {}), all from the "
                  "outer state's parameters", fmt::join(steps, ", ")));
}

// Nothing to resume from: no worker holds a checkpoint, or (independent replicas, which share no
// group) one does not. The way forward is a new start, which costs what the others saved.
void FixedRun::no_state_to_resume(const std::vector<int64_t>& without) {
  int64_t furthest = 0;  // the newest step any worker saved
  for (const auto& m : members_) {
    for (const auto& c : m->request.checkpoints) furthest = std::max(furthest, c.step);
  }
  const auto& run = options_.config.run.dir;
  const auto failed = shell_word(run + ".failed");
  const auto restart = fmt::format("mv {} {} && loco launch --config {}/config.toml", shell_word(run), failed, failed);
  std::string why;
  if (without.size() == members_.size()) {
    why = fmt::format("they stopped before their first (checkpoint.every = {}), or lost them: start the run again: {}",
                      options_.config.checkpoint.every, restart);
  } else {
    why = fmt::format("the others saved up to step {}, and with sync.algorithm = {} the workers share no group to "
                      "copy a checkpoint over. Restore its checkpoints, or start the run again, losing those steps: {}",
                      furthest, to_string(options_.config.sync.algorithm), restart);
  }
  const auto who = without.size() == members_.size() ? std::string("no worker holds a checkpoint") : holding_none(without);
  if (status_.fail(fmt::format("--resume: {} to resume from: {}", who, why))) {
    log("run failed: " + status_.reason());
  }
}

protocol::StartReply FixedRun::start_reply(int64_t rank) const {
  protocol::StartReply reply;
  reply.phase = status_.phase();
  reply.missing = missing();
  reply.epoch = 0;
  reply.error = status_.phase() == Phase::kFailed ? status_.reason() : "";
  if (auto it = resume_steps_.find(rank); it != resume_steps_.end()) reply.resume_step = it->second;
  if (auto it = task_of_.find(rank); it != task_of_.end()) reply.task = tasks_.find(it->second)->task;
  reply.copy = copy_;
  // "host:pid": the part before the last colon names the host.
  if (rank >= 0 && rank < workers() && members_[static_cast<size_t>(rank)]) {
    const auto host = host_of(members_[static_cast<size_t>(rank)]->name);
    for (const auto& member : members_) reply.host_workers += member && host_of(member->name) == host ? 1 : 0;
  }
  return reply;
}

void FixedRun::done(const protocol::DoneRequest& request) {
  if (request.rank < 0 || request.rank >= workers() || !members_[static_cast<size_t>(request.rank)]) {
    throw ProtocolError(fmt::format("rank {} is not a member of this run", request.rank));
  }
  auto& member = *members_[static_cast<size_t>(request.rank)];
  if (request.task >= 0) {
    // Its task: done when it finished; open again when it stopped or failed (a resume continues it).
    const auto* record = tasks_.find(request.task);
    if (record == nullptr || record->holder != request.rank) {
      throw ProtocolError(fmt::format("worker {} reports task {}, which is not its own", request.rank, request.task));
    }
    if (record->state == TaskState::kLeased) {
      if (request.status == EndStatus::kFinished) tasks_.complete(request.task, request.rank, {});
      else tasks_.release(request.rank);
    }
  }
  member.status = request.status;
  member.error = request.error;
  member.summary = request.summary;
  log(fmt::format("worker {} {}{}", request.rank, protocol::to_string(request.status),
                  request.error.empty() ? "" : ": " + request.error));
  if (!first_end_) first_end_ = Clock::now();
  const bool all_done = std::all_of(members_.begin(), members_.end(), [](const auto& m) { return m && m->status; });
  if (all_done && !status_.ended()) status_.enter(Phase::kFinished);
}

// A worker that never joins fails the run, named, after cluster.join_timeout_s.
void FixedRun::check_start(Clock::time_point now) {
  if (status_.phase() != Phase::kWaiting) return;
  const auto limit = std::chrono::duration<double>(options_.config.cluster.join_timeout_s);
  if (now - created_ < limit) return;
  std::vector<std::string> joined;
  for (size_t r = 0; r < members_.size(); ++r) {
    if (members_[r]) joined.push_back(fmt::format("{} ({})", r, members_[r]->name));
  }
  if (status_.fail(fmt::format("worker rank(s) {} never joined within {:g} s (cluster.join_timeout_s); joined: {}",
                               fmt::join(missing(), ", "), options_.config.cluster.join_timeout_s,
                               joined.empty() ? "none" : fmt::format("{}", fmt::join(joined, ", "))))) {
    log("run failed: " + status_.reason());
  }
}

// Once one worker has ended, the others' collectives end within cluster.timeout_s; a worker that
// still has not reported its end a grace period after that is gone (killed): the run fails.
void FixedRun::check_end(Clock::time_point now) {
  if (status_.phase() != Phase::kRunning || !first_end_) return;
  std::vector<int64_t> silent;
  for (size_t r = 0; r < members_.size(); ++r) {
    if (members_[r] && !members_[r]->status) silent.push_back(static_cast<int64_t>(r));
  }
  // Asynchronous DiLoCo: workers the outer state took as gone (silent) had their steps done by the
  // others; with the run's steps all done, the run finished without them.
  if (outer_ != nullptr && !silent.empty() && outer_->totals().finished &&
      std::all_of(silent.begin(), silent.end(), [&](int64_t r) { return outer_->silent(r, now); })) {
    log(fmt::format("worker rank(s) {} never reported their end, but the outer state had taken them as gone (silent past "
                    "sync.async_silence_s) and their steps went to the others: the run's steps are all done without them",
                    fmt::join(silent, ", ")));
    status_.enter(Phase::kFinished);
    return;
  }
  const auto grace = std::chrono::duration<double>(options_.config.cluster.timeout_s + 30);
  if (now - *first_end_ < grace) return;
  if (status_.fail(fmt::format("worker rank(s) {} never reported their end (killed?)", fmt::join(silent, ", ")))) {
    log("run failed: " + status_.reason());
  }
}

CoordinatorResult FixedRun::result() const {
  CoordinatorResult result;
  result.message = status_.reason();
  bool any_failed = status_.phase() == Phase::kFailed, any_stopped = false;
  for (const auto& m : members_) {
    result.summaries.push_back(m ? metrics::summary_from_json(m->summary) : std::nullopt);
    if (m && m->status == EndStatus::kFailed) {
      any_failed = true;
      if (result.message.empty()) result.message = m->error;
    }
    if (m && m->status == EndStatus::kStopped) any_stopped = true;
  }
  result.outcome = any_failed                                ? RunOutcome::kFailed
                   : any_stopped || status_.stopping()       ? RunOutcome::kStopped
                                                             : RunOutcome::kFinished;
  return result;
}

nlohmann::json FixedRun::describe() const {
  nlohmann::json list = nlohmann::json::array();
  for (size_t r = 0; r < members_.size(); ++r) {
    if (!members_[r]) continue;
    nlohmann::json member = {{"rank", r}, {"name", members_[r]->name},
                             {"status", members_[r]->status ? protocol::to_string(*members_[r]->status) : "training"}};
    if (auto it = task_of_.find(static_cast<int64_t>(r)); it != task_of_.end()) {
      member["task"] = {{"id", it->second}, {"state", to_string(tasks_.find(it->second)->state)}};
    }
    list.push_back(member);
  }
  return {{"members", list}, {"missing", missing()}};
}

std::vector<std::string> FixedRun::status_lines() const {
  std::vector<std::string> lines;
  for (size_t r = 0; r < members_.size(); ++r) {
    if (!members_[r]) {
      lines.push_back(fmt::format("worker {}: not joined", r));
      continue;
    }
    const auto& m = *members_[r];
    const std::string_view doing = m.status ? protocol::to_string(*m.status)
                                   : status_.phase() == Phase::kWaiting ? "joined"
                                                                        : "training";
    lines.push_back(fmt::format("worker {}: {} {}", r, m.name, doing));
  }
  return lines;
}

}  // namespace loco::runtime
