// The parts of the coordinator's HTTP server (http_server.h) that need no Asio: its handler
// threads, the process's file limit, and its answers' texts.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace loco::runtime::detail {

// The process's open-file limit, raised to its hard limit (at most 65536) so that many
// connections fit; returns the soft limit in effect.
inline size_t raise_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  const rlim_t wanted = std::min<rlim_t>(limit.rlim_max, 65536);
  if (limit.rlim_cur < wanted) {
    limit.rlim_cur = wanted;
    ::setrlimit(RLIMIT_NOFILE, &limit);
    ::getrlimit(RLIMIT_NOFILE, &limit);
  }
  return static_cast<size_t>(limit.rlim_cur);
}

// The reason phrase of an HTTP status the server answers with.
inline const char* reason_of(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "";
  }
}

// An error text as a JSON object, {"error": "..."}.
inline std::string json_error(const std::string& what) {
  std::string escaped;
  for (char c : what) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) escaped += c;
  }
  return "{\"error\": \"" + escaped + "\"}";
}

// A fixed set of handler threads taking requests in arrival order; knows how long the oldest
// waiting request has waited.
class HandlerPool {
 public:
  void start(size_t threads) {
    for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  // Answers what is queued (each handler is bounded), then stops.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  // False once stopping: the task is not taken (it is destroyed here, with what it holds).
  bool enqueue(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      if (quit_) return false;
      queue_.emplace_back(std::chrono::steady_clock::now(), std::move(task));
    }
    wake_.notify_one();
    return true;
  }
  std::chrono::steady_clock::duration oldest_wait() const {
    std::lock_guard lock(mutex_);
    return queue_.empty() ? std::chrono::steady_clock::duration::zero() : std::chrono::steady_clock::now() - queue_.front().first;
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return quit_ || !queue_.empty(); });
        if (queue_.empty()) return;  // quit, with every request taken in answered
        task = std::move(queue_.front().second);
        queue_.pop_front();
      }
      task();
    }
  }
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::function<void()>>> queue_;
  std::vector<std::thread> threads_;
  bool quit_ = false;
};

}  // namespace loco::runtime::detail
