// Asynchronous DiLoCo's exchange with the coordinator (POST /v1/outer; algorithms/async_outer.h):
// one JSON line, then the values as raw little-endian fp32 (the outer gradient going, θ coming
// back). The whole message is signed like every request and answer (auth.h).
#pragma once

#include <filesystem>
#include <string>

#include "loco/algorithms/async_outer.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/net/http_server.h"

namespace loco::runtime::protocol {

std::string encode_outer_push(const algorithms::AsyncPush& push);
// Throws ProtocolError naming what is malformed.
algorithms::AsyncPush decode_outer_push(const std::string& body);

std::string encode_outer_reply(const algorithms::AsyncReply& reply);
// Throws ProtocolError naming what is malformed; `values` is the model's size when known (> 0).
algorithms::AsyncReply decode_outer_reply(const std::string& body, int64_t values = 0);

// The outer state of an asynchronous run in `file` (RUN/outer.safetensors), written whole or not at
// all (Error naming the file otherwise) ...
void save_outer_state(const algorithms::AsyncOuterServer& server, const std::filesystem::path& file);
// ... and read back into `server` when the file exists (false when it does not; DataError naming
// the file when it cannot be read or does not fit the run).
bool load_outer_state(algorithms::AsyncOuterServer& server, const std::filesystem::path& file);

// The model's parameters from its config (model.vocab_size, else `dataset_vocab`); 0 when neither
// says.
int64_t model_values(const RunConfig& config, int64_t dataset_vocab);

// The route of the exchange.
inline constexpr const char* kOuterPath = "/v1/outer";

// The coordinator's server for a run with these exchanges: the outer-gradient route's bodies (a
// wide route, for requests whose head is signed), the budget they are held in and their deadline,
// grown to fit every worker's at once (the model's size from its config, with
// `dataset_vocab` when model.vocab_size is 0; 1 GiB a body when neither says).
void widen_for_outer_exchanges(HttpServerOptions& http, const RunConfig& config, int64_t dataset_vocab);

}  // namespace loco::runtime::protocol
