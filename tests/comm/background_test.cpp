// Background: tasks run in submission order on one other thread, their results and exceptions
// come back through futures, and destruction waits for what was queued.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "loco/comm/background.h"
#include "loco/core/error.h"

namespace loco::comm {
namespace {

TEST(BackgroundTest, RunsInOrderOffTheCallersThread) {
  std::vector<int> order;
  std::vector<std::future<std::thread::id>> futures;
  {
    Background background;
    for (int i = 0; i < 20; ++i) {
      futures.push_back(background.submit([&order, i] {
        std::this_thread::sleep_for(std::chrono::microseconds(100 * (i % 3)));
        order.push_back(i);
        return std::this_thread::get_id();
      }));
    }
    const auto worker = futures.front().get();
    EXPECT_NE(worker, std::this_thread::get_id());
    for (auto& f : futures) {
      if (f.valid()) EXPECT_EQ(f.get(), worker);
    }
  }
  std::vector<int> expected(20);
  for (int i = 0; i < 20; ++i) expected[static_cast<size_t>(i)] = i;
  EXPECT_EQ(order, expected);
}

TEST(BackgroundTest, ExceptionsReachTheFutureAndLaterTasksStillRun) {
  Background background;
  auto failing = background.submit([]() -> int { throw PeerError("test", "a peer died"); });
  auto next = background.submit([] { return 7; });
  EXPECT_THROW(failing.get(), PeerError);
  EXPECT_EQ(next.get(), 7);
}

TEST(BackgroundTest, DestructionWaitsForQueuedTasks) {
  std::atomic<int> done{0};
  {
    Background background;
    for (int i = 0; i < 5; ++i) {
      background.submit([&done] {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        ++done;
      });
    }
  }
  EXPECT_EQ(done.load(), 5);
}

}  // namespace
}  // namespace loco::comm
