#include "loco/comm/key_value.h"

#include <charconv>

#include "loco/core/error.h"

namespace loco::comm {

MemoryKeyValueStore::MemoryKeyValueStore(size_t max_value_bytes, size_t max_keys)
    : max_value_bytes_(max_value_bytes), max_keys_(max_keys) {}

void MemoryKeyValueStore::check_room(const std::string& key, size_t value_bytes) const {
  if (value_bytes > max_value_bytes_) {
    throw Error("comm", fmt::format("store: value of '{}' is {} bytes, more than the limit of {}", key, value_bytes,
                                    max_value_bytes_));
  }
  if (values_.size() >= max_keys_ && !values_.contains(key)) {
    throw Error("comm", fmt::format("store: full ({} keys); refusing '{}'", max_keys_, key));
  }
}

void MemoryKeyValueStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard lock(mutex_);
    check_room(key, value.size());
    values_[key] = value;
  }
  changed_.notify_all();
}

std::optional<std::string> MemoryKeyValueStore::get(const std::string& key, Duration timeout) {
  std::unique_lock lock(mutex_);
  const bool found = changed_.wait_for(lock, timeout, [&] { return values_.contains(key); });
  if (!found) return std::nullopt;
  return values_.at(key);
}

int64_t MemoryKeyValueStore::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard lock(mutex_);
    check_room(key, 32);
    if (auto it = values_.find(key); it != values_.end()) {
      const std::string& text = it->second;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size()) {
        throw Error("comm", fmt::format("store: add on '{}', which holds a value that is not an integer", key));
      }
    }
    value += delta;
    values_[key] = std::to_string(value);
  }
  changed_.notify_all();
  return value;
}

bool MemoryKeyValueStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  for (const auto& key : keys) {
    if (!values_.contains(key)) return false;
  }
  return true;
}

bool MemoryKeyValueStore::remove(const std::string& key) {
  std::lock_guard lock(mutex_);
  return values_.erase(key) > 0;
}

int64_t MemoryKeyValueStore::size() {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(values_.size());
}

int64_t MemoryKeyValueStore::remove_prefix(const std::string& prefix) {
  std::lock_guard lock(mutex_);
  int64_t removed = 0;
  for (auto it = values_.lower_bound(prefix); it != values_.end() && it->first.starts_with(prefix);) {
    it = values_.erase(it);
    ++removed;
  }
  return removed;
}

}  // namespace loco::comm
