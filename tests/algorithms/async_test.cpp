// Asynchronous DiLoCo's outer state (algorithms/async_outer.h) on a toy problem against a
// reference written from the paper, and its bounds: staleness, screening, the shared budget.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "algorithms_util.h"
#include "loco/algorithms/async_outer.h"
#include "loco/algorithms/flat_buffer.h"
#include "loco/algorithms/membership.h"
#include "loco/core/error.h"

namespace loco::algorithms {
namespace {

using Clock = AsyncOuterServer::Clock;
Clock::time_point at(double s) { return Clock::time_point{} + std::chrono::microseconds(static_cast<int64_t>(s * 1e6)); }

AsyncOptions toy_options(int64_t workers, int64_t h, int64_t total) {
  AsyncOptions o;
  o.workers = workers;
  o.inner_steps = h;
  o.total_steps = total;
  o.silence_s = 1e9;
  return o;
}

// A worker of the toy problem: f_w(θ) = ½‖θ − c_w‖², inner steps of SGD at rate 0.1, so that k
// steps from θ0 end at c_w + (θ0 − c_w)·0.9^k, at `speed` steps a second.
struct ToyWorker {
  std::vector<double> target;
  double speed;
  std::vector<double> inner(const std::vector<double>& from, int64_t k) const {
    std::vector<double> out(from.size());
    for (size_t i = 0; i < from.size(); ++i) out[i] = target[i] + (from[i] - target[i]) * std::pow(0.9, static_cast<double>(k));
    return out;
  }
};

torch::Tensor as_tensor(const std::vector<double>& v) {
  return torch::tensor(std::vector<float>(v.begin(), v.end()));
}
std::vector<double> as_vector(const torch::Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t[i].item<double>());
  return v;
}

// The paper's asynchronous Local-SGD with delayed Nesterov and dynamic local updates, written out
// in doubles for the toy workers, every worker's cycles in the order they end (ties by worker):
// H_w = ⌊H · v_w / max v⌋ (at least 1; H before any speed is known), at most the steps left.
struct Reference {
  std::vector<double> theta, m, pending;
  int64_t n, t = 0;
  double lr = 0.7, beta = 0.9;
  void apply(const std::vector<double>& g) {
    ++t;
    for (size_t i = 0; i < theta.size(); ++i) {
      pending[i] += g[i];
      if (t % n == 0) {
        m[i] = beta * m[i] + pending[i] / static_cast<double>(n);
        theta[i] -= lr * (g[i] / static_cast<double>(n) + beta * m[i]);
        pending[i] = 0;
      } else {
        theta[i] -= lr * g[i] / static_cast<double>(n);
      }
    }
  }
};

TEST(AsyncOuter, UnequalWorkersFollowThePapersUpdateOnAToyProblem) {
  const int64_t h = 10, total = 40;
  const std::vector<ToyWorker> workers = {{{1, 0, -1}, 2.0}, {{0, 2, 1}, 2.0}, {{-1, 1, 3}, 1.0}};
  const int64_t m = std::ssize(workers);
  AsyncOuterServer server(toy_options(m, h, total));
  const std::vector<double> theta0 = {0.5, -0.5, 0.0};
  Reference ref{theta0, std::vector<double>(3), std::vector<double>(3), m};

  struct Cycle {
    std::vector<double> base;
    int64_t version = 0, steps = 0;
    double start = 0;
    bool done = false;
  };
  std::vector<Cycle> cycles(static_cast<size_t>(m)), mirror(static_cast<size_t>(m));
  for (int64_t w = 0; w < m; ++w) {
    AsyncPush hello{w, -1, 0, 0, as_tensor(theta0)};
    const auto reply = server.exchange(hello, at(0));
    EXPECT_EQ(reply.steps_next, h / 5) << "a first cycle measures the worker's speed";
    cycles[w] = {as_vector(reply.theta), reply.version, reply.steps_next, 0};
    mirror[w] = {theta0, 0, h / 5, 0};
  }
  std::vector<double> speed_known(static_cast<size_t>(m), 0);
  int64_t steps_done = 0, max_staleness = 0, slow_shares = 0;
  for (;;) {
    int64_t next = -1;
    double end = 0;
    for (int64_t w = 0; w < m; ++w) {
      if (cycles[w].done) continue;
      const double e = cycles[w].start + static_cast<double>(cycles[w].steps) / workers[w].speed;
      if (next < 0 || e < end) next = w, end = e;
    }
    if (next < 0) break;
    auto& c = cycles[next];
    const auto local = workers[next].inner(c.base, c.steps);
    std::vector<double> delta(3);
    for (int i = 0; i < 3; ++i) delta[i] = c.base[i] - local[i];
    const double seconds = static_cast<double>(c.steps) / workers[next].speed;
    const auto reply = server.exchange({next, c.version, c.steps, seconds, as_tensor(delta)}, at(end));
    ASSERT_TRUE(reply.applied) << reply.rejected;
    // From the slow worker's second cycle (every speed known) to the run's last steps (from 21 s),
    // every cycle takes 5 s.
    if (c.start >= 2 && end <= 17) max_staleness = std::max(max_staleness, reply.staleness);
    // The reference: the same cycle from its own θ, its next share by the paper's rule (and the
    // run's last steps shared by speed among the workers not under way, this one and those done).
    auto& r = mirror[next];
    const auto ref_local = workers[next].inner(r.base, r.steps);
    std::vector<double> ref_delta(3);
    for (int i = 0; i < 3; ++i) ref_delta[i] = r.base[i] - ref_local[i];
    ref.apply(ref_delta);
    steps_done += r.steps;
    speed_known[next] = workers[next].speed;
    const double fastest = *std::max_element(speed_known.begin(), speed_known.end());
    const double v = workers[next].speed;
    int64_t share = std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(h) * v / fastest)));
    int64_t under_way = 0;
    double idle_speed = 0;
    for (int64_t w = 0; w < m; ++w) {
      if (w != next && !mirror[w].done) under_way += mirror[w].steps;
      if (w == next || mirror[w].done) idle_speed += speed_known[w];
    }
    const int64_t left = std::max<int64_t>(0, total * m - steps_done - under_way);
    share = std::min<int64_t>(share, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(left) * v / idle_speed))));
    share = std::min(share, left);
    EXPECT_EQ(reply.steps_next, share) << "worker " << next << " at " << end << " s";
    if (next == 2 && share > 0) slow_shares += share == h / 2;
    r = {ref.theta, 0, share, end, share == 0};
    ASSERT_EQ(reply.theta.defined(), share > 0 || reply.finished) << "θ only with steps to take, or at the end";
    if (reply.theta.defined()) {
      for (int i = 0; i < 3; ++i) EXPECT_NEAR(reply.theta[i].item<double>(), ref.theta[i], 1e-4);
    }
    c = {reply.theta.defined() ? as_vector(reply.theta) : c.base, reply.version, reply.steps_next, end, reply.steps_next == 0};
  }
  const auto last = server.exchange({0, server.totals().version, 0, 0, {}}, at(100));
  ASSERT_TRUE(last.finished);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(last.theta[i].item<double>(), ref.theta[i], 1e-4) << "the run's final θ";
  const auto totals = server.totals();
  EXPECT_EQ(totals.steps_done, total * m);
  EXPECT_TRUE(totals.finished);
  EXPECT_EQ(totals.applied, totals.version);
  EXPECT_GE(slow_shares, 3) << "the worker at half speed takes half the steps a cycle";
  EXPECT_GE(max_staleness, 1);
  EXPECT_LE(max_staleness, m - 1) << "once the cycles take the same time, only the others' arrivals come between";
}

