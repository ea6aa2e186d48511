#include "loco/data/batcher.h"

#include "loco/core/error.h"

namespace loco::data {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

torch::Tensor to_stream(const std::vector<int32_t>& tokens) {
  return torch::from_blob(const_cast<int32_t*>(tokens.data()), {static_cast<int64_t>(tokens.size())}, torch::kInt32)
      .to(torch::kInt64);  // copies
}

Batch gather(const torch::Tensor& stream, const torch::Tensor& targets, const std::vector<int64_t>& starts, int64_t context) {
  auto begin = torch::tensor(starts, torch::kInt64).unsqueeze(1);               // (B, 1)
  auto index = begin + torch::arange(context + 1, torch::kInt64).unsqueeze(0);  // (B, T+1)
  auto windows = stream.index_select(0, index.reshape({-1})).view(index.sizes());
  auto shifted = targets.index_select(0, (index.narrow(1, 1, context)).reshape({-1})).view({index.size(0), context});
  return {windows.narrow(1, 0, context).contiguous(), shifted.contiguous()};
}

torch::Tensor target_stream(const torch::Tensor& stream, const std::vector<int32_t>* targets, size_t tokens) {
  if (targets == nullptr) return stream;
  LOCO_CHECK(targets->size() == tokens, "a target stream of {} tokens for {} tokens", targets->size(), tokens);
  return to_stream(*targets);
}

}  // namespace

WindowSampler::WindowSampler(const std::vector<int32_t>& tokens, int64_t context, uint64_t seed,
                             const std::vector<int32_t>* targets)
    : context_(context), seed_(seed) {
  LOCO_CHECK(context >= 1, "context must be >= 1");
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < context + 1) {
    throw DataError("data", fmt::format("the training split has {} tokens, fewer than one window of context + 1 = {}; "
                                        "hint: use a smaller model.context or more text",
                                        n, context + 1));
  }
  stream_ = to_stream(tokens);
  targets_ = target_stream(stream_, targets, tokens.size());
  order_.resize(static_cast<size_t>((n - 1) / context));
  shuffle_for_epoch(0);
}

void WindowSampler::shuffle_for_epoch(uint64_t epoch) {
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int64_t>(i);
  uint64_t state = seed_ ^ (0x5851f42d4c957f2dull * (epoch + 1));
  for (size_t i = order_.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(splitmix64(state) % i);
    std::swap(order_[i - 1], order_[j]);
  }
}

Batch WindowSampler::next(int64_t batch_size) {
  LOCO_CHECK(batch_size >= 1, "batch_size must be >= 1");
  std::vector<int64_t> starts;
  starts.reserve(static_cast<size_t>(batch_size));
  for (int64_t b = 0; b < batch_size; ++b) {
    if (position_.cursor == order_.size()) {
      ++position_.epoch;
      position_.cursor = 0;
      shuffle_for_epoch(position_.epoch);
    }
    starts.push_back(order_[position_.cursor++] * context_);
  }
  return gather(stream_, targets_, starts, context_);
}

void WindowSampler::restore(const SamplerPosition& position) {
  if (position.cursor > order_.size()) {
    throw DataError("data", fmt::format("data position (epoch {}, window {}) is beyond the {} windows of an epoch; "
                                        "was the checkpoint made with another dataset or context?",
                                        position.epoch, position.cursor, order_.size()));
  }
  position_ = position;
  shuffle_for_epoch(position.epoch);
}

std::vector<Batch> evaluation_batches(const std::vector<int32_t>& tokens, int64_t context, int64_t count,
                                      int64_t batch_size, const std::vector<int32_t>* targets) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t available = (n - 1) / context;
  if (available < 1) {
    throw DataError("data", fmt::format("the validation split has {} tokens, fewer than one window of {}", n, context + 1));
  }
  count = std::min(count, available);
  auto stream = to_stream(tokens);
  const auto target = target_stream(stream, targets, tokens.size());
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < count; ++i) starts.push_back((i * available / count) * context);
  std::vector<Batch> batches;
  for (size_t first = 0; first < starts.size(); first += static_cast<size_t>(batch_size)) {
    const size_t last = std::min(starts.size(), first + static_cast<size_t>(batch_size));
    batches.push_back(gather(stream, target, {starts.begin() + static_cast<std::ptrdiff_t>(first), starts.begin() + static_cast<std::ptrdiff_t>(last)}, context));
  }
  return batches;
}

std::vector<Batch> covering_batches(const std::vector<int32_t>& tokens, int64_t context, int64_t batch_size,
                                    const std::vector<int32_t>* targets) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 2) throw DataError("data", fmt::format("a document of {} token(s) has nothing to score", n));
  LOCO_CHECK(context >= 1 && batch_size >= 1, "context {} and batch size {} must be >= 1", context, batch_size);
  const int64_t windows = (n - 1 + context - 1) / context;
  auto stream = torch::zeros({windows * context + 1}, torch::kInt64);
  auto target = torch::full({windows * context + 1}, int64_t{kIgnoredTarget}, torch::kInt64);
  stream.narrow(0, 0, n).copy_(to_stream(tokens));
  target.narrow(0, 0, n).copy_(target_stream(stream.narrow(0, 0, n), targets, tokens.size()));
  std::vector<Batch> batches;
  for (int64_t first = 0; first < windows; first += batch_size) {
    std::vector<int64_t> starts;
    for (int64_t w = first; w < std::min(windows, first + batch_size); ++w) starts.push_back(w * context);
    batches.push_back(gather(stream, target, starts, context));
  }
  return batches;
}

}  // namespace loco::data
