// Background: one thread that runs communication while the caller keeps computing (the overlap of
// Streaming DiLoCo). Tasks run one at a time in submission order, so a Group used only from
// tasks keeps the "one thread, same order on every rank" rule of group.h.
//
// submit() returns a std::future: get() blocks until the task is done and rethrows what it threw
// (PeerError from a collective, for instance). The destructor lets the queued tasks finish, then
// joins; tasks must therefore be bounded in time, as every Group operation is by its timeout.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

namespace loco::comm {

class Background {
 public:
  Background();
  ~Background();
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  template <class F>
  auto submit(F task) -> std::future<decltype(task())> {
    using R = decltype(task());
    auto packaged = std::make_shared<std::packaged_task<R()>>(std::move(task));
    auto future = packaged->get_future();
    enqueue([packaged] { (*packaged)(); });
    return future;
  }

 private:
  void enqueue(std::function<void()> job);
  void loop();

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace loco::comm
