#include "loco/runtime/worker/outer_link.h"

#include <fmt/format.h>

#include "loco/algorithms/membership.h"
#include "loco/core/error.h"
#include "loco/runtime/coordinator/outer_wire.h"

namespace loco::runtime {

namespace {

std::chrono::milliseconds millis(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

class CoordinatorOuterLink final : public algorithms::OuterServerLink {
 public:
  CoordinatorOuterLink(const RunConfig& config, const CoordinatorClient& client)
      : client_(client.address(), millis(config.cluster.connect_timeout_s), client.security()),
        timeout_(millis(config.cluster.timeout_s)) {
    client_.set_patience(timeout_);
  }

  algorithms::AsyncReply exchange(const algorithms::AsyncPush& push) override {
    if (values_ == 0 && push.values.defined()) {
      values_ = push.values.numel();  // the first contact sends θ: the model's size
      client_.set_max_answer_bytes(static_cast<size_t>(values_) * 4 + (64 << 10));
    }
    auto [status, body] = client_.request("POST", protocol::kOuterPath, protocol::encode_outer_push(push), timeout_);
    if (status == 409) throw algorithms::RunStopping(error_text(body));  // the run is stopping, or failed
    if (status != 200) {
      throw PeerError("worker", fmt::format("the coordinator refused worker {}'s outer exchange ({}): {}", push.worker, status,
                                            error_text(body)));
    }
    try {
      return protocol::decode_outer_reply(body, values_);
    } catch (const protocol::ProtocolError& e) {
      throw PeerError("worker", e.what());
    }
  }

 private:
  CoordinatorClient client_;
  std::chrono::milliseconds timeout_;
  int64_t values_ = 0;
};

}  // namespace

std::unique_ptr<algorithms::SyncStrategy> make_async_strategy(const RunConfig& config, const CoordinatorClient& client, int64_t rank,
                                                              int64_t member, const std::atomic<bool>* stop) {
  algorithms::AsyncWorkerOptions options;
  options.member = member;
  if (config.sync.algorithm == Algorithm::kStreaming) {
    options.fragments = config.sync.fragments;
    options.pattern = config.sync.fragment_pattern;
    options.merge_alpha = config.sync.merge_alpha;
  }
  return std::make_unique<algorithms::AsyncDiLoCo>(std::make_shared<CoordinatorOuterLink>(config, client), rank,
                                                   algorithms::parse_poison(config.sync.poison), stop, options);
}

}  // namespace loco::runtime