AsyncReply hello(AsyncOuterServer& server, int64_t worker, const torch::Tensor& theta, double time = 0) {
  return server.exchange({worker, -1, 0, 0, theta}, at(time));
}

// With a grace, outer gradients that arrive together are applied together: the first waits for the
// other (whose cycle is under way), and both continue from the θ with both applied.
TEST(AsyncOuter, OuterGradientsArrivingTogetherContinueFromTheSameTheta) {
  auto options = toy_options(2, 4, 100);
  options.grace = 1.0;
  options.dynamic_steps = false;
  AsyncOuterServer server(options);
  server.exchange({0, -1, 0, 0, torch::zeros({2})}, Clock::now());
  server.exchange({1, -1, 0, 0, torch::zeros({2})}, Clock::now());
  const auto start = Clock::now();
  AsyncReply first;
  std::thread early([&] { first = server.exchange({0, 0, 4, 2.0, torch::full({2}, 0.1f)}, Clock::now()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto second = server.exchange({1, 0, 4, 2.2, torch::full({2}, 0.3f)}, Clock::now());
  early.join();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 1.5) << "the batch closed when both were in";
  EXPECT_TRUE(first.applied && second.applied);
  EXPECT_EQ(first.version, 2);
  EXPECT_EQ(second.version, 2);
  EXPECT_TRUE(torch::equal(first.theta, second.theta));
  EXPECT_EQ(first.staleness, 0);
  EXPECT_EQ(second.staleness, 1);
  // Alone (the other's cycle just began and ends long after the grace), it is applied at once.
  const auto alone = server.exchange({0, 2, 4, 0.01, torch::full({2}, 0.1f)}, Clock::now());
  EXPECT_EQ(alone.version, 3);
}

TEST(AsyncOuter, AnOuterGradientStalerThanTheBoundIsLeftOutAndCounted) {
  auto options = toy_options(2, 4, 100);
  options.max_staleness = 2;
  options.dynamic_steps = false;
  AsyncOuterServer server(options);
  const auto theta0 = torch::zeros({3});
  hello(server, 0, theta0);
  hello(server, 1, theta0);
  for (int i = 0; i < 3; ++i) server.exchange({0, i, 4, 1, torch::full({3}, 0.1f)}, at(1 + i));  // versions 1, 2, 3
  const auto before = server.exchange({0, 3, 0, 0, {}}, at(4)).theta;
  const auto late = server.exchange({1, 0, 4, 4, torch::full({3}, 0.1f)}, at(4));
  EXPECT_FALSE(late.applied);
  EXPECT_EQ(late.staleness, 3);
  EXPECT_NE(late.rejected.find("stale"), std::string::npos) << late.rejected;
  EXPECT_TRUE(torch::equal(late.theta, before));
  EXPECT_EQ(late.steps_next, 4) << "it goes on from the current θ";
  EXPECT_EQ(server.totals().rejected, 1);
  const auto on_time = server.exchange({1, 2, 4, 4, torch::full({3}, 0.1f)}, at(5));  // 1 behind: kept
  EXPECT_TRUE(on_time.applied);
  EXPECT_EQ(server.take_notes().size(), 1u);
}

TEST(AsyncOuter, APoisonedOuterGradientIsLeftOutAndCounted) {
  auto options = toy_options(3, 4, 100);
  options.screening.reject_ratio = 10;
  AsyncOuterServer server(options);
  hello(server, 0, torch::zeros({4}));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(server.exchange({i % 3, i, 4, 1, torch::full({4}, 0.1f)}, at(1)).applied);
  const auto version = server.totals().version;
  auto nan = torch::full({4}, 0.1f);
  nan[2] = std::nanf("");
  const auto a = server.exchange({1, version, 4, 1, nan}, at(2));
  EXPECT_FALSE(a.applied);
  EXPECT_NE(a.rejected.find("not finite"), std::string::npos);
  EXPECT_TRUE(torch::isfinite(a.theta).all().item<bool>());
  const auto b = server.exchange({2, version, 4, 1, torch::full({4}, 10.0f)}, at(2));  // x100
  EXPECT_FALSE(b.applied);
  EXPECT_NE(b.rejected.find("median"), std::string::npos) << b.rejected;
  EXPECT_EQ(server.totals().rejected, 2);
  EXPECT_EQ(server.totals().version, version);
}

TEST(AsyncOuter, TheBudgetIsSharedAndASilentWorkersShareGoesToTheOthers) {
  auto options = toy_options(2, 4, 6);  // 12 steps in all
  options.dynamic_steps = false;
  options.silence_s = 10;
  AsyncOuterServer server(options);
  EXPECT_EQ(hello(server, 0, torch::zeros({2})).steps_next, 4);
  EXPECT_EQ(hello(server, 1, torch::zeros({2})).steps_next, 4);
  auto r = server.exchange({0, 0, 4, 1, torch::full({2}, 0.1f)}, at(1));
  EXPECT_EQ(r.steps_next, 4);  // 12 - 4 done - 4 under way by worker 1
  r = server.exchange({0, r.version, 4, 1, torch::full({2}, 0.1f)}, at(2));
  EXPECT_EQ(r.steps_next, 0) << "the rest is worker 1's";
  EXPECT_FALSE(r.finished);
  // Worker 1 goes silent: after the silence its 4 steps go back to the pool, and to worker 0.
  r = server.exchange({0, r.version, 0, 0, {}}, at(5));
  EXPECT_EQ(r.steps_next, 0);
  r = server.exchange({0, r.version, 0, 0, {}}, at(20));
  EXPECT_EQ(r.steps_next, 4);
  r = server.exchange({0, r.version, 4, 1, torch::full({2}, 0.1f)}, at(21));
  EXPECT_TRUE(r.finished);
  EXPECT_EQ(r.steps_next, 0);
  const auto notes = server.take_notes();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("worker 1 silent"), std::string::npos) << notes[0];
}

// Elastic membership: a new member takes a slot (seat); the cycle its predecessor had under way goes
// back to the others, the old member's exchanges are refused, and the newcomer starts from the
// current θ with a first cycle that measures its speed, its cycles counted afresh.
TEST(AsyncOuter, ANewMemberTakesASlotAndTheOldOnesExchangesAreRefused) {
  AsyncOuterServer server(toy_options(2, 10, 100));
  server.seat(0, 10);
  server.seat(1, 11);
  ASSERT_EQ(server.exchange({0, -1, 0, 0, torch::zeros({2}), 0, 10}, at(0)).steps_next, 2);
  ASSERT_EQ(server.exchange({1, -1, 0, 0, torch::zeros({2}), 0, 11}, at(0)).steps_next, 2);
  ASSERT_TRUE(server.exchange({1, 0, 2, 1, torch::full({2}, 0.1f), 1, 11}, at(1)).applied);
  EXPECT_THROW(server.exchange({1, 1, 0, 0, {}, 0, 10}, at(1)), SlotTaken) << "member 10 holds slot 0, not 1";
  server.take_notes();
  server.seat(1, 12);  // member 11 is replaced with a cycle under way
  const auto notes = server.take_notes();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("goes back to the others"), std::string::npos) << notes[0];
  EXPECT_THROW(server.exchange({1, 1, 2, 1, torch::full({2}, 0.1f), 2, 11}, at(2)), SlotTaken);
  const auto joined = server.exchange({1, -1, 0, 0, torch::zeros({2}), 0, 12}, at(2));
  EXPECT_EQ(joined.version, 1);
  EXPECT_TRUE(torch::equal(joined.theta, server.exchange({0, 1, 0, 0, {}, 0, 10}, at(2)).theta)) << "the current θ";
  EXPECT_EQ(joined.steps_next, 2) << "a first cycle of H/5, to measure its speed";
  const auto first = server.exchange({1, 1, 2, 1, torch::full({2}, 0.1f), 1, 12}, at(3));
  EXPECT_TRUE(first.applied) << "its cycle 1 is not its predecessor's, retried";
  EXPECT_EQ(server.totals().version, 2);
  EXPECT_TRUE(server.release(1, /*vacate=*/true)) << "its process died with its next cycle under way";
  EXPECT_FALSE(server.release(1, /*vacate=*/true));
  EXPECT_THROW(server.exchange({1, 2, 2, 1, torch::full({2}, 0.1f), 2, 12}, at(4)), SlotTaken) << "vacant now: nobody's";
  EXPECT_THROW(server.exchange({1, 2, 0, 0, {}}, at(4)), SlotTaken) << "nor a fixed run's worker's (no member)";
  server.seat(0, AsyncOuterServer::kVacant);
  EXPECT_THROW(server.exchange({0, 2, 0, 0, {}, 0, 10}, at(4)), SlotTaken);
}

