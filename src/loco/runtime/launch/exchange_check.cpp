#include "loco/runtime/launch/exchange_check.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <exception>
#include <thread>

#include "loco/comm/key_value.h"
#include "loco/core/error.h"

namespace loco::runtime {

ExchangeMeasurement measure_exchange(const Islands& islands, const ExchangeCheck& check) {
  const auto m = static_cast<int64_t>(islands.size());
  LOCO_CHECK(m >= 2 && check.values >= 1 && check.rounds >= 1, "measure_exchange: {} ranks, {} values, {} rounds", m,
             check.values, check.rounds);
  auto store = std::make_shared<comm::MemoryKeyValueStore>();
  std::barrier start(m);
  std::vector<std::vector<double>> seconds(static_cast<size_t>(m));
  std::vector<ExchangeMeasurement> out(static_cast<size_t>(m));
  std::vector<std::exception_ptr> failures(static_cast<size_t>(m));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < m; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<size_t>(r);
      // A rank that fails leaves the barrier, so that none waits for it.
      int arrived = 0;
      try {
        islands.enter(i);
        comm::GroupOptions options;
        options.rank = r;
        options.size = m;
        options.host = islands.address(i);
        options.timeout = std::chrono::seconds(120);
        options.connections = check.connections;
        options.prefix = "exchange-check";
        auto group = comm::Group::connect(store, options);
        out[i].round_trip_s = group.link().round_trip_s;
        torch::manual_seed(static_cast<uint64_t>(r) + 1);
        const auto input = torch::randn({check.values}) * 1e-3;
        for (int round = 0; round <= check.rounds; ++round) {
          auto t = input.clone();
          start.arrive_and_wait();
          ++arrived;
          const auto begin = std::chrono::steady_clock::now();
          const auto stats = check.gloo_ring ? group.all_reduce_sum(t)
                                             : group.all_reduce_sum(t, comm::ReduceOptions{check.encoding, check.algorithm});
          if (round > 0) seconds[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
          out[i].bytes_sent = stats.bytes_sent;
          out[i].route = stats.route;
        }
      } catch (...) {
        failures[i] = std::current_exception();
      }
      if (arrived <= check.rounds) start.arrive_and_drop();  // this and every later round go on without it
      islands.leave();
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
  // A round lasts as long as its slowest rank; the median over rounds.
  std::vector<double> rounds;
  for (int k = 0; k < check.rounds; ++k) {
    double slowest = 0;
    for (const auto& s : seconds) slowest = std::max(slowest, s[static_cast<size_t>(k)]);
    rounds.push_back(slowest);
  }
  std::sort(rounds.begin(), rounds.end());
  ExchangeMeasurement result = out[0];
  result.median_s = rounds[rounds.size() / 2];
  return result;
}

}  // namespace loco::runtime
