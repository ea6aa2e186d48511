// The sealed data plane (comm/sealed_group.cpp) with ranks as threads on 127.0.0.1: every
// collective gives what the open group gives; a rank without the run's secret is refused when the
// group forms and the members form a group without it; a bit flipped, or a message replayed, on the
// way fails the receive as a dead peer's does.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

#include "comm/rank_threads.h"
#include "loco/comm/group.h"
#include "loco/core/error.h"

namespace loco::comm {
namespace {

using testing_util::run_ranks;
using namespace std::chrono_literals;

const std::string kSecret(32, 's');

GroupOptions sealed_options(int64_t rank, int64_t size, DataPlane plane, std::string prefix, std::string secret = kSecret,
                            Duration timeout = 10s) {
  GroupOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  o.prefix = std::move(prefix);
  o.data_plane = plane;
  o.secret = std::move(secret);
  return o;
}

// Rank r's values: distinct on every rank, so that a wrong sum shows.
torch::Tensor values_of(int64_t rank, int64_t n = 3000) {
  return torch::sin(torch::arange(n, torch::kFloat32) * 0.37 + static_cast<double>(rank)) * (rank + 1);
}

struct Results {
  torch::Tensor sum_fp32, sum_int, e3m0, broadcast;
  std::vector<torch::Tensor> gathered;
  std::string backend;
};

Results collectives(Group& group) {
  Results out;
  std::vector<torch::Tensor> two{values_of(group.rank()), values_of(group.rank() + 10, 17).view({17, 1})};
  group.all_reduce_sum(two);
  out.sum_fp32 = torch::cat({two[0], two[1].view({-1})});
  out.sum_int = torch::arange(7, torch::kInt64) * (group.rank() + 1);
  group.all_reduce_sum(out.sum_int);
  out.e3m0 = values_of(group.rank(), 5000);
  ReduceOptions e3m0;
  e3m0.encoding = Encoding::kE3M0;
  e3m0.piece_bytes = 4096;
  group.all_reduce_sum(out.e3m0, e3m0);
  out.broadcast = group.rank() == 1 ? values_of(7) : torch::zeros({3000});
  group.broadcast(out.broadcast, 1);
  group.all_gather(values_of(group.rank(), 11), out.gathered);
  out.backend = group.backend();
  return out;
}

// The fp32 sum of several tensors: the open group runs Gloo's ring (its own order of additions),
// the sealed one loco's direct all-reduce (rank order), so they agree to rounding; every other
// result is the same bits.
void expect_same(const Results& a, const Results& b) {
  EXPECT_TRUE(torch::allclose(a.sum_fp32, b.sum_fp32, 1e-6, 1e-6));
  EXPECT_TRUE(torch::equal(a.sum_int, b.sum_int));
  EXPECT_TRUE(torch::equal(a.e3m0, b.e3m0));
  EXPECT_TRUE(torch::equal(a.broadcast, b.broadcast));
  ASSERT_EQ(a.gathered.size(), b.gathered.size());
  for (size_t i = 0; i < a.gathered.size(); ++i) EXPECT_TRUE(torch::equal(a.gathered[i], b.gathered[i]));
}

TEST(SealedGroupTest, EveryCollectiveGivesWhatTheOpenGroupGives) {
  constexpr int64_t kSize = 3;
  auto store = std::make_shared<MemoryKeyValueStore>();
  auto open = run_ranks<Results>(kSize, [&](int64_t rank) {
    auto group = Group::connect(store, sealed_options(rank, kSize, DataPlane::kOpen, "open", ""));
    return collectives(group);
  });
  for (auto plane : {DataPlane::kAuthenticated, DataPlane::kEncrypted}) {
    auto sealed = run_ranks<Results>(kSize, [&](int64_t rank) {
      auto group = Group::connect(store, sealed_options(rank, kSize, plane, to_string(plane)));
      return collectives(group);
    });
    for (int64_t r = 0; r < kSize; ++r) {
      const auto i = static_cast<size_t>(r);
      ASSERT_FALSE(open[i].error) << open[i].message();
      ASSERT_FALSE(sealed[i].error) << to_string(plane) << " rank " << r << ": " << sealed[i].message();
      SCOPED_TRACE(fmt::format("{} rank {}", to_string(plane), r));
      expect_same(*sealed[i].value, *open[i].value);
      EXPECT_TRUE(torch::equal(sealed[i].value->sum_fp32, sealed[0].value->sum_fp32)) << "bit-identical on every rank";
    }
  }
  // The sums are the sums (not merely the open group's mistakes repeated).
  auto expected = values_of(0) + values_of(1) + values_of(2);
  EXPECT_TRUE(torch::allclose(open[0].value->sum_fp32.narrow(0, 0, 3000), expected, 1e-5, 1e-5));
  EXPECT_TRUE(torch::equal(open[0].value->sum_int, torch::arange(7, torch::kInt64) * 6));
  EXPECT_TRUE(torch::equal(open[2].value->broadcast, values_of(7)));
}

TEST(SealedGroupTest, AuthenticatedSendsThePayloadAsItIsAndEncryptedHidesIt) {
  // What rank 0 puts on the wire when it broadcasts 1,000 times 1.5f: the payload and a 16-byte tag.
  for (auto plane : {DataPlane::kAuthenticated, DataPlane::kEncrypted}) {
    auto store = std::make_shared<MemoryKeyValueStore>();
    std::mutex mutex;
    std::vector<torch::Tensor> wire;
    Tamper watch = [&](torch::Tensor& sealed, int64_t, int64_t) {
      std::lock_guard lock(mutex);
      wire.push_back(sealed.clone());
    };
    auto results = run_ranks<double>(2, [&](int64_t rank) {
      auto options = sealed_options(rank, 2, plane, "wire");
      auto group = Group(seal(connect_gloo(store, options), options, rank == 0 ? watch : Tamper{}));
      auto t = rank == 0 ? torch::full({1000}, 1.5f) : torch::zeros({1000});
      group.broadcast(t, 0);
      return t.sum().item<double>();
    });
    for (const auto& r : results) ASSERT_FALSE(r.error) << r.message();
    EXPECT_EQ(*results[1].value, 1500.0);
    ASSERT_EQ(wire.size(), 1u);
    ASSERT_EQ(wire[0].numel(), 4000 + 16);
    const auto payload = wire[0].narrow(0, 0, 4000);
    const auto plain = torch::full({1000}, 1.5f).view(torch::kUInt8);
    if (plane == DataPlane::kAuthenticated) {
      EXPECT_TRUE(torch::equal(payload, plain)) << "authenticated: the bytes travel as they are";
    } else {
      EXPECT_LT(payload.eq(plain).sum().item<int64_t>(), 100) << "encrypted: hardly a byte as it was";
    }
  }
}

TEST(SealedGroupTest, ALargeBroadcastTravelsInPiecesAndArrivesWhole) {
  // 3M floats (12 MB): two pieces of at most 8 MB, so that the root never holds a sealed copy of
  // the whole tensor for every rank at once.
  auto store = std::make_shared<MemoryKeyValueStore>();
  std::atomic<int> messages{0};
  std::atomic<int64_t> largest{0};
  Tamper count = [&](torch::Tensor& sealed, int64_t, int64_t) {
    ++messages;
    largest = std::max<int64_t>(largest.load(), sealed.numel());
  };
  const auto expected = torch::arange(3'000'000, torch::kFloat32);
  auto results = run_ranks<bool>(3, [&](int64_t rank) {
    auto options = sealed_options(rank, 3, DataPlane::kAuthenticated, "pieces");
    auto group = Group(seal(connect_gloo(store, options), options, rank == 0 ? count : Tamper{}));
    auto t = rank == 0 ? expected.clone() : torch::zeros({3'000'000});
    group.broadcast(t, 0);
    return torch::equal(t, expected);
  });
  for (const auto& r : results) {
    ASSERT_FALSE(r.error) << r.message();
    EXPECT_TRUE(*r.value);
  }
  EXPECT_EQ(messages.load(), 4) << "two pieces to each of two ranks";
  EXPECT_EQ(largest.load(), (int64_t{8} << 20) + 16);
}

TEST(SealedGroupTest, ARankWithoutTheRunsSecretIsRefusedAndTheMembersGoOnWithoutIt) {
  constexpr int64_t kSize = 3;
  auto store = std::make_shared<MemoryKeyValueStore>();
  // Rank 2 is a stranger: a secret of its own (or the right secret with another data plane).
  for (int variant = 0; variant < 2; ++variant) {
    const auto prefix = fmt::format("stranger{}", variant);
    auto formed = run_ranks<int64_t>(kSize, [&](int64_t rank) {
      // The members wait for the true rank 2 until the group's timeout: a stranger's failed proof
      // does not end their wait (it could be anyone's), so the timeout is short here.
      auto options = sealed_options(rank, kSize, DataPlane::kAuthenticated, prefix, kSecret, 3s);
      if (rank == 2 && variant == 0) options.secret = std::string(32, 'x');
      if (rank == 2 && variant == 1) options.data_plane = DataPlane::kEncrypted;
      return Group::connect(store, options).size();
    });
    for (int64_t r = 0; r < 2; ++r) {
      const auto& result = formed[static_cast<size_t>(r)];
      ASSERT_TRUE(result.error) << "rank " << r << " formed a group with a stranger";
      EXPECT_NO_THROW(try { std::rethrow_exception(result.error); } catch (const PeerError&) {});
      EXPECT_NE(result.message().find("rank(s) 2 did not prove"), std::string::npos) << result.message();
    }
    EXPECT_TRUE(formed[2].error);  // and the stranger learns nothing it could use
  }
  // The members form the next group without it, and sum.
  auto next = run_ranks<torch::Tensor>(2, [&](int64_t rank) {
    auto group = Group::connect(store, sealed_options(rank, 2, DataPlane::kAuthenticated, "members"));
    auto t = values_of(rank);
    group.all_reduce_sum(t);
    return t;
  });
  for (const auto& r : next) ASSERT_FALSE(r.error) << r.message();
  EXPECT_TRUE(torch::equal(*next[0].value, *next[1].value));
  EXPECT_TRUE(torch::allclose(*next[0].value, values_of(0) + values_of(1)));
}

// Runs two e3m0 all-reduces in a group of three whose rank 1 passes every sealed message it sends
// through `tamper`; returns each rank's outcome of the two.
std::vector<testing_util::RankResult<torch::Tensor>> reduce_with(DataPlane plane, const std::string& prefix, Tamper tamper) {
  auto store = std::make_shared<MemoryKeyValueStore>();
  return run_ranks<torch::Tensor>(3, [&](int64_t rank) {
    auto options = sealed_options(rank, 3, plane, prefix, kSecret, 3s);
    auto group = Group(seal(connect_tcp(store, options), options, rank == 1 ? tamper : Tamper{}));
    ReduceOptions e3m0;
    e3m0.encoding = Encoding::kE3M0;
    auto t = values_of(rank, 4096);
    group.all_reduce_sum(t, e3m0);
    auto u = values_of(rank + 3, 4096);
    group.all_reduce_sum(u, e3m0);
    return u;
  });
}

TEST(SealedGroupTest, ABitFlippedOnTheWayFailsTheReceiveAsADeadPeerDoes) {
  for (auto plane : {DataPlane::kAuthenticated, DataPlane::kEncrypted}) {
    std::atomic<int> flipped{0};
    // An on-path attacker flips one bit of the payload of rank 1's first message to rank 2 in the
    // second all-reduce (an outer gradient's piece); GCM's tag is left as it was.
    std::atomic<int> to_rank_2{0};
    auto results = reduce_with(plane, "flip", [&](torch::Tensor& sealed, int64_t peer, int64_t tag) {
      if (peer != 2 || tag != 0) return;
      if (to_rank_2++ != 1) return;
      sealed.data_ptr<uint8_t>()[5] ^= 0x10;
      ++flipped;
    });
    ASSERT_EQ(flipped.load(), 1) << "the attack never ran";
    ASSERT_TRUE(results[2].error) << to_string(plane) << ": rank 2 took an altered message";
    EXPECT_NO_THROW(try { std::rethrow_exception(results[2].error); } catch (const PeerError&) {});
    EXPECT_NE(results[2].message().find("from rank 1"), std::string::npos) << results[2].message();
    EXPECT_NE(results[2].message().find(fmt::format("failed its {} check", to_string(plane))), std::string::npos)
        << results[2].message();
  }
}

TEST(SealedGroupTest, AMessageReplayedFromAnEarlierOperationIsRefused) {
  // The attacker records rank 1's first message to rank 2 and sends it again in its place in the
  // second all-reduce: its bytes and tag are a valid seal, but for another place in the exchange.
  std::mutex mutex;
  std::optional<torch::Tensor> recorded;
  auto results = reduce_with(DataPlane::kAuthenticated, "replay", [&](torch::Tensor& sealed, int64_t peer, int64_t tag) {
    if (peer != 2 || tag != 0) return;
    std::lock_guard lock(mutex);
    if (!recorded) {
      recorded = sealed.clone();
    } else if (recorded->numel() == sealed.numel()) {
      sealed.copy_(*recorded);
    }
  });
  ASSERT_TRUE(recorded.has_value());
  ASSERT_TRUE(results[2].error) << "rank 2 took a replayed message";
  EXPECT_NE(results[2].message().find("failed its authenticated check"), std::string::npos) << results[2].message();
}

TEST(SealedGroupTest, WithoutAttackTheTamperedRunsPass) {
  // The harness itself: the same two all-reduces with a tamper that changes nothing complete on
  // every rank, with bit-identical results.
  auto results = reduce_with(DataPlane::kAuthenticated, "clean", [](torch::Tensor&, int64_t, int64_t) {});
  for (const auto& r : results) ASSERT_FALSE(r.error) << r.message();
  EXPECT_TRUE(torch::equal(*results[0].value, *results[2].value));
}

TEST(SealedGroupTest, ASealedDataPlaneNeedsTheSecret) {
  auto options = sealed_options(0, 2, DataPlane::kAuthenticated, "x", "short");
  EXPECT_THROW(options.validate(), ConfigError);
  EXPECT_EQ(parse_data_plane("encrypted"), DataPlane::kEncrypted);
  EXPECT_THROW(parse_data_plane("tls"), ConfigError);
}

}  // namespace
}  // namespace loco::comm
