// A worker's reports to the coordinator's status page (runtime/status/dashboard.h): every second,
// on a thread and a connection of its own, the events its training loop recorded (metrics/telemetry.h)
// and what it is doing now go to POST /v1/telemetry, signed like every other request. The page is
// best effort: a report that cannot be delivered is kept for the next (bounded), and training never
// waits for it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "loco/metrics/telemetry.h"
#include "loco/runtime/coordinator/coordinator_client.h"

namespace loco::runtime {

class TelemetrySender {
 public:
  struct Identity {
    int64_t rank = -1;    // its rank (slot, in an elastic run)
    int64_t member = -1;  // its member id in an elastic run
    std::string name;     // as it joined ("host:pid")
  };
  // Starts the thread. `client` gives the coordinator's address and security; the sender opens its own.
  TelemetrySender(const CoordinatorClient& client, Identity who,
                  std::chrono::milliseconds interval = std::chrono::milliseconds(1000));
  // Sends what is left (the loop's last events), then stops.
  ~TelemetrySender();
  TelemetrySender(const TelemetrySender&) = delete;
  TelemetrySender& operator=(const TelemetrySender&) = delete;

  metrics::Telemetry& telemetry() { return telemetry_; }

 private:
  void loop();
  void send(CoordinatorClient& channel);

  const std::string address_;
  const ClientSecurity security_;
  const Identity who_;
  const std::chrono::milliseconds interval_;
  const int64_t session_;  // tells this sender's batch numbers from an earlier one's in the same process
  metrics::Telemetry telemetry_;
  // The thread's own: the batch not yet acknowledged, and its number.
  std::optional<metrics::Telemetry::Batch> pending_;
  int64_t seq_ = 0;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace loco::runtime
