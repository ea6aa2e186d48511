#include "loco/runtime/worker/shard_turns.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iterator>

namespace loco::runtime {

std::optional<std::string> ShardTurns::update() {
  if (link_ == nullptr) return std::nullopt;
  auto wanted = link_->take_adoption();
  if (!wanted) return std::nullopt;
  std::vector<int64_t> taken, dropped;
  for (auto it = adopted_.begin(); it != adopted_.end();) {
    if (wanted->count(it->first) == 0) {
      dropped.push_back(it->first);
      it = adopted_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [slot, position] : *wanted) {
    auto it = adopted_.find(slot);
    if (it == adopted_.end()) {
      it = adopted_.try_emplace(slot, link_->shard_tokens(slot), context_, seed_ + static_cast<uint64_t>(slot)).first;
      taken.push_back(slot);
    }
    if (it->second.position() != position) it->second.restore(position);
  }
  turn_ = 0;
  if (taken.empty() && dropped.empty()) return std::nullopt;
  std::string said;
  if (!taken.empty()) said = fmt::format("reads the shard of vacant slot(s) {} in turn with its own", fmt::join(taken, ", "));
  if (!dropped.empty()) {
    said += fmt::format("{}stops reading slot(s) {} (another member reads them now)", said.empty() ? "" : "; ",
                        fmt::join(dropped, ", "));
  }
  return said;
}

data::WindowSampler& ShardTurns::next() {
  const auto k = static_cast<size_t>(turn_++ % static_cast<int64_t>(adopted_.size() + 1));
  return k == 0 ? own_ : std::next(adopted_.begin(), static_cast<std::ptrdiff_t>(k - 1))->second;
}

std::map<int64_t, data::SamplerPosition> ShardTurns::positions() const {
  std::map<int64_t, data::SamplerPosition> out;
  for (const auto& [slot, sampler] : adopted_) out.emplace(slot, sampler.position());
  return out;
}

std::vector<int64_t> ShardTurns::adopted_slots() const {
  std::vector<int64_t> out;
  for (const auto& [slot, sampler] : adopted_) out.push_back(slot);
  return out;
}

}  // namespace loco::runtime
