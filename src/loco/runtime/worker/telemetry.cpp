#include "loco/runtime/worker/telemetry.h"

#include <unistd.h>

#include "loco/runtime/worker/worker.h"

namespace loco::runtime {

TelemetrySender::TelemetrySender(const CoordinatorClient& client, Identity who, std::chrono::milliseconds interval)
    : address_(client.address()), security_(client.security()), who_(std::move(who)), interval_(interval),
      session_(static_cast<int64_t>(std::random_device{}() >> 1) + 1) {
  thread_ = std::thread([this] { loop(); });
}

TelemetrySender::~TelemetrySender() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void TelemetrySender::loop() {
  // A short patience: a report that does not get through waits for the next one.
  CoordinatorClient channel(address_, std::chrono::milliseconds(2000), security_);
  channel.set_patience(std::chrono::milliseconds(1000));
  std::unique_lock lock(mutex_);
  for (;;) {
    const bool last = wake_.wait_for(lock, interval_, [this] { return stopping_; });
    lock.unlock();
    send(channel);
    lock.lock();
    if (last) return;
  }
}

// A batch carries a sequence number, and is sent again with it until the coordinator answers: one
// whose answer was lost is applied once. A batch refused as malformed (400) or too large (413) is
// dropped rather than sent forever. Meanwhile new events wait in the (bounded) buffer. Without a
// batch, the report says what the worker is doing, under the last number (nothing to apply).
void TelemetrySender::send(CoordinatorClient& channel) {
  if (!pending_) {
    auto batch = telemetry_.take();
    if (!batch.events.empty() || batch.dropped > 0) pending_ = std::move(batch), ++seq_;
  }
  nlohmann::json body = {{"rank", who_.rank}, {"name", who_.name}, {"host", host_name()}, {"pid", ::getpid()},
                         {"activity", std::string(metrics::to_string(telemetry_.activity()))}, {"step", telemetry_.step()},
                         {"session", session_}, {"seq", seq_}, {"dropped", pending_ ? pending_->dropped : 0},
                         {"events", pending_ ? nlohmann::json(pending_->events) : nlohmann::json::array()}};
  if (who_.member >= 0) body["member"] = who_.member;
  int status = 0;
  try {
    status = channel.request("POST", "/v1/telemetry", protocol::to_wire(body), std::chrono::milliseconds(2000)).first;
  } catch (const std::exception&) {
  }
  if (status == 200 || status == 400 || status == 413) pending_.reset();
}

}  // namespace loco::runtime
