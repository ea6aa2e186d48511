// A worker's way to asynchronous DiLoCo's outer state: the coordinator's POST /v1/outer
// (coordinator/outer_wire.h), over a client of its own whose answers may carry the model.
#pragma once

#include <memory>

#include "loco/algorithms/async_outer.h"
#include "loco/runtime/coordinator/coordinator_client.h"

namespace loco::runtime {

// Asynchronous DiLoCo (sync.async) for worker `rank` (an elastic run's slot, held by `member`; -1
// in a fixed run) whose coordinator `client` reaches; `stop` (may be null) is the worker's stop flag.
std::unique_ptr<algorithms::SyncStrategy> make_async_strategy(const RunConfig& config, const CoordinatorClient& client, int64_t rank,
                                                              int64_t member, const std::atomic<bool>* stop);

}  // namespace loco::runtime
