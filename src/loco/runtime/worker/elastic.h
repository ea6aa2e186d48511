// A worker's side of elastic membership (cluster.elastic; docs/failure-model.md): the
// algorithms::Membership that DiLoCo asks at each round's end, over the coordinator.
//
// Its Heartbeats go every cluster.heartbeat_s (an asynchronous run's workers send them too). Each
// answer says which membership epoch is current and whether it is broken; the process group of an
// older or broken epoch is abandoned at once (its waits poll that), so a survivor stuck in a
// collective with a frozen or killed peer gives up within a heartbeat of the coordinator's word,
// not after cluster.timeout_s.
//
// At a round's end the session long-polls POST /v1/round until the coordinator convenes the round,
// then reuses the group of that epoch or forms the new one (keys under "epoch/<n>/").
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "loco/algorithms/membership.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/coordinator/coordinator_client.h"
#include "loco/runtime/store/checkpoint.h"

namespace loco::runtime {

// A member's heartbeats to the coordinator (elastic runs): every cluster.heartbeat_s from a thread
// of their own, on a connection of their own (the main thread's long polls must not delay one),
// until destroyed. `request` makes each (called on that thread); `answer` sees each reply. An
// unreachable coordinator is left to the main thread's requests to report.
class Heartbeats {
 public:
  Heartbeats(const RunConfig& config, CoordinatorClient& client, std::function<protocol::HeartbeatRequest()> request,
             std::function<void(const protocol::HeartbeatReply&)> answer);
  ~Heartbeats();
  Heartbeats(const Heartbeats&) = delete;
  Heartbeats& operator=(const Heartbeats&) = delete;

 private:
  void loop(CoordinatorClient& channel, double interval_s);

  std::function<protocol::HeartbeatRequest()> request_;
  std::function<void(const protocol::HeartbeatReply&)> answer_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool quit_ = false;
  std::thread thread_;  // last: started once the rest is built
};

class ElasticSession final : public algorithms::Membership {
 public:
  // `joined` is the coordinator's answer to this worker's join; `groups` forms each epoch's group.
  ElasticSession(const RunConfig& config, CoordinatorClient& client, const protocol::JoinReply& joined,
                 comm::GroupFactory groups, const std::atomic<bool>* stop);
  ~ElasticSession() override;
  ElasticSession(const ElasticSession&) = delete;
  ElasticSession& operator=(const ElasticSession&) = delete;

  bool joining() const override { return joined_.joiner; }
  algorithms::RoundPlan begin_round(int64_t round, int64_t step, int64_t failed_epoch, const std::string& failure) override;
  void end_round(const algorithms::RoundPlan& plan, int64_t step, uint64_t params_hash, bool last) override;
  bool leads() const override { return leads_.load(); }

  int64_t member() const { return joined_.member; }
  int64_t slot() const { return joined_.rank; }
  // The sampler position of this worker's slot at the end of each step (sent at the round's end)
  // and the steps done (sent with the heartbeats: what a failure would discard).
  // `adopted`: the positions of the other shards it reads (those of the current adoption).
  void record_progress(const data::SamplerPosition& position, const std::map<int64_t, data::SamplerPosition>& adopted,
                       int64_t step);
  // The shards of vacant slots this worker is to read besides its own, once a round's plan changed
  // them: slot -> where its shard stands (nullopt: no change since the last call).
  std::optional<std::map<int64_t, data::SamplerPosition>> take_adoption();
  // Where a joiner's slot stands, as its first round's plan says (nullopt before it).
  std::optional<data::SamplerPosition> joined_position() const;
  // The rounds completed and every slot's data position as of the last of them that this worker
  // took part in (nullopt before its first): the run's section of the checkpoints it writes.
  std::optional<RunProgress> run_progress() const { return completed_; }
  // The epoch in which this worker last completed round `round` (-1: not among its recent rounds).
  int64_t round_epoch(int64_t round) const;
  // Whether the coordinator still counts this worker as a member (false once it was declared
  // failed, e.g. after being frozen).
  bool still_member() const { return member_.load(); }

 private:
  // This member's heartbeat: its steps, and the peers of its current group that closed.
  protocol::HeartbeatRequest heartbeat();
  void watch(std::optional<std::pair<int64_t, comm::Group>> group);
  // The watched group failed: its closed peers are kept, the group let go.
  void watch_failed();
  // Runs a request to the coordinator; one unreachable through all its retries (the client's
  // patience: cluster.coordinator_timeout_s) ends this worker's membership: CoordinatorLost.
  template <class F>
  auto ask(F&& request) {
    try {
      return request();
    } catch (const CoordinatorUnreachable& e) {
      throw algorithms::CoordinatorLost(e.what());
    }
  }
  bool should_abort(int64_t epoch) const;

  RunConfig config_;
  CoordinatorClient& client_;
  protocol::JoinReply joined_;
  comm::GroupFactory groups_;
  const std::atomic<bool>* stop_;
  data::SamplerPosition position_;
  std::map<int64_t, data::SamplerPosition> adopted_;  // the shards read besides its own, and where they stand
  bool adoption_changed_ = false;
  std::optional<data::SamplerPosition> joined_position_;
  std::optional<RunProgress> planned_;    // the convened round's, until it completes
  std::optional<RunProgress> completed_;
  std::map<int64_t, int64_t> ended_epochs_;  // round -> the epoch it completed in here (the recent ones)
  std::optional<std::pair<int64_t, comm::Group>> group_;  // the group of an epoch, reused while it lasts
  std::atomic<bool> leads_{false};

  // Written by the heartbeat thread.
  std::atomic<int64_t> current_epoch_{0};
  std::atomic<int64_t> step_{-1};  // written by the training thread
  std::atomic<bool> epoch_broken_{false}, member_{true};
  // The current epoch's group, for the heartbeats to say which peers closed their connections;
  // once it failed, the peers it saw closed (kept until the next group forms).
  std::mutex watch_mutex_;
  std::optional<std::pair<int64_t, comm::Group>> watched_;
  std::optional<std::pair<int64_t, std::vector<int64_t>>> closed_before_;
  std::optional<Heartbeats> heartbeats_;  // last: its thread reads the above
};

}  // namespace loco::runtime
