// The Gloo backend: c10d's ProcessGroupGloo over TCP, meeting through loco's KeyValueStore.
// The only translation unit that sees c10d.

// ProcessGroupGloo.hpp declares its class only under USE_C10D_GLOO, which LibTorch does not export.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <mutex>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/ranges.h>

#include "loco/comm/group.h"
#include "loco/comm/staged.h"
#include "loco/core/error.h"

namespace loco::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr Duration kAbortPoll{100};  // how often a waiting operation asks GroupOptions::abort

std::string text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }
std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }

// c10d::Store over a KeyValueStore, every key under `prefix/`. Gloo's rendezvous uses it to
// exchange the ranks' listening addresses. Once `abandoned` is set (the group was given up while
// connecting), its waits stop within kAbortPoll and it touches the store no more.
class StoreAdapter final : public c10d::Store {
 public:
  StoreAdapter(std::shared_ptr<KeyValueStore> store, std::string prefix, Duration timeout,
               std::shared_ptr<const std::atomic<bool>> abandoned)
      : c10d::Store(timeout), store_(std::move(store)), prefix_(std::move(prefix)), abandoned_(std::move(abandoned)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    check_abandoned();
    store_->set(full(key), text(value));
  }
  std::vector<uint8_t> get(const std::string& key) override {
    auto value = wait_for(key, timeout_);
    if (!value) throw PeerError("comm", fmt::format("rendezvous: key '{}' did not appear within {} ms", full(key), timeout_.count()));
    return to_bytes(*value);
  }
  // c10d::Store::clone() is pure virtual in newer LibTorch (2.11 has it, 2.6 not) and absent in older
  // ones, hence no `override`: it overrides where there is one to override. A clone is another view
  // of the same keys.
  c10::intrusive_ptr<c10d::Store> clone() {  // NOLINT(modernize-use-override)
    return c10::make_intrusive<StoreAdapter>(store_, prefix_, timeout_, abandoned_);
  }
  int64_t add(const std::string& key, int64_t value) override { return store_->add(full(key), value); }
  bool deleteKey(const std::string& key) override { return store_->remove(full(key)); }
  bool check(const std::vector<std::string>& keys) override { return store_->check(full(keys)); }
  int64_t getNumKeys() override { return store_->size(); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (const auto& key : keys) {
      const auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
      if (!wait_for(key, std::max(left, Duration(0)))) {
        throw PeerError("comm", fmt::format("rendezvous: key '{}' did not appear within {} ms", full(key), timeout.count()));
      }
    }
  }

 private:
  void check_abandoned() const {
    if (abandoned_ && abandoned_->load()) throw PeerError("comm", "rendezvous abandoned");
  }
  std::optional<std::string> wait_for(const std::string& key, Duration timeout) {
    if (!abandoned_) return store_->get(full(key), timeout);
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      check_abandoned();
      const auto left = std::max(Duration(0), std::chrono::duration_cast<Duration>(deadline - Clock::now()));
      if (auto value = store_->get(full(key), std::min(left, kAbortPoll))) return value;
      if (Clock::now() >= deadline) return std::nullopt;
    }
  }

  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(full(k));
    return out;
  }
  std::shared_ptr<KeyValueStore> store_;
  std::string prefix_;
  std::shared_ptr<const std::atomic<bool>> abandoned_;
};

// Bytes each rank sends in Gloo's ring all-reduce (reduce-scatter then all-gather, gloo/allreduce.cc):
// 2 (M - 1) / M of the buffer, and as much received. Checked against the kernel's TCP counters by
// tests/comm/group_test.cpp.
int64_t ring_all_reduce_bytes(int64_t bytes, int64_t size) { return 2 * (size - 1) * bytes / size; }

// Gloo's broadcast is a binomial tree rooted at `root` (gloo/broadcast.cc): every other rank
// receives the buffer once; a rank sends it once per child. Returns (sends, receives) of `rank`.
std::pair<int64_t, int64_t> binomial_tree_messages(int64_t rank, int64_t size, int64_t root) {
  const int64_t vrank = (rank - root + size) % size;
  int64_t dim = 0;
  while ((int64_t{1} << dim) < size) ++dim;
  int64_t mask = (int64_t{1} << dim) - 1, sends = 0, receives = 0;
  for (int64_t i = 0; i < dim; ++i) {
    mask ^= int64_t{1} << i;
    if ((vrank & mask) != 0) continue;
    const int64_t vpeer = vrank ^ (int64_t{1} << i);
    if (vpeer >= size) continue;
    if ((vrank & (int64_t{1} << i)) == 0) ++sends; else ++receives;
  }
  return {sends, receives};
}