// A worker that goes silent between its cycles (its share done, owing a fragment's flush) is gone
// after the silence: the run finishes without the flush it will never send.
TEST(AsyncOuter, AWorkerSilentBetweenItsCyclesIsGone) {
  auto options = toy_options(2, 4, 2);  // 4 steps in all, in cycles of 2 (2 fragments)
  options.dynamic_steps = false;
  options.silence_s = 5;
  AsyncOuterServer server(options);
  AsyncPush hi{0, -1, 0, 0, torch::zeros({2})};
  hi.fragment_sizes = {1, 1};
  server.exchange(hi, at(0));
  hi.worker = 1;
  server.exchange(hi, at(0));
  AsyncPush last{1, 0, 2, 1, torch::full({1}, 0.1f), 1};
  last.fragment = 0;
  ASSERT_EQ(server.exchange(last, at(1)).steps_next, 0) << "worker 1's share is done: it owes fragment 1's flush";
  last.worker = 0;
  const auto other = server.exchange(last, at(1.5));
  ASSERT_FALSE(other.finished);
  AsyncPush flush{0, 0, 0, 0, torch::full({1}, 0.1f), 2};
  flush.fragment = 1;
  EXPECT_FALSE(server.exchange(flush, at(2)).finished) << "worker 1's flush is owed";
  EXPECT_FALSE(server.silent(1, at(5.9)));
  EXPECT_TRUE(server.silent(1, at(6.1)));
  EXPECT_TRUE(server.totals().finished);
  const auto notes = server.take_notes();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("worker 1 silent for 5 s between its cycles (it owed 1 flushes)"), std::string::npos) << notes[0];
}

