// Which documents of the training split each worker trains on: every document goes to exactly one
// worker (a partition), decided the same way by every worker from the dataset and the config.
//
//   iid     documents in a seeded random order, cut into token-balanced contiguous runs
//   label   whole labels (e.g. Brown's 15 genres) to workers, largest first to the least loaded:
//           non-i.i.d. shards, as in DiLoCo's non-i.i.d. experiments
//   kmeans  clusters of document embeddings (k-means, k = workers); the caller embeds documents
//           (runtime: mean hidden state of the initial model over a document's first tokens)
//
// Within a shard, documents keep their order in the split, so one worker's shard is the split itself.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loco/data/dataset.h"

namespace loco::data {

struct ShardAssignment {
  std::string policy;                           // "iid", "label" or "kmeans"
  std::vector<std::vector<uint32_t>> documents; // per worker: indices into Split::documents, ascending
};

// Throws DataError when there are fewer documents than workers.
ShardAssignment shard_iid(const Split& split, int64_t workers, uint64_t seed);
// Throws DataError when fewer labels than workers have documents (naming them, with a hint).
ShardAssignment shard_by_label(const Split& split, const std::vector<std::string>& labels, int64_t workers);
// embeddings (N documents, D) float32. Throws DataError when a cluster comes out empty.
ShardAssignment shard_by_kmeans(const torch::Tensor& embeddings, int64_t workers, uint64_t seed);

// k-means++ initialization then Lloyd's iterations (until no point moves, at most `iterations`),
// deterministic given `seed`. points (N, D) float32 -> cluster of each point in [0, k).
std::vector<int64_t> kmeans(const torch::Tensor& points, int64_t k, uint64_t seed, int64_t iterations = 100);

// The token stream of `documents` of `split`, in that order (each document ends with its eos).
std::vector<int32_t> shard_tokens(const Split& split, const std::vector<uint32_t>& documents);

// Tokens in each worker's shard.
std::vector<uint64_t> shard_token_counts(const Split& split, const ShardAssignment& assignment);

}  // namespace loco::data
