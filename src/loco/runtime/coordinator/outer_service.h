// Asynchronous DiLoCo's outer state at the coordinator (docs/async.md): the AsyncOuterServer behind
// POST /v1/outer, saved to RUN/outer.safetensors so that a stopped or killed run resumes from it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "loco/algorithms/async_outer.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/net/http_server.h"

namespace loco::runtime {

class OuterService {
 public:
  using Log = std::function<void(const std::string&)>;
  // Why the run takes no more outer gradients (it is stopping or failed), or nullopt.
  using Stopping = std::function<std::optional<std::string>()>;
  // A resumed run's state comes from RUN/outer.safetensors (a new start when none was saved: the
  // first worker's θ starts it again). `dataset_vocab` sizes the model when model.vocab_size is 0.
  // Throws DataError when the file cannot be read.
  OuterService(const RunConfig& config, int64_t dataset_vocab, bool resume, Log log, Stopping stopping);

  // POST /v1/outer, its handler wrapped by `wrap` (the coordinator's authentication and errors).
  void install(HttpServer& server, const std::function<HttpServer::Handler(HttpServer::Handler)>& wrap);
  // Saves the state: every 30 s as exchanges come, at once when `now` (the run's last steps, the
  // coordinator's end). One save at a time; a failed one is logged, the previous file intact.
  void save(bool now);
  // The coordinator's end: no exchange waits for a batch any more (AsyncOuterServer::close).
  void close() { server_.close(); }
  // The outer state itself, for an elastic run's slots (async_elastic_run.h).
  algorithms::AsyncOuterServer& server() { return server_; }

 private:
  RunConfig config_;
  Log log_;
  Stopping stopping_;
  algorithms::AsyncOuterServer server_;
  std::mutex save_mutex_;
  std::chrono::steady_clock::time_point saved_{};
};

}  // namespace loco::runtime
