#include "loco/runtime/worker/elastic.h"

#include <fmt/format.h>

#include <utility>
#include <vector>

namespace loco::runtime {
namespace {

std::chrono::milliseconds seconds(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

// A Gloo group abandoned after a failure may still have an operation stuck with a live peer until
// Gloo's own timeout, and destroying it waits for that. Abandoned Gloo groups are kept here instead,
// for the life of the process (one per failure; their connections are idle). loco's transport
// (a sealed data plane) stops within one poll of its I/O thread: its groups are closed at once,
// and their connections with them.
void bury(comm::Group group) {
  if (group.backend() == "loco-tcp") return;
  static auto* graveyard = new std::vector<comm::Group>();
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  graveyard->push_back(std::move(group));
}

}  // namespace

ElasticSession::ElasticSession(const RunConfig& config, CoordinatorClient& client, const protocol::JoinReply& joined,
                               comm::GroupFactory groups, const std::atomic<bool>* stop)
    : config_(config),
      client_(client),
      joined_(joined),
      groups_(std::move(groups)),
      stop_(stop),
      position_(joined.position) {
  heartbeats_.emplace(config, client, [this] { return heartbeat(); },
                      [this](const protocol::HeartbeatReply& reply) {
                        current_epoch_ = reply.epoch;
                        epoch_broken_ = reply.epoch_broken;
                        if (!reply.member) member_ = false;
                      });
}

ElasticSession::~ElasticSession() {
  heartbeats_.reset();
  watched_.reset();
  if (group_) bury(std::move(group_->second));
}

protocol::HeartbeatRequest ElasticSession::heartbeat() {
  protocol::HeartbeatRequest request{joined_.member, step_.load()};
  std::lock_guard lock(watch_mutex_);
  if (watched_) {
    request.epoch = watched_->first;
    request.closed = watched_->second.closed_peers();
  } else if (closed_before_) {
    request.epoch = closed_before_->first;
    request.closed = closed_before_->second;
  }
  return request;
}

void ElasticSession::watch(std::optional<std::pair<int64_t, comm::Group>> group) {
  std::lock_guard lock(watch_mutex_);
  watched_ = std::move(group);
  closed_before_.reset();
}

void ElasticSession::watch_failed() {
  std::lock_guard lock(watch_mutex_);
  if (watched_) closed_before_.emplace(watched_->first, watched_->second.closed_peers());
  watched_.reset();
}

Heartbeats::Heartbeats(const RunConfig& config, CoordinatorClient& client, std::function<protocol::HeartbeatRequest()> request,
                       std::function<void(const protocol::HeartbeatReply&)> answer)
    : request_(std::move(request)), answer_(std::move(answer)) {
  thread_ = std::thread([this, address = client.address(), timeout = seconds(config.cluster.connect_timeout_s),
                         security = client.security(), interval = config.cluster.heartbeat_s] {
    CoordinatorClient channel(address, timeout, security);
    loop(channel, interval);
  });
}

Heartbeats::~Heartbeats() {
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Heartbeats::loop(CoordinatorClient& channel, double interval_s) {
  std::unique_lock lock(mutex_);
  while (!quit_) {
    lock.unlock();
    try {
      answer_(channel.heartbeat(request_()));
    } catch (const std::exception&) {
      // The coordinator is unreachable: the main thread's requests report that; keep trying.
    }
    lock.lock();
    wake_.wait_for(lock, seconds(interval_s), [&] { return quit_; });
  }
}

bool ElasticSession::should_abort(int64_t epoch) const {
  const int64_t current = current_epoch_.load();
  return !member_.load() || current > epoch || (current == epoch && epoch_broken_.load());
}

std::optional<data::SamplerPosition> ElasticSession::joined_position() const { return joined_position_; }

void ElasticSession::record_progress(const data::SamplerPosition& position,
                                     const std::map<int64_t, data::SamplerPosition>& adopted, int64_t step) {
  position_ = position;
  // Only the shards of the current adoption: one the last plan gave away is no longer this
  // worker's to report.
  for (const auto& [slot, p] : adopted) {
    if (auto it = adopted_.find(slot); it != adopted_.end()) it->second = p;
  }
  step_ = step;
}

std::optional<std::map<int64_t, data::SamplerPosition>> ElasticSession::take_adoption() {
  if (!std::exchange(adoption_changed_, false)) return std::nullopt;
  return adopted_;
}

algorithms::RoundPlan ElasticSession::begin_round(int64_t round, int64_t step, int64_t failed_epoch,
                                                  const std::string& failure) {
  protocol::RoundRequest request;
  request.member = joined_.member;
  request.round = round;
  request.failed_epoch = failed_epoch;
  request.failure = failure.substr(0, protocol::kMaxFailureBytes);
  // Not in the middle of a UTF-8 character: JSON cannot carry half of one.
  while (request.failure.size() < failure.size() && !request.failure.empty() &&
         (static_cast<unsigned char>(failure[request.failure.size()]) & 0xC0) == 0x80) {
    request.failure.pop_back();
  }
  request.step = step;
  request.position = position_;
  request.adopted = adopted_;
  if (failed_epoch >= 0 && group_ && group_->first == failed_epoch) {
    // The heartbeats go on naming the peers it saw closed (the likely cause) until the next group
    // forms, so that the round convened again need not wait out a dead one's dead_after_s.
    watch_failed();
    bury(std::move(group_->second));
    group_.reset();
  }
  for (;;) {
    const auto reply = ask([&] { return client_.round(request); });
    using protocol::RoundAction;
    switch (reply.action) {
      case RoundAction::kRejoin: throw algorithms::Evicted(reply.reason);
      case RoundAction::kStop: throw algorithms::RunStopping(reply.reason.empty() ? "the run is stopping" : reply.reason);
      case RoundAction::kFinished: throw algorithms::RunStopping("the run's training completed", /*completed=*/true);
      case RoundAction::kRestore: {
        data::SamplerPosition position;
        for (const auto& task : reply.tasks) {
          if (task.shard == slot()) position = task.from;
        }
        throw algorithms::RestartFromCheckpoint(reply.step >= 0 ? std::optional<int64_t>(reply.step) : std::nullopt,
                                                position.epoch, position.cursor);
      }
      case RoundAction::kWait:
        if (stop_ != nullptr && stop_->load()) throw algorithms::RunStopping("interrupted while waiting for the round");
        continue;
      case RoundAction::kGo: break;
    }
    if (!group_ || group_->first != reply.epoch) {
      if (group_) watch(std::nullopt);
      if (group_) bury(std::move(group_->second));
      group_.reset();
      const int64_t epoch = reply.epoch;
      try {
        group_.emplace(epoch, groups_.make(epoch, reply.rank, reply.size, [this, epoch] { return should_abort(epoch); }));
        watch(group_);
      } catch (const PeerError&) {
        request.failed_epoch = reply.epoch;  // a participant did not make it: the round is convened again
        continue;
      }
    }
    algorithms::RoundPlan plan;
    plan.group = group_->second;
    plan.round = reply.round;
    plan.epoch = reply.epoch;
    plan.contributors = reply.contributors;
    plan.step = reply.step;
    // Every slot's position as of this round's end: the run's state once the round completes.
    planned_ = RunProgress{reply.round, {}};
    for (const auto& info : reply.slots) planned_->shards.push_back(info.position);
    // Until the next plan this worker runs the tasks the plan leased it: its own shard's (a joiner
    // learns there where its slot stands) and those of vacant slots dealt to it, each from where
    // the plan says its shard stands.
    std::map<int64_t, data::SamplerPosition> adopted;
    for (const auto& task : reply.tasks) {
      if (task.shard == slot()) {
        if (joined_.joiner) joined_position_ = task.from;
      } else {
        adopted.emplace(task.shard, task.from);
      }
    }
    if (adopted != adopted_) {
      adopted_ = std::move(adopted);
      adoption_changed_ = true;
    }
    leads_ = reply.rank == 0;
    return plan;
  }
}

void ElasticSession::end_round(const algorithms::RoundPlan& plan, int64_t step, uint64_t params_hash, bool last) {
  ask([&] {
    client_.round_done({joined_.member, plan.round, plan.epoch, step, params_hash, last});
    return 0;
  });
  if (planned_ && planned_->rounds == plan.round) completed_ = planned_;
  ended_epochs_[plan.round] = plan.epoch;
  constexpr size_t kRecent = 64;  // more than the rounds a sync strategy reports at once
  while (ended_epochs_.size() > kRecent) ended_epochs_.erase(ended_epochs_.begin());
}

int64_t ElasticSession::round_epoch(int64_t round) const {
  const auto it = ended_epochs_.find(round);
  return it == ended_epochs_.end() ? -1 : it->second;
}

}  // namespace loco::runtime
