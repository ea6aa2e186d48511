#include "loco/runtime/coordinator/outer_service.h"

#include <fmt/format.h>

#include <filesystem>

#include "loco/core/run_folder.h"
#include "loco/runtime/coordinator/outer_wire.h"
#include "loco/runtime/coordinator/protocol.h"
#include "loco/runtime/coordinator/run.h"

namespace loco::runtime {

namespace {

algorithms::AsyncOptions service_options(const RunConfig& config, int64_t dataset_vocab) {
  auto o = async_options(config);
  o.values = protocol::model_values(config, dataset_vocab);
  o.max_wait_s = config.cluster.timeout_s / 2;  // an answer comes well within the worker's read timeout
  return o;
}

}  // namespace

OuterService::OuterService(const RunConfig& config, int64_t dataset_vocab, bool resume, Log log, Stopping stopping)
    : config_(config), log_(std::move(log)), stopping_(std::move(stopping)), server_(service_options(config, dataset_vocab)) {
  const auto file = RunFolder(config.run.dir).outer_state();
  if (!resume) {
    // A coordinator restarted on its run without --resume would write a fresh outer state over the
    // saved one at its first save.
    std::error_code error;
    if (std::filesystem::exists(file, error)) {
      throw ConfigError("coordinator", fmt::format("{} holds an asynchronous run's outer state; pass --resume to continue "
                                                   "the run, or choose another --run.dir (nothing was overwritten)", file.string()));
    }
    return;
  }
  if (protocol::load_outer_state(server_, file)) {
    const auto totals = server_.totals();
    log_(fmt::format("resuming the asynchronous outer state of {}: version {}, {} of the run's {} inner steps done",
                     file.string(), totals.version, totals.steps_done, totals.budget));
  } else {
    log_(fmt::format("{} holds no asynchronous outer state (the run stopped before it was first saved): the first "
                     "worker's parameters start it again", file.string()));
  }
}

void OuterService::install(HttpServer& server, const std::function<HttpServer::Handler(HttpServer::Handler)>& wrap) {
  server.route("POST", protocol::kOuterPath, wrap([this](const HttpRequest& request, HttpResponse& response) {
    const auto push = protocol::decode_outer_push(request.body);
    if (auto why = stopping_()) throw Refusal(*why);  // the worker stops (its link: RunStopping)
    algorithms::AsyncReply reply;
    try {
      reply = server_.exchange(push, std::chrono::steady_clock::now());
    } catch (const Error& e) {
      throw protocol::ProtocolError(e.what());
    }
    for (const auto& note : server_.take_notes()) log_(note);
    save(reply.finished);
    response.status = 200;
    response.set_content(protocol::encode_outer_reply(reply), "application/octet-stream");
  }));
}

void OuterService::save(bool now) {
  std::unique_lock lock(save_mutex_, std::defer_lock);
  if (now) {
    lock.lock();
  } else if (!lock.try_lock() || std::chrono::steady_clock::now() - saved_ < std::chrono::seconds(30)) {
    return;
  }
  saved_ = std::chrono::steady_clock::now();
  try {
    protocol::save_outer_state(server_, RunFolder(config_.run.dir).outer_state());
  } catch (const std::exception& e) {
    log_(fmt::format("cannot save the asynchronous outer state: {}", e.what()));
  }
}

}  // namespace loco::runtime