// A member whose process exited while its Δ waited in a batch for the others: the Δ is applied,
// and its slot stays released (no share given, no flush owed), so the run finishes without it.
TEST(AsyncOuter, AMemberReleasedWhileItsDeltaWaitsInABatchStaysReleased) {
  auto options = toy_options(2, 4, 2);  // 4 steps in all, in cycles of 2 (2 fragments)
  options.dynamic_steps = false;
  options.grace = 1.0;
  AsyncOuterServer server(options);
  server.seat(0, 10);
  server.seat(1, 11);
  AsyncPush hi{0, -1, 0, 0, torch::zeros({2}), 0, 10};
  hi.fragment_sizes = {1, 1};
  server.exchange(hi, Clock::now());
  hi.worker = 1;
  hi.member = 11;
  server.exchange(hi, Clock::now());
  AsyncReply waited;
  std::thread waiting([&] {
    AsyncPush last{0, 0, 2, 2.0, torch::full({1}, 0.1f), 1, 10};
    last.fragment = 0;
    waited = server.exchange(last, Clock::now());  // its last steps: it waits for worker 1 in the batch
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  server.release(0, /*vacate=*/true);
  AsyncPush last{1, 0, 2, 2.0, torch::full({1}, 0.1f), 1, 11};
  last.fragment = 0;
  EXPECT_EQ(server.exchange(last, Clock::now()).steps_next, 0);
  waiting.join();
  EXPECT_TRUE(waited.applied);
  EXPECT_EQ(waited.steps_next, 0);
  AsyncPush flush{1, 0, 0, 0, torch::full({1}, 0.1f), 2, 11};
  flush.fragment = 1;
  EXPECT_TRUE(server.exchange(flush, Clock::now()).finished) << "member 10 owes nothing: its slot was released";
  EXPECT_EQ(server.totals().version, 3);
}

// Streaming DiLoCo's fragments are screened each against its own: a fragment whose outer gradients
// are larger than another's (more values) is not left out for it.
TEST(AsyncOuter, EachFragmentIsScreenedAgainstItsOwn) {
  auto options = toy_options(3, 4, 100);  // the last 3 kept norms of each fragment
  options.dynamic_steps = false;
  options.screening.reject_ratio = 5;
  AsyncOuterServer server(options);
  AsyncPush hi{0, -1, 0, 0, torch::zeros({101})};
  hi.fragment_sizes = {1, 100};
  server.exchange(hi, at(0));
  std::vector<int64_t> versions = {0, 0};
  for (int cycle = 1; cycle <= 6; ++cycle) {
    const int64_t p = cycle % 2;
    AsyncPush push{0, versions[static_cast<size_t>(p)], 2, 1, torch::full({p == 0 ? 1 : 100}, 0.1f), cycle};
    push.fragment = p;
    const auto reply = server.exchange(push, at(cycle));
    EXPECT_TRUE(reply.applied) << "cycle " << cycle << ": " << reply.rejected;
    versions[static_cast<size_t>(p)] = reply.version;
  }
}

// Once the run's steps are all done, an outer gradient that still comes (a worker given up on that
// came back) is left out: the θ every worker ended on stays the final one.
TEST(AsyncOuter, AnOuterGradientAfterTheRunsStepsIsLeftOut) {
  auto options = toy_options(2, 4, 2);  // 4 steps in all
  options.dynamic_steps = false;
  AsyncOuterServer server(options);
  hello(server, 0, torch::zeros({2}));
  const auto done = server.exchange({0, 0, 4, 1, torch::full({2}, 0.1f), 1}, at(1));
  ASSERT_TRUE(done.finished);
  const auto late = server.exchange({1, 0, 4, 1, torch::full({2}, 0.1f), 1}, at(2));
  EXPECT_FALSE(late.applied);
  EXPECT_NE(late.rejected.find("all done"), std::string::npos) << late.rejected;
  EXPECT_TRUE(torch::equal(late.theta, done.theta));
}

// As the coordinator ends, a batch waiting for others that will not come is applied at once.
TEST(AsyncOuter, ClosingAppliesTheWaitingBatch) {
  auto options = toy_options(2, 4, 100);
  options.grace = 10;
  options.dynamic_steps = false;
  AsyncOuterServer server(options);
  server.exchange({0, -1, 0, 0, torch::zeros({2})}, Clock::now());
  server.exchange({1, -1, 0, 0, torch::zeros({2})}, Clock::now());
  const auto start = Clock::now();
  AsyncReply reply;
  std::thread waiting([&] { reply = server.exchange({0, 0, 4, 2.0, torch::full({2}, 0.1f), 1}, Clock::now()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server.close();
  waiting.join();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5) << "not the 20 s grace";
  EXPECT_TRUE(reply.applied);
  EXPECT_EQ(server.totals().version, 1);
}

// A worker's client retries an exchange whose answer it lost: the cycle it names was counted once.
TEST(AsyncOuter, ARetriedExchangeIsNotAppliedTwice) {
  AsyncOuterServer server(toy_options(2, 4, 100));
  hello(server, 0, torch::zeros({2}));
  AsyncPush push{0, 0, 4, 1, torch::full({2}, 0.1f), 1};
  const auto first = server.exchange(push, at(1));
  const auto retried = server.exchange(push, at(1.1));
  EXPECT_TRUE(first.applied && retried.applied);
  EXPECT_EQ(retried.version, first.version);
  EXPECT_TRUE(torch::equal(retried.theta, first.theta));
  EXPECT_EQ(server.totals().steps_done, 4);
  push.cycle = 2;
  EXPECT_EQ(server.exchange(push, at(2)).version, first.version + 1);
}

TEST(AsyncOuter, MalformedExchangesAreRefusedAndChangeNothing) {
  AsyncOuterServer server(toy_options(2, 4, 10));
  EXPECT_THROW(server.exchange({0, 0, 4, 1, torch::zeros({3})}, at(0)), Error);  // no state yet
  EXPECT_THROW(server.exchange({0, -1, 0, 0, {}}, at(0)), Error);             // first contact without θ
  hello(server, 0, torch::zeros({3}));
  EXPECT_THROW(server.exchange({5, 0, 4, 1, torch::zeros({3})}, at(1)), Error);   // no such worker
  EXPECT_THROW(server.exchange({0, 0, 4, 1, torch::zeros({4})}, at(1)), Error);   // wrong size
  EXPECT_THROW(server.exchange({0, 3, 4, 1, torch::zeros({3})}, at(1)), Error);   // a version from the future
  EXPECT_THROW(server.exchange({0, 0, 4, -1, torch::zeros({3})}, at(1)), Error);  // negative time
  EXPECT_THROW(server.exchange({0, 0, 4, 1e7, torch::zeros({3})}, at(1)), Error);  // a time no cycle takes
  EXPECT_THROW(server.exchange({0, 0, 4, 5e-324, torch::zeros({3})}, at(1)), Error);  // an endless speed
  EXPECT_THROW(server.exchange({0, 0, 5, 1, torch::zeros({3})}, at(1)), Error);   // more steps than H
  EXPECT_THROW(server.exchange({0, 0, 4, 1, torch::zeros({3}), -1}, at(1)), Error);  // a negative cycle
  EXPECT_EQ(server.totals().version, 0);
  auto sized = toy_options(2, 4, 10);
  sized.values = 3;
  AsyncOuterServer fresh(sized);
  EXPECT_THROW(hello(fresh, 0, torch::zeros({4})), Error) << "a first θ not of the model's size";
  EXPECT_THROW(hello(fresh, 0, torch::full({3}, std::nanf(""))), Error) << "a first θ not finite";
  EXPECT_NO_THROW(hello(fresh, 0, torch::zeros({3})));
  EXPECT_EQ(server.totals().steps_done, 0);
}

// θ as asynchronous DiLoCo sends it with one fragment: the parameters in their groups' order.
torch::Tensor flat_parameters(model::Transformer& model) {
  std::vector<torch::Tensor> pieces;
  for (const auto& group : model->parameter_groups()) {
    for (const auto& p : group.parameters) pieces.push_back(p.detach().reshape({-1}));
  }
  return torch::cat(pieces);
}

// A worker's side over an in-process link: its model continues from the state's θ, and it ends
// on the run's final θ once its share is done.
class DirectLink final : public OuterServerLink {
 public:
  explicit DirectLink(AsyncOuterServer& server) : server_(server) {}
  AsyncReply exchange(const AsyncPush& push) override { return server_.exchange(push, Clock::now()); }

 private:
  AsyncOuterServer& server_;
};

TEST(AsyncOuter, AWorkerEndsOnTheRunsFinalTheta) {
  AsyncOuterServer server(toy_options(1, 3, 6));
  auto model = model::Transformer(tiny_model(), 1);
  AsyncDiLoCo strategy(std::make_shared<DirectLink>(server), 0);
  strategy.on_start(model, 0);
  auto adamw = make_adamw(model);
  int64_t step = 0, syncs = 0;
  while (!strategy.part_done().value()) {
    train_step(model, adamw, batch(step, 2));
    adamw.step(1e-2);
    StepContext context{step++, 16, &model};
    for (const auto& report : strategy.after_step(context)) {
      ++syncs;
      EXPECT_EQ(report.staleness, 0);
      EXPECT_EQ(report.params_hash, hash_tensors({flat_parameters(model)}));
    }
  }
  EXPECT_EQ(step, 6);
  EXPECT_EQ(syncs, 3) << "a first cycle of 1 step (H / 5, at least 1), then 3, then the 2 left";
  EXPECT_TRUE(server.totals().finished);
  EXPECT_EQ(server.totals().version, 3);
}

// A worker whose share is done waits for the others' last outer gradients, unless the run stops.
TEST(AsyncOuter, AWorkerWaitingForTheOthersStopsWithTheRun) {
  auto options = toy_options(2, 2, 2);  // 4 steps in all: worker 0 takes 2, worker 1 holds 2 and never returns
  options.dynamic_steps = false;
  AsyncOuterServer server(options);
  hello(server, 1, torch::zeros({7024}));
  std::atomic<bool> stop{true};
  auto model = model::Transformer(tiny_model(), 1);
  ASSERT_EQ(flat_parameters(model).numel(), 7024);
  AsyncDiLoCo strategy(std::make_shared<DirectLink>(server), 0, {}, &stop);
  strategy.on_start(model, 0);
  StepContext first{0, 16, &model}, second{1, 16, &model};
  EXPECT_TRUE(strategy.after_step(first).empty());
  EXPECT_THROW(strategy.after_step(second), RunStopping);
  EXPECT_EQ(server.totals().version, 1) << "its outer gradient was applied before it waited";
}

// What a resumed run continues from: θ, the momentum, the counters and the speeds.
TEST(AsyncOuter, TheStateRoundTrips) {
  AsyncOuterServer first(toy_options(2, 4, 100));
  hello(first, 0, torch::zeros({3}));
  first.exchange({0, 0, 4, 2, torch::full({3}, 0.2f), 1}, at(2));
  first.exchange({0, 1, 4, 2, torch::full({3}, 0.1f), 2}, at(4));
  AsyncOuterServer second(toy_options(2, 4, 100));
  second.load_state(first.state());
  EXPECT_EQ(second.totals().version, 2);
  EXPECT_EQ(second.totals().steps_done, 8);
  const auto a = first.exchange({0, 2, 4, 2, torch::full({3}, 0.3f), 3}, at(6));
  const auto b = second.exchange({0, 2, 4, 2, torch::full({3}, 0.3f), 3}, at(6));
  EXPECT_TRUE(torch::equal(a.theta, b.theta)) << "the same momentum";
  EXPECT_EQ(a.steps_next, b.steps_next) << "the same speeds";
  auto state = first.state();
  state.pop_back();
  EXPECT_THROW(AsyncOuterServer(toy_options(2, 4, 100)).load_state(state), DataError);
  EXPECT_THROW(AsyncOuterServer(toy_options(3, 4, 100)).load_state(first.state()), DataError) << "another number of workers";
}

// Streaming DiLoCo's fragments: each exchange carries one fragment's Δ and takes that fragment's θ
// back, with its own version and delayed Nesterov; the run finishes only once a worker whose share
// is done has flushed its other fragments.
TEST(AsyncOuter, FragmentsAreExchangedOneAtATimeAndFlushedAtTheEnd) {
  AsyncOuterServer server(toy_options(2, 4, 100));
  const auto theta0 = torch::arange(5, torch::kFloat32);
  AsyncPush first{0, -1, 0, 0, theta0};
  first.fragment_sizes = {2, 3};
  const auto hello = server.exchange(first, at(0));
  EXPECT_EQ(hello.versions, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(hello.steps_next, 1) << "H/5 a cycle, over 2 fragments, at least 1";
  AsyncPush other{1, -1, 0, 0, theta0};
  other.fragment_sizes = {3, 2};
  EXPECT_THROW(server.exchange(other, at(0)), Error) << "another cut into fragments";
  AsyncPush whole{0, 0, 1, 1, torch::full({5}, 0.1f), 1};
  EXPECT_THROW(server.exchange(whole, at(1)), Error) << "an outer gradient must name its fragment";
  AsyncPush wrong_size{0, 0, 1, 1, torch::full({3}, 0.1f), 1};
  wrong_size.fragment = 0;
  EXPECT_THROW(server.exchange(wrong_size, at(1)), Error);
  AsyncPush f1{0, 0, 1, 1, torch::full({3}, 0.1f), 1};
  f1.fragment = 1;
  const auto r1 = server.exchange(f1, at(1));
  EXPECT_TRUE(r1.applied);
  EXPECT_EQ(r1.version, 1) << "fragment 1's version";
  ASSERT_EQ(r1.theta.numel(), 3) << "only fragment 1 comes back";
  EXPECT_TRUE(torch::allclose(r1.theta, theta0.narrow(0, 2, 3) - 0.7 * 0.1 / 2)) << "θ - η g / N, the first of N = 2 arrivals";
  auto state = server.state();
  AsyncOuterServer resumed(toy_options(2, 4, 100));
  resumed.load_state(state);
  AsyncPush f0{0, 0, 1, 1, torch::full({2}, 0.2f), 2};
  f0.fragment = 0;
  const auto a = server.exchange(f0, at(2));
  const auto b = resumed.exchange(f0, at(2));
  EXPECT_EQ(a.version, 1);
  EXPECT_TRUE(torch::equal(a.theta, b.theta)) << "each fragment's state round-trips";

  // Worker 0 alone with a run of 4 steps: its share done, it owes fragment 0's Δ.
  AsyncOuterServer small(toy_options(1, 4, 4));
  AsyncPush hi{0, -1, 0, 0, theta0};
  hi.fragment_sizes = {2, 3};
  small.exchange(hi, at(0));
  AsyncPush last{0, 0, 4, 1, torch::full({3}, 0.1f), 1};
  last.fragment = 1;
  const auto done = small.exchange(last, at(1));
  EXPECT_EQ(done.steps_next, 0);
  EXPECT_FALSE(done.finished) << "fragment 0's last steps are not in yet";
  EXPECT_FALSE(small.totals().finished);
  AsyncOuterServer saved(toy_options(1, 4, 4));
  saved.load_state(small.state());
  EXPECT_EQ(saved.totals().steps_done, 0) << "saved owing the flush: a resumed run trains those steps again";
  AsyncPush flush{0, 0, 0, 0, torch::full({2}, 0.1f), 2};
  flush.fragment = 0;
  const auto end = small.exchange(flush, at(2));
  EXPECT_TRUE(end.applied);
  EXPECT_TRUE(end.finished);
  EXPECT_EQ(end.theta.numel(), 5) << "the final θ, whole";
  EXPECT_EQ(end.versions, (std::vector<int64_t>{1, 1}));
}

// A worker with two fragments over an in-process link: its exchanges alternate fragments, each
// carrying a fragment's values; its share done, it flushes the other and ends on the run's final θ.
TEST(AsyncOuter, AWorkerWithFragmentsEndsOnTheRunsFinalTheta) {
  AsyncOuterServer server(toy_options(1, 4, 8));
  auto model = model::Transformer(tiny_model(), 1);
  AsyncDiLoCo strategy(std::make_shared<DirectLink>(server), 0, {}, nullptr, {.fragments = 2});
  strategy.on_start(model, 0);
  auto adamw = make_adamw(model);
  int64_t step = 0;
  std::vector<int64_t> fragments, sent;
  SyncReport last;
  while (!strategy.part_done().value()) {
    train_step(model, adamw, batch(step, 2));
    adamw.step(1e-2);
    StepContext context{step++, 16, &model};
    for (const auto& report : strategy.after_step(context)) {
      fragments.push_back(report.fragment);
      sent.push_back(report.stats.bytes_sent);
      last = report;
      if (fragments.size() == 1) {
        EXPECT_FALSE(strategy.in_sync()) << "fragment 1 holds local steps";
        ASSERT_NE(strategy.evaluation_parameters(), nullptr) << "θ as the fragments' last exchanges brought it is scored";
      }
    }
  }
  EXPECT_EQ(step, 8);
  EXPECT_EQ(fragments, (std::vector<int64_t>{0, 1, 0, 1, 0})) << "1 step (H/5), then H/2 each, then the 1 left";
  EXPECT_LT(sent[0], flat_parameters(model).numel() * 4) << "one fragment's values";
  EXPECT_GT(sent.back(), sent[0]) << "the last exchange also flushed fragment 1";
  EXPECT_TRUE(server.totals().finished);
  EXPECT_EQ(server.totals().version, 6) << "3 of each fragment, the flush included";
  EXPECT_TRUE(strategy.in_sync());
  EXPECT_EQ(last.params_hash, hash_tensors({server.state()[0].second})) << "it ends on the run's final θ";
  const auto& global = *strategy.evaluation_parameters();
  size_t i = 0;
  for (const auto& item : model->named_parameters()) EXPECT_TRUE(torch::equal(global[i++], item.value())) << item.key();
}

}  // namespace
}  // namespace loco::algorithms
