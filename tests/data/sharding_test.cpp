#include <gtest/gtest.h>

#include <set>

#include "loco/core/error.h"
#include "loco/data/sharding.h"
#include "test_util.h"

namespace loco::data {
namespace {

// A split of `n` documents of varying lengths, labelled round-robin with `labels` labels.
Split make_split(int n, int labels) {
  Split split;
  for (int i = 0; i < n; ++i) {
    const uint32_t length = 10 + static_cast<uint32_t>((i * 37) % 50);
    split.documents.push_back({split.tokens.size(), length, static_cast<uint32_t>(i % labels)});
    for (uint32_t t = 0; t < length; ++t) split.tokens.push_back(i);  // token = document index
  }
  return split;
}

void expect_partition(const ShardAssignment& a, size_t documents) {
  std::set<uint32_t> seen;
  for (const auto& shard : a.documents) {
    EXPECT_FALSE(shard.empty());
    EXPECT_TRUE(std::is_sorted(shard.begin(), shard.end()));
    for (auto d : shard) EXPECT_TRUE(seen.insert(d).second) << "document " << d << " is in two shards";
  }
  EXPECT_EQ(seen.size(), documents) << "every document belongs to a shard";
}

TEST(Sharding, IidIsABalancedDeterministicPartition) {
  const auto split = make_split(200, 5);
  auto a = shard_iid(split, 4, 7);
  expect_partition(a, 200);
  auto counts = shard_token_counts(split, a);
  const uint64_t total = split.tokens.size();
  for (auto c : counts) EXPECT_NEAR(static_cast<double>(c), total / 4.0, 60.0) << "within about one document of T/M";
  EXPECT_EQ(shard_iid(split, 4, 7).documents, a.documents) << "the same seed gives the same shards";
  EXPECT_NE(shard_iid(split, 4, 8).documents, a.documents);
  // One worker gets the split itself, in order: a single process sees the same stream.
  auto one = shard_iid(split, 1, 7);
  EXPECT_EQ(shard_tokens(split, one.documents[0]), split.tokens);
}

TEST(Sharding, IidGivesEveryWorkerADocumentEvenWhenTight) {
  const auto split = make_split(5, 1);
  expect_partition(shard_iid(split, 5, 1), 5);
  testing_util::expect_error<DataError>([&] { shard_iid(split, 6, 1); }, "6 workers but only 5 training documents");
}

TEST(Sharding, LabelKeepsEachLabelOnOneWorker) {
  const auto split = make_split(120, 6);
  auto a = shard_by_label(split, {"a", "b", "c", "d", "e", "f"}, 3);
  expect_partition(a, 120);
  std::map<uint32_t, size_t> worker_of;
  for (size_t w = 0; w < a.documents.size(); ++w) {
    for (auto d : a.documents[w]) {
      auto [it, inserted] = worker_of.emplace(split.documents[d].label, w);
      EXPECT_EQ(it->second, w) << "label " << split.documents[d].label << " is split across workers";
    }
  }
  auto counts = shard_token_counts(split, a);
  EXPECT_LT(*std::max_element(counts.begin(), counts.end()), 2 * *std::min_element(counts.begin(), counts.end()));
  testing_util::expect_error<DataError>([&] { shard_by_label(make_split(20, 2), {"news", "fiction"}, 3); },
                                        "has 2 label(s) (news, fiction) for 3 workers; hint");
}

TEST(Sharding, KMeansFindsSeparatedClusters) {
  // Three tight blobs far apart, interleaved in the input order.
  std::vector<float> values;
  const float centres[3][2] = {{0, 0}, {100, 0}, {0, 100}};
  for (int i = 0; i < 30; ++i) {
    values.push_back(centres[i % 3][0] + static_cast<float>(i % 5) * 0.1f);
    values.push_back(centres[i % 3][1] - static_cast<float>(i % 7) * 0.1f);
  }
  auto points = torch::tensor(values).view({30, 2});
  auto cluster = kmeans(points, 3, 11);
  for (int i = 3; i < 30; ++i) EXPECT_EQ(cluster[static_cast<size_t>(i)], cluster[static_cast<size_t>(i % 3)]) << i;
  EXPECT_NE(cluster[0], cluster[1]);
  EXPECT_NE(cluster[1], cluster[2]);
  auto a = shard_by_kmeans(points, 3, 11);
  expect_partition(a, 30);
  EXPECT_EQ(a.documents[0].front(), 0u) << "clusters are numbered by their first document";
  EXPECT_EQ(kmeans(points, 3, 11), cluster) << "deterministic";
}

TEST(Sharding, ShardTokensConcatenatesDocuments) {
  const auto split = make_split(4, 1);
  auto tokens = shard_tokens(split, {1, 3});
  ASSERT_EQ(tokens.size(), split.documents[1].length + split.documents[3].length);
  EXPECT_EQ(tokens.front(), 1);
  EXPECT_EQ(tokens.back(), 3);
}

}  // namespace
}  // namespace loco::data