int64_t bytes_of(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

}  // namespace

void turn_off_flight_recorder() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("TORCH_FR_BUFFER_SIZE") == nullptr && std::getenv("TORCH_NCCL_TRACE_BUFFER_SIZE") == nullptr) {
      ::setenv("TORCH_FR_BUFFER_SIZE", "0", 0);
    }
  });
}

namespace {

class GlooGroup final : public GroupImpl {
 public:
  GlooGroup(std::shared_ptr<KeyValueStore> store, const GroupOptions& options) : options_(options) {
    turn_off_flight_recorder();  // before the first ProcessGroupGloo creates the recorder
    // Our own arrival barrier first, so that a missing rank is named in the error rather than
    // surfacing as one of Gloo's internal key names.
    const std::string prefix = options.prefix;
    store->set(fmt::format("{}/arrived/{}", prefix, options.rank), "1");
    const auto deadline = Clock::now() + options.timeout;
    std::vector<int64_t> missing;
    for (int64_t r = 0; r < options.size; ++r) {
      const auto key = fmt::format("{}/arrived/{}", prefix, r);
      for (;;) {
        const auto left = std::max(Duration(0), std::chrono::duration_cast<Duration>(deadline - Clock::now()));
        const auto slice = options.abort ? std::min(left, kAbortPoll) : left;
        if (store->get(key, slice)) break;
        if (options.abort && options.abort()) {
          throw PeerError("comm", fmt::format("group '{}': abandoned while rank {} had not arrived (a member failed)", prefix, r));
        }
        if (Clock::now() >= deadline) {
          missing.push_back(r);
          break;
        }
      }
    }
    if (!missing.empty()) {
      throw PeerError("comm", fmt::format("group '{}': rank(s) {} did not arrive within {} s (this is rank {} of {})",
                                          prefix, fmt::join(missing, ", "), options.timeout.count() / 1000.0,
                                          options.rank, options.size));
    }
    // Gloo's own rendezvous (addresses through the store, then a TCP handshake with every peer)
    // blocks up to the timeout when a peer froze after arriving. With an abort hook it runs on a
    // thread of its own, which is left to finish by itself when the hook says so.
    auto abandoned = options.abort ? std::make_shared<std::atomic<bool>>(false) : nullptr;
    auto connect = [store = std::move(store), prefix, rank = options.rank, size = options.size, host = options.host,
                    timeout = options.timeout, connections = options.connections, abandoned] {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
      for (int64_t c = 0; c < connections; ++c) {
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
      }
      auto adapter = c10::make_intrusive<StoreAdapter>(store, prefix + "/gloo", timeout, abandoned);
      return c10::make_intrusive<c10d::ProcessGroupGloo>(adapter, static_cast<int>(rank), static_cast<int>(size), gloo_options);
    };
    try {
      if (!options.abort) {
        group_ = connect();
      } else {
        auto task = std::make_shared<std::packaged_task<c10::intrusive_ptr<c10d::ProcessGroupGloo>()>>(std::move(connect));
        auto connected = task->get_future();
        std::thread([task] { (*task)(); }).detach();
        while (connected.wait_for(kAbortPoll) != std::future_status::ready) {
          if (options.abort()) {
            *abandoned = true;  // the thread stops using the store at its next poll
            throw PeerError("comm", fmt::format("group '{}': abandoned while connecting to its peers (a member failed)", prefix));
          }
        }
        group_ = connected.get();
      }
    } catch (const PeerError&) {
      throw;
    } catch (const std::exception& e) {
      throw PeerError("comm", fmt::format("group '{}': connecting rank {} of {} on {} failed: {}", prefix, options.rank,
                                          options.size, options.host, first_line(e.what())));
    }
  }

  int64_t rank() const override { return options_.rank; }
  int64_t size() const override { return options_.size; }
  std::string backend() const override { return "gloo"; }

  CommStats all_reduce_sum(std::vector<torch::Tensor>& tensors) override {
    if (tensors.empty()) return {0, 0, 0, size()};
    // Gloo reduces one buffer per call: several tensors travel as one flat buffer (one collective).
    auto flat = flatten(tensors);
    std::vector<at::Tensor> buffer{flat};
    run("all_reduce", bytes_of(flat), [&] { return group_->allreduce(buffer); });
    unflatten(flat, tensors);
    const int64_t moved = ring_all_reduce_bytes(bytes_of(flat), size());
    return {moved, moved, 0, size(), "gloo-ring"};
  }

