#include "loco/runtime/worker/telemetry.h"

#include <unistd.h>

#include "loco/runtime/worker/worker.h"

namespace loco::runtime {

TelemetrySender::TelemetrySender(const CoordinatorClient& client, Identity who, std::chrono::milliseconds interval)
    : address_(client.address()), security_(client.security()), who_(std::move(who)), interval_(interval) {
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

void TelemetrySender::send(CoordinatorClient& channel) {
  auto batch = telemetry_.take();
  nlohmann::json body = {{"rank", who_.rank}, {"name", who_.name}, {"host", host_name()}, {"pid", ::getpid()},
                         {"activity", std::string(metrics::to_string(telemetry_.activity()))},
                         {"step", telemetry_.step()}, {"dropped", batch.dropped}, {"events", batch.events}};
  if (who_.member >= 0) body["member"] = who_.member;
  try {
    const auto [status, text] = channel.request("POST", "/v1/telemetry", body.dump(), std::chrono::milliseconds(2000));
    if (status == 200) return;
  } catch (const std::exception&) {
  }
  telemetry_.put_back(std::move(batch));
}

}  // namespace loco::runtime
