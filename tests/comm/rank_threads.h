// Runs ranks as threads of the test process (c10d's own test pattern): each thread's result or
// exception is collected and asserted on the main thread, never inside a rank.
#pragma once

#include <csignal>
#include <exception>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

namespace loco::testing_util {

// loco's binaries ignore SIGPIPE (cli/command.h, ignore_broken_pipes): a rank that writes to a peer
// which failed and closed its connections must get EPIPE, as a worker does, not end the test's
// process (SealedGroupTest's rank 2 failing while rank 1 still sent once did, with status 141).
inline const bool kBrokenPipesIgnored = [] {
  std::signal(SIGPIPE, SIG_IGN);
  return true;
}();

template <class T>
struct RankResult {
  std::optional<T> value;
  std::exception_ptr error;
  std::string message() const {
    if (!error) return "";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      return e.what();
    }
  }
};

template <class T>
std::vector<RankResult<T>> run_ranks(int64_t size, const std::function<T(int64_t rank)>& body) {
  std::vector<RankResult<T>> results(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        results[static_cast<size_t>(r)].value = body(r);
      } catch (...) {
        results[static_cast<size_t>(r)].error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace loco::testing_util