  CommStats broadcast(torch::Tensor& tensor, int64_t root) override {
    std::vector<at::Tensor> buffer{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = static_cast<int>(root);
    run("broadcast", bytes_of(tensor), [&] { return group_->broadcast(buffer, opts); });
    auto [sends, receives] = binomial_tree_messages(rank(), size(), root);
    return {sends * bytes_of(tensor), receives * bytes_of(tensor), 0, size()};
  }

  CommStats all_gather(const torch::Tensor& tensor, std::vector<torch::Tensor>& out) override {
    out.clear();
    for (int64_t r = 0; r < size(); ++r) out.push_back(torch::empty_like(tensor));
    std::vector<std::vector<at::Tensor>> outputs{std::vector<at::Tensor>(out.begin(), out.end())};
    std::vector<at::Tensor> input{tensor};
    run("all_gather", bytes_of(tensor), [&] { return group_->allgather(outputs, input); });
    const int64_t moved = (size() - 1) * bytes_of(tensor);  // ring all-gather (gloo/allgather.cc)
    return {moved, moved, 0, size()};
  }

  CommStats send(const torch::Tensor& tensor, int64_t peer, int64_t tag) override {
    std::vector<at::Tensor> buffer{tensor};
    run(fmt::format("send to rank {}", peer), bytes_of(tensor),
        [&] { return group_->send(buffer, static_cast<int>(peer), static_cast<int>(tag)); });
    return {bytes_of(tensor), 0, 0, 2};
  }

  CommStats send_recv(const torch::Tensor& out, int64_t to, torch::Tensor& in, int64_t from, int64_t tag) override {
    std::vector<at::Tensor> out_buffer{out}, in_buffer{in};
    const auto begin = Clock::now();
    try {
      // Both are posted before either is waited for: Gloo holds a send until its peer posts the
      // matching recv, so every rank of a ring must have its recv posted too.
      auto sending = group_->send(out_buffer, static_cast<int>(to), static_cast<int>(tag));
      auto receiving = group_->recv(in_buffer, static_cast<int>(from), static_cast<int>(tag));
      const auto deadline = begin + options_.timeout;
      wait_for(sending, deadline);
      wait_for(receiving, deadline);
    } catch (const std::exception& e) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
      throw PeerError("comm", fmt::format("ring hop (send {} bytes to rank {}, receive {} from rank {}) in group '{}' "
                                          "(rank {} of {}) failed after {:.1f} s: {}", bytes_of(out), to, bytes_of(in),
                                          from, options_.prefix, rank(), size(), elapsed, first_line(e.what())));
    }
    return {bytes_of(out), bytes_of(in), 0, size()};
  }

  std::unique_ptr<Posted> post_send(const torch::Tensor& tensor, int64_t peer, int64_t tag) override {
    return post(tensor, peer, tag, true);
  }
  std::unique_ptr<Posted> post_recv(torch::Tensor& tensor, int64_t peer, int64_t tag) override {
    return post(tensor, peer, tag, false);
  }

  CommStats recv(torch::Tensor& tensor, int64_t peer, int64_t tag) override {
    std::vector<at::Tensor> buffer{tensor};
    run(fmt::format("recv from rank {}", peer), bytes_of(tensor),
        [&] { return group_->recv(buffer, static_cast<int>(peer), static_cast<int>(tag)); });
    return {0, bytes_of(tensor), 0, 2};
  }

 private:
  static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

  // Waits for `work` until `deadline`, asking options_.abort every kAbortPoll when set. Throws
  // (std::runtime_error or c10's error) on a timeout, an abort, or the operation's own failure.
  template <class Work>
  void wait_for(const Work& work, Clock::time_point deadline) {
    if (options_.abort && is_point_to_point(*work)) return wait_watched(*work, deadline);
    for (;;) {
      const auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
      if (left <= Duration(0)) throw std::runtime_error("timed out");
      const auto slice = options_.abort ? std::min(left, kAbortPoll) : left;
      try {
        if (work->wait(slice)) return;
        throw std::runtime_error("timed out");
      } catch (const std::exception&) {
        if (work->isCompleted()) throw;  // the operation's own failure
      }
      if (options_.abort && options_.abort()) throw std::runtime_error("abandoned: a member of this group failed");
    }
  }

  static bool is_point_to_point(c10d::Work& work) {
    return dynamic_cast<c10d::ProcessGroupGloo::SendWork*>(&work) != nullptr ||
           dynamic_cast<c10d::ProcessGroupGloo::RecvWork*>(&work) != nullptr;
  }

