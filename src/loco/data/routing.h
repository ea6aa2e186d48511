// DiPaCo's routing of documents to paths (Douillard et al. 2024, arXiv 2403.10616, section 2.2;
// docs/dipaco.md), decided before training from a feature per document (the runtime's:
// the mean of the initial model's last hidden states over the document's first tokens).
//
//   k-means          k centres; every path gets between floor(N/k) and ceil(N/k) documents
//                    (balanced: no path is empty, none swallows the corpus)
//   product k-means  the feature's two halves clustered separately, k centres each: k² paths, path
//                    = a · k + b for the halves' clusters a and b; a path no document fell into
//                    takes the document nearest to it from a path that has more than one
//   linear           the discriminative router (the paper's re-routing): softmax regression from
//                    a document's feature to the path that scored it best, its biases tuned so
//                    that the documents spread over the paths evenly
//
// Both are deterministic for a seed. A fitted router keeps its centres, so documents it never saw
// can be routed to the path of their nearest centre (or pair of centres); evaluation and inference
// route them with a NeighbourRouter instead, which follows the training documents' assignment.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <vector>

namespace loco::data {

struct KMeansRouter {
  int64_t k = 0;
  // One (k, D_part) float32 tensor per part of the feature: one part for k-means, the two halves
  // (the first floor(D / 2) values, then the rest) for product k-means.
  std::vector<torch::Tensor> centres;
  // The fitted documents' paths, in [0, paths()), in the order of the points given to fit.
  std::vector<int64_t> assignment;

  int64_t paths() const;
  // The path of each row of `features` (M, D) float32: the nearest centre of each part, the parts
  // read as digits of base k, the first most significant. Throws DataError on a width mismatch
  // (features of another model).
  std::vector<int64_t> route(const torch::Tensor& features) const;
  // Each row's `n` nearest paths, nearest first (the first is route()'s): a path's distance is the
  // sum over the parts of the squared distance to its centre. 1 <= n <= paths() (DataError else).
  std::vector<std::vector<int64_t>> ranked(const torch::Tensor& features, int64_t n) const;
};

// The router that evaluation and inference use after k-means routing: a document goes to the path
// its nearest training document was assigned to. Routing unseen documents to the nearest centre
// instead can starve a path: on skewed data the balanced assignment moves documents out of a
// crowded region to a farther centre, so a path's documents need not lie nearest its centre (on
// Brown a path got none of 50 validation documents, another 42), and a path's region need not be
// convex either, which a linear router cannot follow. The nearest document keeps each path's
// share: in a region split between paths, each training document's cell holds about as much of
// the unseen documents as any other's.
struct NeighbourRouter {
  torch::Tensor features;  // (N, D) float32: the training documents'
  torch::Tensor paths;     // (N) int64: the path each was assigned
  // The path of each row of `query` (M, D). DataError on a width mismatch (another model).
  std::vector<int64_t> route(const torch::Tensor& query) const;
};

// From the training documents' features (N, D) and assigned paths. DataError when the counts
// differ, a path is negative, or there are no documents.
NeighbourRouter fit_neighbour_router(const torch::Tensor& features, const std::vector<int64_t>& assignment);

// Each row of `cost` (N, k) to a column, every column taking floor(N/k) or ceil(N/k) rows, the
// cheapest (row, column) pairs first; ties by index. Deterministic.
std::vector<int64_t> balanced_assignment(const torch::Tensor& cost);

// points (N, D) float32, N >= k >= 1 (DataError otherwise, naming both).
KMeansRouter fit_balanced_kmeans(const torch::Tensor& points, int64_t k, uint64_t seed, int64_t iterations = 50);
// points (N, D) float32 with D >= 2, N >= k² (DataError otherwise).
KMeansRouter fit_product_kmeans(const torch::Tensor& points, int64_t k, uint64_t seed, int64_t iterations = 50);

// DiPaCo's discriminative router: softmax regression on standardized document features.
struct LinearRouter {
  torch::Tensor weight, bias, mean, scale;  // (D, P), (P), (D), (D) float32
  // Each row's score of every path (N, P), for `features` (N, D).
  torch::Tensor scores(const torch::Tensor& features) const;
  // The best-scoring path of each row.
  std::vector<int64_t> route(const torch::Tensor& features) const;
};

// Fits the router on `features` (N, D) labelled with their best paths (`labels`, N int64 in
// [0, paths)), then tunes its biases so that `balance` (the training documents' features) spread
// over the paths evenly: within 5% (or one document) of an equal share each, or as close as 1000
// rounds of Sinkhorn's updates came. Deterministic.
LinearRouter fit_linear_router(const torch::Tensor& features, const torch::Tensor& labels, int64_t paths,
                               const torch::Tensor& balance);

}  // namespace loco::data
