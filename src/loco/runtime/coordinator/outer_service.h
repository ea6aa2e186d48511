// Asynchronous DiLoCo's outer state at the coordinator (docs/async.md): the AsyncOuterServer behind
// POST /v1/outer, saved to RUN/outer.safetensors so that a stopped or killed run resumes from it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "loco/algorithms/async_outer.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/net/http_server.h"

namespace loco::runtime {

class OuterService {
 public:
  using Log = std::function<void(const std::string&)>;
  // A resumed run's state comes from RUN/outer.safetensors (a new start when none was saved: the
  // first worker's θ starts it again). Throws DataError when the file cannot be read.
  OuterService(const RunConfig& config, bool resume, Log log);

  // POST /v1/outer, its handler wrapped by `wrap` (the coordinator's authentication and errors).
  void install(HttpServer& server, const std::function<HttpServer::Handler(HttpServer::Handler)>& wrap);
  // Saves the state: every 30 s as exchanges come, at once when `now` (the run's last steps, the
  // coordinator's end). One save at a time; a failed one is logged, the previous file intact.
  void save(bool now);

 private:
  RunConfig config_;
  Log log_;
  algorithms::AsyncOuterServer server_;
  std::mutex save_mutex_;
  std::chrono::steady_clock::time_point saved_{};
};

}  // namespace loco::runtime
