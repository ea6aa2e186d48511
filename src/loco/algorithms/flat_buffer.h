// Shared by the algorithms: a flat fp32 CPU buffer laid over a list of tensors, reduced in buckets,
// and the parameter hash that workers compare.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <vector>

#include "loco/comm/group.h"

namespace loco::algorithms {

// One contiguous fp32 CPU buffer with a view shaped like each of `like`, all-reduced as one
// operation whose messages are pieces of at most `piece_bytes` (pipelined, spread over the
// group's connections; comm/group.h).
class FlatBuffer {
 public:
  FlatBuffer(const std::vector<torch::Tensor>& like, int64_t piece_bytes);
  std::vector<torch::Tensor>& views() { return views_; }
  torch::Tensor& flat() { return flat_; }
  // Sums the buffer across the group (or combines it robustly), with `encoding` on the wire and
  // `tally` carried along (see Group::all_reduce_sum). Throws PeerError on a peer's failure.
  comm::CommStats all_reduce_sum(comm::Group& group, comm::Encoding encoding = comm::Encoding::kFp32,
                                 comm::Tally* tally = nullptr, comm::Combine combine = comm::Combine::kSum, int64_t trim = 1);

 private:
  torch::Tensor flat_;
  std::vector<torch::Tensor> views_;
  int64_t piece_bytes_;
};

// XXH3-64 over the bytes of `tensors` (copied to CPU when needed), in order.
uint64_t hash_tensors(const std::vector<torch::Tensor>& tensors);

// Checks that every rank of `group` holds bit-identical `tensors` (e.g. the initial parameters).
// Throws DataError naming the ranks that differ from rank 0, with a hint.
comm::CommStats check_identical(comm::Group& group, const std::vector<torch::Tensor>& tensors, const std::string& what);

// Rank 0's `counters` and `tensors` (fp32, the same shapes on every rank) overwrite every other
// rank's: two broadcasts, the counters and then the tensors as one flat buffer. How an elastic
// strategy hands its state to a joiner.
comm::CommStats broadcast_state(comm::Group& group, std::vector<int64_t>& counters, std::vector<torch::Tensor>& tensors);

}  // namespace loco::algorithms