  // A send's or a receive's wait cannot be cut into slices as a collective's can: one that times
  // out completes the operation with its error (c10d's SendWork and RecvWork), so a message that
  // took longer than a slice failed the whole exchange (every elastic round over a link with a
  // round trip near kAbortPoll failed, again and again). It waits whole, while a watcher asks the
  // abort hook every kAbortPoll and, when it says so, aborts the wait (Gloo's abortWaitRecv /
  // abortWaitSend: the wait returns at once, unfinished).
  void wait_watched(c10d::Work& work, Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
    if (left <= Duration(0)) throw std::runtime_error("timed out");
    std::mutex mutex;
    std::condition_variable finished;
    bool done = false;
    std::atomic<bool> aborted{false};
    std::thread watcher([&] {
      std::unique_lock lock(mutex);
      while (!finished.wait_for(lock, kAbortPoll, [&] { return done; })) {
        bool abort = false;
        try {
          abort = options_.abort();
        } catch (const std::exception&) {  // a hook that fails cannot say: the wait goes on to its timeout
        }
        if (abort) {
          aborted = true;
          try {
            work.abort();
          } catch (const std::exception&) {  // nothing to abort: the wait ends by itself
          }
          return;
        }
      }
    });
    bool completed = false;
    std::exception_ptr error;
    try {
      completed = work.wait(left);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mutex);
      done = true;
    }
    finished.notify_one();
    watcher.join();
    if (aborted) throw std::runtime_error("abandoned: a member of this group failed");
    if (error) std::rethrow_exception(error);
    if (!completed) throw std::runtime_error("timed out");
  }

  // Starts an operation and waits for it, bounded by the group's timeout. Any failure is a peer's.
  template <class Start>
  void run(const std::string& what, int64_t bytes, Start&& start) {
    const auto begin = Clock::now();
    try {
      auto work = start();
      wait_for(work, begin + options_.timeout);
    } catch (const std::exception& e) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
      throw PeerError("comm", fmt::format("{} of {} bytes in group '{}' (rank {} of {}) failed after {:.1f} s: {}", what,
                                          bytes, options_.prefix, rank(), size(), elapsed, first_line(e.what())));
    }
  }

  // A posted send or receive: the Work holds the tensor until it completes.
  class GlooPosted final : public Posted {
   public:
    GlooPosted(GlooGroup& group, c10::intrusive_ptr<c10d::Work> work, int64_t bytes, int64_t peer, bool sending)
        : group_(group), work_(std::move(work)), bytes_(bytes), peer_(peer), sending_(sending) {}
    CommStats wait() override {
      // Bounded from when the wait begins: an operation posts all its receives at once and waits
      // for them in turn, so a long exchange needs progress within the timeout, not its whole
      // length (a big tensor over a slow link takes longer than any one timeout).
      const auto waiting = Clock::now();
      try {
        group_.wait_for(work_, waiting + group_.options_.timeout);
      } catch (const std::exception& e) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - begin_).count();
        throw PeerError("comm", fmt::format("{} {} bytes {} rank {} in group '{}' (rank {} of {}) failed after {:.1f} s: {}",
                                            sending_ ? "sending" : "receiving", bytes_, sending_ ? "to" : "from", peer_,
                                            group_.options_.prefix, group_.rank(), group_.size(), elapsed,
                                            first_line(e.what())));
      }
      return sending_ ? CommStats{bytes_, 0, 0, 2} : CommStats{0, bytes_, 0, 2};
    }

   private:
    GlooGroup& group_;
    c10::intrusive_ptr<c10d::Work> work_;
    int64_t bytes_, peer_;
    bool sending_;
    Clock::time_point begin_ = Clock::now();
  };

  std::unique_ptr<Posted> post(const torch::Tensor& tensor, int64_t peer, int64_t tag, bool sending) {
    std::vector<at::Tensor> buffer{tensor};
    try {
      auto work = sending ? group_->send(buffer, static_cast<int>(peer), static_cast<int>(tag))
                          : group_->recv(buffer, static_cast<int>(peer), static_cast<int>(tag));
      return std::make_unique<GlooPosted>(*this, std::move(work), bytes_of(tensor), peer, sending);
    } catch (const std::exception& e) {
      throw PeerError("comm", fmt::format("posting a {} of {} bytes {} rank {} in group '{}' failed: {}",
                                          sending ? "send" : "receive", bytes_of(tensor), sending ? "to" : "from", peer,
                                          options_.prefix, first_line(e.what())));
    }
  }

  GroupOptions options_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
};

}  // namespace

std::shared_ptr<GroupImpl> connect_gloo(std::shared_ptr<KeyValueStore> store, const GroupOptions& options) {
  return std::make_shared<GlooGroup>(std::move(store), options);
}

}  // namespace loco::comm
