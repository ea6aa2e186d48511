// A small key-value store: the rendezvous medium of a process group.
//
// Ranks publish their addresses under keys and wait for each other's; the coordinator serves one
// store to every worker (runtime/coordinator) and tests share one in memory between threads. Keys
// and values are arbitrary bytes; every wait takes an explicit timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace loco::comm {

using Duration = std::chrono::milliseconds;

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value of `key`, waiting up to `timeout` for it to be set; nullopt when it was not set in time.
  virtual std::optional<std::string> get(const std::string& key, Duration timeout) = 0;
  // Adds `delta` to the integer stored at `key` (0 when absent) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Whether every key in `keys` is set (does not wait).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Removes `key`; returns whether it existed.
  virtual bool remove(const std::string& key) = 0;
  virtual int64_t size() = 0;
};

// In-process store: a map under a mutex, waiters woken by a condition variable. Thread-safe.
class MemoryKeyValueStore final : public KeyValueStore {
 public:
  // Refuses (throws Error) a value larger than `max_value_bytes` or a store larger than `max_keys`
  // keys: the coordinator serves this store to the network.
  explicit MemoryKeyValueStore(size_t max_value_bytes = 1 << 20, size_t max_keys = 1 << 16);

  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  bool remove(const std::string& key) override;
  int64_t size() override;
  // Removes every key that starts with `prefix` (an old membership epoch's keys). Returns how many.
  int64_t remove_prefix(const std::string& prefix);

 private:
  void check_room(const std::string& key, size_t value_bytes) const;  // mutex held
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
  size_t max_value_bytes_, max_keys_;
};

}  // namespace loco::comm
