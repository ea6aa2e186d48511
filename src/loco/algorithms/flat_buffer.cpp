#include "loco/algorithms/flat_buffer.h"

#include <fmt/ranges.h>

#include "loco/core/error.h"
#include "loco/core/hash.h"

namespace loco::algorithms {

FlatBuffer::FlatBuffer(const std::vector<torch::Tensor>& like, int64_t piece_bytes) : piece_bytes_(piece_bytes) {
  LOCO_CHECK(piece_bytes >= 4, "pieces of {} bytes", piece_bytes);
  int64_t total = 0;
  for (const auto& t : like) total += t.numel();
  flat_ = torch::zeros({total}, torch::kFloat32);
  int64_t offset = 0;
  for (const auto& t : like) {
    views_.push_back(flat_.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

comm::CommStats FlatBuffer::all_reduce_sum(comm::Group& group, comm::Encoding encoding, comm::Tally* tally,
                                           comm::Combine combine, int64_t trim) {
  comm::ReduceOptions options;
  options.encoding = encoding;
  options.combine = combine;
  options.trim = trim;
  options.piece_bytes = piece_bytes_;
  return group.all_reduce_sum(flat_, options, tally);
}

uint64_t hash_tensors(const std::vector<torch::Tensor>& tensors) {
  Hasher hasher;
  for (const auto& t : tensors) {
    auto c = t.detach().to(torch::kCPU).contiguous();
    hasher.update(c.data_ptr(), static_cast<size_t>(c.numel() * c.element_size()));
  }
  return hasher.digest();
}

comm::CommStats check_identical(comm::Group& group, const std::vector<torch::Tensor>& tensors, const std::string& what) {
  const uint64_t mine = hash_tensors(tensors);
  std::vector<torch::Tensor> all;
  auto stats = group.all_gather(torch::tensor(static_cast<int64_t>(mine), torch::kInt64), all);
  std::vector<std::string> differ;
  const int64_t reference = all.front().item<int64_t>();
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r].item<int64_t>() != reference) {
      differ.push_back(fmt::format("{} ({})", r, hex64(static_cast<uint64_t>(all[r].item<int64_t>()))));
    }
  }
  if (!differ.empty()) {
    throw DataError("algorithms", fmt::format("{} differ between workers: rank 0 has {}, rank(s) {}; hint: every worker "
                                              "must start from the same train.seed and train.init_from",
                                              what, hex64(static_cast<uint64_t>(reference)), fmt::join(differ, ", ")));
  }
  return stats;
}

comm::CommStats broadcast_state(comm::Group& group, std::vector<int64_t>& counters, std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  auto packed = torch::tensor(counters, torch::kInt64);
  std::vector<torch::Tensor> flat_parts;
  for (const auto& t : tensors) flat_parts.push_back(t.reshape({-1}));
  auto flat = torch::cat(flat_parts);
  comm::CommStats stats = group.broadcast(packed, 0);
  stats += group.broadcast(flat, 0);
  if (group.rank() == 0) return stats;
  for (size_t i = 0; i < counters.size(); ++i) counters[i] = packed[static_cast<int64_t>(i)].item<int64_t>();
  int64_t offset = 0;
  for (auto& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
  return stats;
}

}  // namespace loco::algorithms
