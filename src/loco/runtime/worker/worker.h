// One worker (replica, island) of a multi-process run, `loco worker`: joins the coordinator,
// takes its shard of the data, forms the process group of its membership epoch, trains with the
// configured algorithm, and reports its end. `loco launch` starts several of these.
#pragma once

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>

#include "loco/algorithms/sync.h"
#include "loco/data/dataset.h"
#include "loco/data/sharding.h"
#include "loco/metrics/progress.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/coordinator/coordinator_client.h"
#include "loco/runtime/worker/trainer.h"

namespace loco::runtime {

struct WorkerOptions {
  std::string coordinator;                 // "host:port"
  int64_t rank = -1;                       // -1: assigned by the coordinator
  bool resume = false;                     // continue from this worker's checkpoints
  bool insecure = false;                   // believe a token-less coordinator's unsigned answers
  const std::atomic<bool>* stop = nullptr; // set by SIGINT/SIGTERM
  metrics::ProgressMode progress = metrics::ProgressMode::kLines;
  std::FILE* out = stderr;
};

// Runs the worker to its end. Returns its training summary (interrupted when the run stopped
// early; a checkpoint was saved). Throws on failure, after telling the coordinator.
TrainSummary run_worker(const RunConfig& config, const WorkerOptions& options);

// The division of the training split among `workers` (data.shard). Integer arithmetic for iid and
// label; for kmeans, documents are embedded by the initial model (train.seed, or train.init_from).
data::ShardAssignment assign_shards(const RunConfig& config, const data::Dataset& dataset, int64_t workers);

// Each training document's routing feature: the initial model's (train.seed, or train.init_from)
// mean final hidden state over the document's first data.route_tokens tokens, as DiPaCo routes
// and data.shard = "kmeans" clusters. (N documents, width) float32.
torch::Tensor embed_documents(const RunConfig& config, const data::Dataset& dataset);
// ... of the documents of `split` (the validation split's, to route them with a fitted router).
torch::Tensor embed_documents(const RunConfig& config, const data::Dataset& dataset, const data::Split& split);

// This machine's host name.
std::string host_name();
// How the worker process `pid` of this machine names itself when it joins: "host:pid", or in an
// elastic run "host[address]:pid" with the address its peers reach it at.
std::string process_name(int64_t pid, const std::string& address = {});

// The process groups of this worker's run: met through the coordinator's store, at cluster.host (or
// the address that reaches the coordinator), bounded by cluster.timeout_s.
comm::GroupFactory group_factory(const RunConfig& config, CoordinatorClient& client);

// The sync strategy of config.sync.algorithm over `group`.
std::unique_ptr<algorithms::SyncStrategy> make_strategy(const RunConfig& config, comm::Group group, int64_t shard_tokens);

}  // namespace loco::runtime
