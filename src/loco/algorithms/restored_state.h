// A sync strategy's checkpointed state, taken apart entry by entry on resume: every entry must be
// used exactly once, and a missing, misshapen or unexpected one is a DataError naming it.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <map>
#include <string>

#include "loco/algorithms/sync.h"
#include "loco/core/error.h"

namespace loco::algorithms {

class RestoredState {
 public:
  // `owner` names the strategy in messages ("DiLoCo", "Streaming DiLoCo").
  RestoredState(std::string owner, const NamedTensors& tensors) : owner_(std::move(owner)) {
    for (const auto& [key, value] : tensors) entries_[key] = value;
  }
  bool empty() const { return entries_.empty(); }
  bool has(const std::string& key) const { return entries_.count(key) > 0; }

  torch::Tensor take(const std::string& key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) throw DataError("algorithms", fmt::format("{} state has no entry '{}'", owner_, key));
    auto value = it->second;
    entries_.erase(it);
    return value;
  }
  int64_t take_int(const std::string& key) { return take(key).item<int64_t>(); }

  // Copies the entry into `into`, which must have its shape.
  void take_into(const std::string& key, const torch::Tensor& into) {
    auto value = take(key);
    if (!value.sizes().equals(into.sizes())) {
      throw DataError("algorithms", fmt::format("{} state '{}' has shape [{}], the model needs [{}]", owner_, key,
                                                fmt::join(value.sizes(), ", "), fmt::join(into.sizes(), ", ")));
    }
    into.copy_(value);
  }

  // Every entry whose key starts with `prefix`, the prefix removed.
  NamedTensors take_prefix(const std::string& prefix) {
    NamedTensors out;
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->first.starts_with(prefix)) {
        out.emplace_back(it->first.substr(prefix.size()), it->second);
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }

  // Throws naming the first entry nobody took; `hint` is appended to the message.
  void expect_all_taken(const std::string& hint = "") const {
    if (entries_.empty()) return;
    throw DataError("algorithms", fmt::format("{} state has an unexpected entry '{}'{}", owner_, entries_.begin()->first, hint));
  }

 private:
  std::string owner_;
  std::map<std::string, torch::Tensor> entries_;
};

}  // namespace loco::algorithms
