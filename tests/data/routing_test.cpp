// DiPaCo's routing: balanced k-means leaves no path empty and none over ceil(N/k), finds clusters
// that are there, is deterministic for a seed and routes unseen documents to their cluster's path;
// product k-means pairs the halves' clusters into k² paths and fills the pairs no document chose.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "loco/core/error.h"
#include "loco/data/routing.h"
#include "test_util.h"

namespace loco::data {
namespace {

using testing_util::expect_error;

// `sizes[c]` points around centre c · 10 (in every coordinate of `width`), noise 0.1.
torch::Tensor blobs(const std::vector<int64_t>& sizes, int64_t width, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> parts;
  for (size_t c = 0; c < sizes.size(); ++c) {
    parts.push_back(torch::randn({sizes[c], width}) * 0.1 + static_cast<double>(c) * 10.0);
  }
  return torch::cat(parts);
}

std::vector<int64_t> counts(const std::vector<int64_t>& assignment, int64_t paths) {
  std::vector<int64_t> out(static_cast<size_t>(paths), 0);
  for (auto p : assignment) ++out.at(static_cast<size_t>(p));
  return out;
}

TEST(RoutingTest, BalancedKMeansFindsEqualClustersAndRoutesNewDocumentsToThem) {
  const auto points = blobs({25, 25, 25, 25}, 8, 1);
  const auto router = fit_balanced_kmeans(points, 4, 7);
  EXPECT_EQ(router.paths(), 4);
  EXPECT_EQ(counts(router.assignment, 4), (std::vector<int64_t>{25, 25, 25, 25}));
  // Each blob is one path, and routing the fitted points again gives their paths.
  for (int64_t c = 0; c < 4; ++c) {
    std::set<int64_t> paths(router.assignment.begin() + c * 25, router.assignment.begin() + (c + 1) * 25);
    EXPECT_EQ(paths.size(), 1u) << "blob " << c;
  }
  EXPECT_EQ(router.route(points), router.assignment);
  const auto unseen = blobs({1, 1, 1, 1}, 8, 99);
  const auto routed = router.route(unseen);
  for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(routed[static_cast<size_t>(c)], router.assignment[static_cast<size_t>(c * 25)]);
  // Deterministic for a seed.
  EXPECT_EQ(fit_balanced_kmeans(points, 4, 7).assignment, router.assignment);
}

TEST(RoutingTest, BalancedKMeansBoundsEveryPathOnSkewedData) {
  // One blob holds 70% of the documents: plain k-means would give it most of a corpus.
  const auto points = blobs({70, 20, 7, 3}, 6, 2);
  for (int64_t k : {2, 3, 4, 7}) {
    const auto sizes = counts(fit_balanced_kmeans(points, k, 3).assignment, k);
    for (auto s : sizes) {
      EXPECT_GE(s, 100 / k) << "k " << k;
      EXPECT_LE(s, (100 + k - 1) / k) << "k " << k;
    }
  }
}

TEST(RoutingTest, ProductKMeansPairsTheHalvesClusters) {
  // First half in one of 3 clusters, second half in one of 3, independently: 9 pairs, 10 each.
  torch::manual_seed(5);
  std::vector<torch::Tensor> rows;
  std::vector<std::pair<int64_t, int64_t>> truth;
  for (int64_t a = 0; a < 3; ++a) {
    for (int64_t b = 0; b < 3; ++b) {
      for (int r = 0; r < 10; ++r) {
        rows.push_back(torch::cat({torch::randn({4}) * 0.1 + a * 10.0, torch::randn({4}) * 0.1 + b * 10.0}));
        truth.emplace_back(a, b);
      }
    }
  }
  const auto points = torch::stack(rows);
  const auto router = fit_product_kmeans(points, 3, 11);
  EXPECT_EQ(router.paths(), 9);
  EXPECT_EQ(counts(router.assignment, 9), std::vector<int64_t>(9, 10));
  std::map<std::pair<int64_t, int64_t>, std::set<int64_t>> path_of_pair;
  for (size_t i = 0; i < truth.size(); ++i) path_of_pair[truth[i]].insert(router.assignment[i]);
  std::set<int64_t> distinct;
  for (const auto& [pair, paths] : path_of_pair) {
    EXPECT_EQ(paths.size(), 1u);
    distinct.insert(*paths.begin());
  }
  EXPECT_EQ(distinct.size(), 9u) << "each pair of clusters is its own path";
  EXPECT_EQ(router.route(points), router.assignment);
}

TEST(RoutingTest, ProductKMeansFillsPairsNoDocumentChose) {
  // Halves always agree (cluster 0 with 0, 1 with 1): pairs (0, 1) and (1, 0) are never chosen.
  torch::manual_seed(6);
  std::vector<torch::Tensor> rows;
  for (int64_t a = 0; a < 2; ++a) {
    for (int r = 0; r < 20; ++r) rows.push_back(torch::randn({4}) * 0.1 + a * 10.0);
  }
  const auto router = fit_product_kmeans(torch::stack(rows), 2, 1);
  for (auto s : counts(router.assignment, 4)) EXPECT_GE(s, 1);
}

TEST(RoutingTest, TooFewDocumentsOrFeaturesOfAnotherWidthAreRefused) {
  expect_error<DataError>([] { fit_balanced_kmeans(torch::randn({3, 4}), 4, 1); }, "3 documents for 4 paths");
  expect_error<DataError>([] { fit_product_kmeans(torch::randn({8, 4}), 3, 1); }, "8 documents for 9 paths");
  expect_error<DataError>([] { fit_balanced_kmeans(torch::randn({8}), 2, 1); }, "must be (N, D) float32");
  const auto router = fit_balanced_kmeans(torch::randn({8, 4}), 2, 1);
  expect_error<DataError>([&] { router.route(torch::randn({2, 5})); }, "fitted on width 4 (another model?)");
}

// The evaluation router follows the training assignment. On skewed data (one blob holds 70% of the
// documents and the balanced assignment splits it over three paths, the last with the far blobs'
// documents) the nearest centre gives that last path few of 1,000 unseen documents; the neighbour
// router spreads them about as the training documents were spread, and a validation set of one
// kind only (the farthest blob) goes where that kind trained, not evenly.
TEST(RoutingTest, TheEvaluationRouterFollowsTheTrainingAssignment) {
  const auto points = blobs({140, 40, 14, 6}, 6, 2);
  const int64_t paths = 4;
  const auto kmeans = fit_balanced_kmeans(points, paths, 3);
  const auto router = fit_neighbour_router(points, kmeans.assignment);
  const auto again = router.route(points);
  int64_t agreed = 0;
  for (size_t i = 0; i < again.size(); ++i) agreed += again[i] == kmeans.assignment[i];
  EXPECT_GE(agreed, 180) << "of 200 training documents routed as assigned";

  const auto unseen = blobs({700, 200, 70, 30}, 6, 50);
  const auto nearest = counts(kmeans.route(unseen), paths);
  EXPECT_LT(*std::min_element(nearest.begin(), nearest.end()), 50) << "the case this router is for";
  // Each path's share of the unseen documents is within half and 1.5 times its training share
  // (the training documents are 50 a path; the nearest centre gave one path none).
  const auto spread = counts(router.route(unseen), paths);
  for (int64_t p = 0; p < paths; ++p) {
    EXPECT_GE(spread[static_cast<size_t>(p)], 125) << "path " << p << " of 1000 unseen documents";
    EXPECT_LE(spread[static_cast<size_t>(p)], 375) << "path " << p;
  }
  const auto far_blob = torch::randn({50, 6}) * 0.1 + 30.0;
  const std::set<int64_t> trained_there(kmeans.assignment.begin() + 194, kmeans.assignment.end());
  for (auto p : router.route(far_blob)) EXPECT_TRUE(trained_there.count(p)) << "path " << p;
  expect_error<DataError>([&] { fit_neighbour_router(points, {0, 1}); }, "2 paths assigned to 200 documents");
  expect_error<DataError>([&] { router.route(torch::randn({2, 5})); }, "fitted on width 6 (another model?)");
}

// Discriminative re-routing (Douillard et al. 2024, section 2.2): held-out documents labelled by the
// path whose loss on them is lowest, a linear router fitted to those labels, sends every training
// document to the path that scores its kind best, even where that is not the k-means cluster's
// number. Four kinds of documents (blobs), four paths; path (b + 1) mod 4 models kind b best.
TEST(RoutingTest, TheLinearRouterSendsEachDocumentToThePathThatScoresItBest) {
  const int64_t paths = 4;
  const auto held_out = blobs({30, 30, 30, 30}, 6, 4);
  auto losses = torch::full({120, paths}, 5.0);
  torch::manual_seed(9);
  losses += torch::rand({120, paths}) * 0.1;
  for (int64_t i = 0; i < 120; ++i) losses[i][(i / 30 + 1) % paths] = 4.0;  // the best path of kind i / 30
  const auto labels = losses.argmin(1);
  const auto trained = blobs({50, 50, 50, 50}, 6, 8);
  const auto router = fit_linear_router(held_out, labels, paths, trained);
  const auto routes = router.route(trained);
  for (int64_t i = 0; i < 200; ++i) {
    EXPECT_EQ(routes[static_cast<size_t>(i)], (i / 50 + 1) % paths) << "training document " << i << " of kind " << i / 50;
  }
  EXPECT_EQ(counts(routes, paths), (std::vector<int64_t>{50, 50, 50, 50}));
  // With a kind that two paths model equally well but one path models no kind best, the biases
  // still spread the documents about evenly: re-routing never leaves a path without documents.
  for (int64_t i = 0; i < 120; ++i) losses[i][(i / 30 + 1) % paths] = i / 30 == 3 ? 5.2 : 4.0;
  const auto skewed = fit_linear_router(held_out, losses.argmin(1), paths, trained);
  for (auto n : counts(skewed.route(trained), paths)) EXPECT_GE(n, 40);
}

// The n nearest paths: the first is route()'s, they are distinct, ordered by distance, and for a
// product router the distance adds up over the halves.
TEST(Routing, RankedPathsStartWithTheRouteAndAreOrdered) {
  const auto points = torch::randn({60, 6}, torch::TensorOptions().dtype(torch::kFloat32));
  for (const bool product : {false, true}) {
    const auto router = product ? fit_product_kmeans(points, 3, 7) : fit_balanced_kmeans(points, 4, 7);
    const auto routes = router.route(points);
    const auto ranked = router.ranked(points, router.paths());
    for (size_t i = 0; i < routes.size(); ++i) {
      ASSERT_EQ(ranked[i].size(), static_cast<size_t>(router.paths()));
      EXPECT_EQ(ranked[i][0], routes[i]);
      std::vector<int64_t> sorted = ranked[i];
      std::sort(sorted.begin(), sorted.end());
      EXPECT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) << "a path ranked twice";
      // Distances by hand, in the ranked order, never decrease.
      double last = -1;
      for (auto p : ranked[i]) {
        double d = 0;
        int64_t offset = 0, rest = p;
        std::vector<int64_t> digits;
        for (size_t part = 0; part < router.centres.size(); ++part) {
          digits.insert(digits.begin(), rest % router.k);
          rest /= router.k;
        }
        for (size_t part = 0; part < router.centres.size(); ++part) {
          const auto& c = router.centres[part];
          d += (points[static_cast<int64_t>(i)].narrow(0, offset, c.size(1)) - c[digits[part]]).pow(2).sum().item<double>();
          offset += c.size(1);
        }
        EXPECT_GE(d, last - 1e-4);
        last = d;
      }
    }
    EXPECT_EQ(router.ranked(points, 2)[5].size(), 2u);
    EXPECT_THROW(router.ranked(points, router.paths() + 1), DataError);
  }
}

}  // namespace
}  // namespace loco::data
