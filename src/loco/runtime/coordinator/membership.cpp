#include "loco/runtime/coordinator/membership.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace loco::runtime {
namespace {

double seconds_between(MembershipTable::Clock::time_point a, MembershipTable::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

MembershipTable::MembershipTable(MembershipOptions options)
    : options_(options),
      slots_(static_cast<size_t>(std::max<int64_t>(1, options.slots))),
      rounds_missed_(slots_.size(), 0) {}

int64_t MembershipTable::live_members() const {
  return std::count_if(members_.begin(), members_.end(), [](const auto& m) { return m.second.state != State::kGone; });
}

std::optional<int64_t> MembershipTable::vacant_slot(int64_t wanted) const {
  const auto vacant = [&](int64_t s) { return s >= 0 && s < static_cast<int64_t>(slots_.size()) && slots_[static_cast<size_t>(s)].owner < 0; };
  if (vacant(wanted)) return wanted;
  for (int64_t s = 0; s < static_cast<int64_t>(slots_.size()); ++s) {
    if (vacant(s)) return s;
  }
  return std::nullopt;
}

std::optional<MembershipTable::Joined> MembershipTable::join(const std::string& name, int64_t wanted_slot,
                                                              Clock::time_point now, std::string& why) {
  if (complete_) {
    why = "training is complete";
    return std::nullopt;
  }
  const auto slot = vacant_slot(wanted_slot);
  if (!slot) {
    why = fmt::format("the run already has its {} workers (cluster.workers)", slots_.size());
    return std::nullopt;
  }
  const int64_t id = next_id_++;
  Member member;
  member.name = name;
  member.slot = *slot;
  member.state = State::kJoining;
  member.last_seen = now;
  member.step = member.synced_step = round_step_;
  members_.emplace(id, std::move(member));
  auto& record = slots_[static_cast<size_t>(*slot)];
  record.owner = id;
  event(metrics::MemberJoinEvent{{}, id, name, *slot, started_});
  return Joined{id, *slot, started_, record.position};
}

void MembershipTable::start(Clock::time_point now) {
  started_ = true;
  for (auto& [id, m] : members_) {
    if (m.state == State::kJoining) m.state = State::kActive;
    touch(m, id, now);
    // The first round's work: each member its own shard, from where it stands.
    if (m.state == State::kActive) {
      issue_task(m.slot, round_, slots_[static_cast<size_t>(m.slot)].position, round_step_, id, now);
    }
  }
}

void MembershipTable::touch(Member& m, int64_t id, Clock::time_point now) {
  m.last_seen = now;
  // A lease outlives its holder's liveness by dead_after: the holder is declared failed (and
  // loses it) first; the deadline is the backstop.
  tasks_.renew(id, now + 2 * options_.dead_after);
}

void MembershipTable::drop(Member& m, int64_t id) {
  m.state = State::kGone;
  m.arrival.reset();
  m.go.reset();
  if (slots_[static_cast<size_t>(m.slot)].owner == id) slots_[static_cast<size_t>(m.slot)].owner = -1;
  tasks_.release(id);
}

int64_t MembershipTable::steps_of_round_from(int64_t step) const {
  if (options_.round_seconds > 0) return 0;
  const int64_t h = std::max<int64_t>(1, options_.inner_steps), p = std::max<int64_t>(1, options_.fragments);
  int64_t next = step + h;  // fragment 0's next sync, or DiLoCo's
  for (int64_t f = 0; f < p; ++f) {
    // Streaming DiLoCo: fragment f syncs at the steps t >= max(1, t_f) with t = t_f (mod H).
    const int64_t offset = f * h / p;
    const int64_t first = offset > 0 ? offset : h;
    const int64_t t = std::max(first, step + 1 + ((offset - (step + 1)) % h + h) % h);
    next = std::min(next, t);
  }
  if (options_.total_steps > 0) next = std::min(next, options_.total_steps);
  return std::max<int64_t>(0, next - step);
}

int64_t MembershipTable::issue_task(int64_t slot, int64_t version, const data::SamplerPosition& from, int64_t step,
                                    int64_t member, Clock::time_point now) {
  protocol::Task task;
  task.scope = options_.fragments > 1 ? protocol::TaskScope::kFragment : protocol::TaskScope::kModel;
  task.version = version;
  task.shard = slot;
  task.from = from;
  task.steps = steps_of_round_from(step);
  task.seconds = options_.round_seconds;
  task.report = protocol::TaskReport::kRound;
  const int64_t id = tasks_.issue(task);
  tasks_.lease(id, member, now + 2 * options_.dead_after);
  return id;
}

protocol::HeartbeatReply MembershipTable::heartbeat(int64_t id, bool stopping, Clock::time_point now, int64_t step,
                                                    const std::vector<int64_t>& closed) {
  protocol::HeartbeatReply reply;
  reply.epoch = epoch_;
  reply.epoch_broken = epoch_broken_;
  reply.stopping = stopping;
  auto it = members_.find(id);
  if (it == members_.end() || it->second.state == State::kGone) {
    reply.member = false;
    return reply;
  }
  touch(it->second, id, now);
  if (step >= 0) it->second.step = step;
  // Missed heartbeats: more than 3 intervals, or one and a second besides (a failed group closes
  // every survivor's sockets too, and a live survivor's heartbeat may come late on a busy host).
  const auto silent_for = std::max(3 * options_.heartbeat, options_.heartbeat + std::chrono::milliseconds(1000));
  const bool in_epoch = std::find(epoch_members_.begin(), epoch_members_.end(), id) != epoch_members_.end();
  std::vector<std::pair<int64_t, double>> dead;
  for (const int64_t rank : in_epoch ? closed : std::vector<int64_t>{}) {
    if (rank < 0 || rank >= static_cast<int64_t>(epoch_members_.size())) continue;
    const int64_t peer = epoch_members_[static_cast<size_t>(rank)];
    if (peer == id) continue;
    const auto m = members_.find(peer);
    if (m == members_.end() || m->second.state == State::kGone || now - m->second.last_seen <= silent_for) continue;
    dead.emplace_back(peer, seconds_between(m->second.last_seen, now));
  }
  for (const auto& [peer, quiet] : dead) {
    fail_member(peer, fmt::format("its connections to its group closed and no heartbeat for {:.1f} s", quiet), quiet, now);
  }
  if (!dead.empty()) {
    reply.epoch = epoch_;
    reply.epoch_broken = epoch_broken_;
  }
  return reply;
}

int64_t MembershipTable::unsynchronized_steps(const Member& m) const {
  return m.state == State::kActive ? std::max<int64_t>(0, m.step - m.synced_step) : 0;
}

std::vector<protocol::SlotInfo> MembershipTable::slot_table() const { return slots_; }

void MembershipTable::fail_member(int64_t id, const std::string& how, double noticed_after_s, Clock::time_point now) {
  auto& m = members_.at(id);
  if (m.state == State::kGone) return;
  const bool was_active = m.state == State::kActive;
  const int64_t discarded = unsynchronized_steps(m);
  drop(m, id);
  if (std::find(epoch_members_.begin(), epoch_members_.end(), id) != epoch_members_.end()) epoch_broken_ = true;
  event(metrics::MemberFailureEvent{{}, id, m.name, m.slot, how, noticed_after_s, was_active, discarded});
  if (!failure_noticed_) failure_noticed_ = now;
  try_convene(now);
}

void MembershipTable::declare_failed(int64_t id, const std::string& how, Clock::time_point now) {
  auto it = members_.find(id);
  if (it == members_.end()) return;
  fail_member(id, how, 0.0, now);
}

void MembershipTable::forgive(Clock::time_point now) {
  for (auto& [id, m] : members_) {
    if (m.state != State::kGone) touch(m, id, std::max(m.last_seen, now));
  }
}

void MembershipTable::expire(Clock::time_point now) {
  // The coordinator itself was not running (frozen, or its machine stalled) for a while: the
  // members' silence is its own, so they get a fresh allowance rather than being declared failed.
  if (last_expire_ && now - *last_expire_ > options_.dead_after / 2) {
    for (auto& [id, m] : members_) touch(m, id, std::max(m.last_seen, now));
  }
  last_expire_ = now;
  std::vector<std::pair<int64_t, double>> silent;
  for (const auto& [id, m] : members_) {
    const double quiet = seconds_between(m.last_seen, now);
    if (m.state != State::kGone && now - m.last_seen > options_.dead_after) silent.emplace_back(id, quiet);
  }
  for (const auto& [id, quiet] : silent) {
    fail_member(id, fmt::format("no heartbeat for {:.1f} s", quiet), quiet, now);
  }
  tasks_.expire(now);  // the backstop: a holder unheard of for 2 x dead_after was declared failed already
  try_convene(now);  // a time-budgeted round's grace may have run out
}

void MembershipTable::leave(int64_t id, protocol::EndStatus status, Clock::time_point now) {
  auto it = members_.find(id);
  if (it == members_.end() || it->second.state == State::kGone) return;
  auto& m = it->second;
  drop(m, id);
  if (status == protocol::EndStatus::kFailed && std::find(epoch_members_.begin(), epoch_members_.end(), id) != epoch_members_.end()) {
    epoch_broken_ = true;
  }
  event(metrics::MemberLeaveEvent{{}, id, m.name, m.slot, std::string(protocol::to_string(status))});
  try_convene(now);
}

bool is_process(const std::string& name, const std::string& host, int64_t pid) {
  const std::string suffix = fmt::format(":{}", pid);
  if (!name.starts_with(host) || !name.ends_with(suffix) || name.size() < host.size() + suffix.size()) return false;
  const std::string_view between = std::string_view(name).substr(host.size(), name.size() - host.size() - suffix.size());
  return between.empty() || (between.front() == '[' && between.back() == ']');
}

std::optional<int64_t> MembershipTable::member_of_process(const std::string& host, int64_t pid) const {
  for (const auto& [id, m] : members_) {
    if (m.state != State::kGone && is_process(m.name, host, pid)) return id;
  }
  return std::nullopt;
}

bool MembershipTable::all_left() const { return live_members() == 0; }

protocol::RoundReply MembershipTable::arrive(const protocol::RoundRequest& request, bool stopping, Clock::time_point now) {
  protocol::RoundReply reply;
  auto it = members_.find(request.member);
  if (it == members_.end() || it->second.state == State::kGone) {
    reply.action = protocol::RoundAction::kRejoin;
    reply.reason = fmt::format("member {} is not part of the run (declared failed, or it left)", request.member);
    return reply;
  }
  auto& m = it->second;
  touch(m, request.member, now);
  m.step = std::max(m.step, request.step);
  if (complete_) {
    reply.action = protocol::RoundAction::kFinished;
    return reply;
  }
  if (stopping) {
    reply.action = protocol::RoundAction::kStop;
    return reply;
  }
  if (m.go) {
    if (request.failed_epoch >= 0 && request.failed_epoch == m.go->epoch) {
      // Its collective in that epoch failed: the epoch is broken, and the round is convened again.
      if (m.go->epoch == epoch_ && !epoch_broken_) {
        epoch_broken_ = true;
        event(metrics::CollectiveFailedEvent{{}, request.member, m.name, m.go->epoch, m.go->round, request.failure});
        if (!failure_noticed_) failure_noticed_ = now;
      }
      m.go.reset();
    } else if (request.round == m.go->round || (m.state == State::kJoining && request.round == 0) ||
               (m.go->action == protocol::RoundAction::kRestore && request.round == 0)) {
      return *m.go;  // the same question again (a retried request)
    } else {
      m.go.reset();
    }
  }
  if (m.state == State::kActive) {
    if (request.round <= round_) {
      // The round completed on other workers while this one's collective failed: its θ is stale.
      const int64_t slot = m.slot;
      const int64_t discarded = unsynchronized_steps(m);
      drop(m, request.member);
      event(metrics::RejoinEvent{{}, request.member, m.name, slot, request.round, "its round completed without it", discarded});
      reply.action = protocol::RoundAction::kRejoin;
      reply.reason = fmt::format("round {} completed without this worker (its collective failed, or it was later than "
                                 "sync.round_grace_s)", request.round);
      try_convene(now);
      return reply;
    }
    if (request.round != round_ + 1) {
      throw protocol::ProtocolError(fmt::format("member {} arrived at round {}, but the run is at round {}", request.member,
                                                request.round, round_ + 1));
    }
  } else if (request.round != 0) {
    throw protocol::ProtocolError(fmt::format("member {} is joining and must arrive at round 0, not {}", request.member,
                                              request.round));
  }
  for (const auto& [slot, position] : request.adopted) {
    if (slot >= static_cast<int64_t>(slots_.size())) {
      throw protocol::ProtocolError(fmt::format("member {} reports reading slot {}, but the run has {} slots", request.member,
                                                slot, slots_.size()));
    }
  }
  m.arrival = request;
  if (m.state == State::kActive && !first_arrival_) first_arrival_ = now;
  try_convene(now);
  if (m.go) return *m.go;
  reply.round = round_ + 1;
  reply.epoch = epoch_;
  return reply;  // wait
}

void MembershipTable::try_convene(Clock::time_point now) {
  if (!started_ || complete_) return;
  const int64_t next = round_ + 1;
  if (convened_ && convened_->round == next && convened_->epoch == epoch_ && !epoch_broken_) return;  // under way
  std::vector<int64_t> active, joiners, late;
  for (const auto& [id, m] : members_) {
    if (m.state == State::kActive) {
      (m.arrival && m.arrival->round == next ? active : late).push_back(id);
    } else if (m.state == State::kJoining && m.arrival) {
      joiners.push_back(id);
    }
  }
  // Nobody holds θ when no active member is left: the joiners wait until the coordinator restarts
  // them from the global checkpoint (orphaned, restart_from).
  if (active.empty()) return;
  if (retry_waits(next)) return;
  if (!late.empty()) {
    // Someone is still training this round: wait for it, unless rounds are time-budgeted and it
    // is later than the grace (it is then left out; when it arrives, it rejoins).
    if (!options_.round_grace || !first_arrival_ || now - *first_arrival_ < *options_.round_grace) return;
    event(metrics::LeftOutEvent{{}, next, late, seconds_between(*first_arrival_, now)});
  }
  // Ranks follow the slots, not the order of joining: a run's collectives then sum in the same
  // order whenever the same slots take part, and a resumed run repeats the uninterrupted one.
  const auto by_slot = [&](int64_t a, int64_t b) { return members_.at(a).slot < members_.at(b).slot; };
  std::sort(active.begin(), active.end(), by_slot);
  std::sort(joiners.begin(), joiners.end(), by_slot);
  std::vector<int64_t> participants = active;
  participants.insert(participants.end(), joiners.begin(), joiners.end());
  if (static_cast<int64_t>(participants.size()) < options_.min_workers) return;  // below the quorum: wait
  const auto readers = readers_for(participants);

  if (epoch_ == 0 || epoch_broken_ || participants != epoch_members_) {
    ++epoch_;
    epoch_members_ = participants;
    epoch_broken_ = false;
    std::vector<metrics::EpochMember> list;
    for (size_t r = 0; r < participants.size(); ++r) {
      const auto& m = members_.at(participants[r]);
      list.push_back({static_cast<int64_t>(r), participants[r], m.name, m.slot, m.state == State::kJoining});
    }
    std::map<int64_t, int64_t> dealt;  // the shards read by a member other than their slot's
    for (size_t s = 0; s < readers.size(); ++s) {
      if (members_.at(readers[s]).slot != static_cast<int64_t>(s)) dealt[static_cast<int64_t>(s)] = readers[s];
    }
    event(metrics::MembershipEvent{{}, epoch_, next, std::move(list), static_cast<int64_t>(active.size()),
                                   static_cast<int64_t>(joiners.size()), slot_readers(dealt)});
  }
  if (convened_ && convened_->round == next) {
    event(metrics::RoundRetriedEvent{{}, next, epoch_, convened_->epoch, static_cast<int64_t>(participants.size())});
  }
  Convened convened;
  convened.round = next;
  convened.epoch = epoch_;
  convened.participants = participants;
  convened.contributors = static_cast<int64_t>(active.size());
  convened.slots = slots_;
  take_claims(convened, active);
  if (convened_ && convened_->round == next) {
    for (int64_t id : convened_->issued) tasks_.cancel(id);  // the next round's tasks of the plan this one replaces
  }
  // The next round's tasks: every shard with a reader, from where this round leaves it.
  for (size_t s = 0; s < readers.size(); ++s) {
    if (readers[s] < 0) continue;
    convened.issued.push_back(issue_task(static_cast<int64_t>(s), next, convened.slots[s].position, convened.step,
                                         readers[s], now));
  }
  for (size_t r = 0; r < participants.size(); ++r) {
    auto& m = members_.at(participants[r]);
    m.go = go_reply(convened, r);
    m.arrival.reset();
  }
  convened_ = std::move(convened);
  first_arrival_.reset();
}

// A round whose collective failed is convened again only once every participant of the failed
// attempt has come back to it (its collective failed too) or is gone. One whose collective
// completed reports the round done instead, and the round completes with its θ. Without this wait
// a time-budgeted round's grace could run out first and convene the round again without them:
// two θ for one round.
bool MembershipTable::retry_waits(int64_t next) const {
  if (!convened_ || convened_->round != next) return false;
  return std::any_of(convened_->participants.begin(), convened_->participants.end(), [&](int64_t id) {
    const auto& m = members_.at(id);
    return m.state != State::kGone && !m.arrival;
  });
}

// The contributors' claims, each taken only for a task it leases (of this round, version round_):
// its own shard's position, and the shards of vacant slots the last plan dealt it (unless their
// owner trained them itself). A claim no plan made is not taken: that shard stays where it was.
void MembershipTable::take_claims(Convened& convened, const std::vector<int64_t>& active) {
  for (int64_t id : active) {
    const auto& m = members_.at(id);
    convened.step = std::max(convened.step, m.arrival->step);
    if (const auto* own = tasks_.held(id, m.slot, round_)) {
      convened.slots[static_cast<size_t>(m.slot)].position = m.arrival->position;
      convened.reports[own->task.id] = m.arrival->position;
    }
  }
  for (int64_t id : active) {
    for (const auto& [slot, position] : members_.at(id).arrival->adopted) {
      // A copy for the lambda: clang before 16 cannot capture a structured binding.
      const int64_t adopted_slot = slot;
      const bool owner_trained = std::any_of(active.begin(), active.end(),
                                             [&](int64_t a) { return members_.at(a).slot == adopted_slot; });
      const auto* task = tasks_.held(id, slot, round_);
      if (task == nullptr || owner_trained) continue;
      convened.slots[static_cast<size_t>(slot)].position = position;
      convened.adopted[slot] = id;
      convened.reports[task->task.id] = position;
    }
  }
}

std::vector<int64_t> MembershipTable::readers_for(const std::vector<int64_t>& participants) const {
  std::vector<int64_t> by_slot = participants;
  std::sort(by_slot.begin(), by_slot.end(), [&](int64_t a, int64_t b) { return members_.at(a).slot < members_.at(b).slot; });
  std::vector<int64_t> readers(slots_.size(), -1);
  for (int64_t id : by_slot) readers[static_cast<size_t>(members_.at(id).slot)] = id;
  size_t turn = 0;
  for (auto& reader : readers) {
    if (reader == -1 && !by_slot.empty()) reader = by_slot[turn++ % by_slot.size()];
  }
  return readers;
}

protocol::RoundReply MembershipTable::go_reply(const Convened& convened, size_t rank) const {
  protocol::RoundReply go;
  go.action = protocol::RoundAction::kGo;
  go.round = convened.round;
  go.epoch = convened.epoch;
  go.rank = static_cast<int64_t>(rank);
  go.size = static_cast<int64_t>(convened.participants.size());
  go.contributors = convened.contributors;
  go.step = convened.step;
  go.slots = convened.slots;
  for (const auto& [shard, record] : tasks_.leased_to(convened.participants[rank], convened.round)) {
    go.tasks.push_back(record->task);
  }
  return go;
}

std::optional<std::string> MembershipTable::round_done(const protocol::RoundDone& report, Clock::time_point now) {
  auto it = members_.find(report.member);
  if (it == members_.end()) return std::nullopt;
  auto& m = it->second;
  m.last_seen = now;
  std::optional<std::string> error;
  if (report.round == round_ + 1 && convened_ && convened_->round == report.round && convened_->epoch == report.epoch) {
    round_ = report.round;
    round_step_ = report.step;
    for (int64_t id : convened_->participants) members_.at(id).synced_step = report.step;  // their work is in θ
    // The reported tasks are done, and their shards advance (a slot's owner stays whoever holds it
    // now); this round's tasks nobody reported are superseded by the next round's.
    for (const auto& [id, end] : convened_->reports) {
      if (const auto* record = tasks_.find(id)) slots_[static_cast<size_t>(record->task.shard)].position = end;
      tasks_.record_done(id, end);
    }
    tasks_.cancel_before(round_);
    tasks_.prune();
    last_hash_ = report.params_hash;
    // Slots nobody trained this round (vacant, or their member left out): their shards fall behind.
    std::vector<int64_t> idle;
    for (int64_t s = 0; s < static_cast<int64_t>(slots_.size()); ++s) {
      const bool trained = std::any_of(convened_->participants.begin(), convened_->participants.begin() + convened_->contributors,
                                       [&](int64_t id) { return members_.at(id).slot == s; }) ||
                           convened_->adopted.count(s) > 0;
      if (!trained) {
        idle.push_back(s);
        ++rounds_missed_[static_cast<size_t>(s)];
      }
    }
    const auto slots = static_cast<int64_t>(slots_.size());
    metrics::RoundCompleteEvent e{{}, round_, report.epoch, report.step, static_cast<int64_t>(convened_->participants.size()),
                                  convened_->contributors, slots, convened_->contributors < slots, idle,
                                  slot_readers(convened_->adopted), fmt::format("{:016x}", report.params_hash)};
    if (failure_noticed_) {
      e.recovery_s = seconds_between(*failure_noticed_, now);
      failure_noticed_.reset();
    }
    event(std::move(e));
    if (options_.total_steps > 0 && report.step >= options_.total_steps && report.last) complete_ = true;
  } else if (report.round == round_ && last_hash_ && *last_hash_ != report.params_hash) {
    error = fmt::format("member {} ({}) ended round {} with parameters {:016x}, the others with {:016x}: the workers' θ "
                        "diverged", report.member, m.name, report.round, report.params_hash, *last_hash_);
  }
  if (convened_ && convened_->round == report.round && convened_->epoch == report.epoch) convened_->done.push_back(report.member);
  if (m.state == State::kJoining && report.round == round_) {
    m.state = State::kActive;
    event(metrics::SlotTakenEvent{{}, report.member, m.name, m.slot, round_});
  }
  if (m.go && m.go->round == report.round) m.go.reset();
  try_convene(now);
  return error;
}

bool MembershipTable::orphaned() const {
  if (!started_ || complete_) return false;
  bool waiting = false;
  for (const auto& [id, m] : members_) {
    if (m.state == State::kActive) return false;
    waiting = waiting || m.state == State::kJoining;
  }
  return waiting;
}

void MembershipTable::restart_from(int64_t rounds_completed, std::optional<int64_t> step,
                                   const std::vector<data::SamplerPosition>& positions, Clock::time_point now) {
  const int64_t undone = std::max<int64_t>(0, round_ - rounds_completed);
  restore(rounds_completed, step.value_or(0), positions);
  convened_.reset();
  first_arrival_.reset();
  last_hash_.reset();
  epoch_broken_ = true;  // the next round forms a fresh group
  std::vector<int64_t> restarted;
  tasks_.cancel_pending();
  for (auto& [id, m] : members_) {
    if (m.state != State::kJoining) continue;
    m.state = State::kActive;
    m.arrival.reset();
    m.step = m.synced_step = round_step_;
    touch(m, id, now);
    protocol::RoundReply restore;
    restore.action = protocol::RoundAction::kRestore;
    restore.round = round_;
    restore.step = step.value_or(-1);
    restore.slots = slots_;
    const int64_t task = issue_task(m.slot, round_, slots_[static_cast<size_t>(m.slot)].position, round_step_, id, now);
    restore.tasks.push_back(tasks_.find(task)->task);
    m.go = std::move(restore);
    restarted.push_back(id);
  }
  event(metrics::RestoredFromCheckpointEvent{{}, round_, step.value_or(-1), restarted, undone, epoch_});
}

void MembershipTable::restore(int64_t rounds_completed, int64_t step, const std::vector<data::SamplerPosition>& positions) {
  round_ = rounds_completed;
  round_step_ = step;
  for (size_t s = 0; s < slots_.size() && s < positions.size(); ++s) slots_[s].position = positions[s];
}

std::vector<metrics::Event> MembershipTable::take_events() {
  std::vector<metrics::Event> out;
  out.swap(events_);
  return out;
}

}  // namespace loco::runtime
