#include "loco/data/routing.h"

#include <fmt/format.h>
#include <torch/torch.h>  // torch::nn and torch::optim: the router is trained

#include <algorithm>
#include <cmath>

#include "loco/core/error.h"
#include "loco/data/sharding.h"

namespace loco::data {
namespace {

// Each point to a centre, every centre taking floor(N/k) or ceil(N/k) points: first every centre
// fills up to floor(N/k) from the closest (point, centre) pairs overall, then the N mod k points
// left go, closest pairs first, to centres still below ceil(N/k). Ties break by index, so the
// result is deterministic.
std::vector<int64_t> assign_balanced(const torch::Tensor& x, const torch::Tensor& centres) {
  return balanced_assignment(torch::cdist(x, centres));
}

}  // namespace

std::vector<int64_t> balanced_assignment(const torch::Tensor& cost) {
  const int64_t n = cost.size(0), k = cost.size(1);
  const auto distances = cost.to(torch::kFloat32).contiguous();  // (N, k)
  const auto order = std::get<1>(distances.view({-1}).sort(/*stable=*/true, 0, false)).contiguous();
  const auto* pairs = order.data_ptr<int64_t>();
  std::vector<int64_t> out(static_cast<size_t>(n), -1), size(static_cast<size_t>(k), 0);
  int64_t left = n;
  for (const int64_t capacity : {n / k, (n + k - 1) / k}) {
    for (int64_t i = 0; i < n * k && left > 0; ++i) {
      const int64_t point = pairs[i] / k, centre = pairs[i] % k;
      if (out[static_cast<size_t>(point)] >= 0 || size[static_cast<size_t>(centre)] >= capacity) continue;
      out[static_cast<size_t>(point)] = centre;
      ++size[static_cast<size_t>(centre)];
      --left;
    }
  }
  return out;
}

namespace {

torch::Tensor means_of(const torch::Tensor& x, const std::vector<int64_t>& assignment, int64_t k) {
  auto centres = torch::zeros({k, x.size(1)});
  auto counts = torch::zeros({k, 1});
  auto index = torch::tensor(assignment, torch::kInt64);
  centres.index_add_(0, index, x);
  counts.index_add_(0, index, torch::ones({x.size(0), 1}));
  return centres / counts.clamp_min(1);
}

KMeansRouter fit_part(const torch::Tensor& x, int64_t k, uint64_t seed, int64_t iterations) {
  // Plain k-means (k-means++ and Lloyd) places the centres; balanced assignments then replace its
  // Lloyd steps until no point moves.
  auto centres = means_of(x, kmeans(x, k, seed), k);
  std::vector<int64_t> assignment;
  for (int64_t it = 0; it < iterations; ++it) {
    auto next = assign_balanced(x, centres);
    if (next == assignment) break;
    assignment = std::move(next);
    centres = means_of(x, assignment, k);
  }
  return KMeansRouter{k, {centres}, assignment};
}

void check_points(const torch::Tensor& points, int64_t needed, const char* what) {
  if (points.dim() != 2 || points.scalar_type() != torch::kFloat32) {
    throw DataError("route", fmt::format("{}: features must be (N, D) float32, got {} of {}", what,
                                         c10::str(points.sizes()), c10::toString(points.scalar_type())));
  }
  if (points.size(0) < needed) {
    throw DataError("route", fmt::format("{}: {} documents for {} paths: every path needs at least one document; hint: "
                                         "fewer modules per level, or more documents", what, points.size(0), needed));
  }
}

}  // namespace

int64_t KMeansRouter::paths() const {
  int64_t p = 1;
  for (size_t i = 0; i < centres.size(); ++i) p *= k;
  return p;
}

std::vector<int64_t> KMeansRouter::route(const torch::Tensor& features) const {
  int64_t width = 0;
  for (const auto& c : centres) width += c.size(1);
  if (features.dim() != 2 || features.size(1) != width) {
    throw DataError("route", fmt::format("features of shape {} for a router fitted on width {} (another model?)",
                                         c10::str(features.sizes()), width));
  }
  std::vector<int64_t> out(static_cast<size_t>(features.size(0)), 0);
  int64_t offset = 0;
  for (const auto& c : centres) {
    auto nearest = torch::cdist(features.narrow(1, offset, c.size(1)).to(torch::kFloat32).contiguous(), c).argmin(1);
    for (size_t i = 0; i < out.size(); ++i) out[i] = out[i] * k + nearest[static_cast<int64_t>(i)].item<int64_t>();
    offset += c.size(1);
  }
  return out;
}

std::vector<std::vector<int64_t>> KMeansRouter::ranked(const torch::Tensor& features, int64_t n) const {
  if (n < 1 || n > paths()) throw DataError("route", fmt::format("{} nearest paths asked of a router of {}", n, paths()));
  route(features.narrow(0, 0, std::min<int64_t>(features.size(0), 1)));  // the width check
  const int64_t rows = features.size(0);
  torch::Tensor cost = torch::zeros({rows, 1});
  int64_t offset = 0;
  for (const auto& c : centres) {
    auto d = torch::cdist(features.narrow(1, offset, c.size(1)).to(torch::kFloat32).contiguous(), c).pow(2);  // (N, k)
    cost = (cost.unsqueeze(2) + d.unsqueeze(1)).reshape({rows, -1});  // digits: the earlier parts most significant
    offset += c.size(1);
  }
  const auto order = std::get<1>(cost.sort(/*stable=*/true, 1, false)).narrow(1, 0, n).contiguous();
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(rows));
  const auto* index = order.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows; ++i) out[static_cast<size_t>(i)].assign(index + i * n, index + (i + 1) * n);
  return out;
}

KMeansRouter fit_balanced_kmeans(const torch::Tensor& points, int64_t k, uint64_t seed, int64_t iterations) {
  check_points(points, k, "k-means routing");
  return fit_part(points.contiguous(), k, seed, iterations);
}

KMeansRouter fit_product_kmeans(const torch::Tensor& points, int64_t k, uint64_t seed, int64_t iterations) {
  check_points(points, k * k, "product k-means routing");
  if (points.size(1) < 2) throw DataError("route", "product k-means routing: features need at least 2 values to halve");
  const int64_t half = points.size(1) / 2;
  const auto a = fit_part(points.narrow(1, 0, half).contiguous(), k, seed, iterations);
  const auto b = fit_part(points.narrow(1, half, points.size(1) - half).contiguous(), k, seed + 1, iterations);
  KMeansRouter router{k, {a.centres[0], b.centres[0]}, {}};
  const int64_t n = points.size(0), paths = k * k;
  std::vector<int64_t> members(static_cast<size_t>(paths), 0);
  for (int64_t i = 0; i < n; ++i) {
    router.assignment.push_back(a.assignment[static_cast<size_t>(i)] * k + b.assignment[static_cast<size_t>(i)]);
    ++members[static_cast<size_t>(router.assignment.back())];
  }
  // A pair of clusters no document fell into takes the nearest document of a path that can spare one.
  const auto da = torch::cdist(points.narrow(1, 0, half).contiguous(), a.centres[0]);            // (N, k)
  const auto db = torch::cdist(points.narrow(1, half, points.size(1) - half).contiguous(), b.centres[0]);
  for (int64_t p = 0; p < paths; ++p) {
    if (members[static_cast<size_t>(p)] > 0) continue;
    const auto spare = torch::tensor(members, torch::kInt64).index_select(0, torch::tensor(router.assignment, torch::kInt64)) >= 2;
    const auto cost = (da.select(1, p / k) + db.select(1, p % k)).masked_fill(spare.logical_not(), INFINITY);
    const int64_t chosen = cost.argmin().item<int64_t>();
    --members[static_cast<size_t>(router.assignment[static_cast<size_t>(chosen)])];
    router.assignment[static_cast<size_t>(chosen)] = p;
    members[static_cast<size_t>(p)] = 1;
  }
  return router;
}

torch::Tensor LinearRouter::scores(const torch::Tensor& features) const {
  return ((features.to(torch::kFloat32) - mean) / scale).matmul(weight) + bias;
}

std::vector<int64_t> LinearRouter::route(const torch::Tensor& features) const {
  const auto best = scores(features).argmax(1).contiguous();
  return {best.data_ptr<int64_t>(), best.data_ptr<int64_t>() + best.numel()};
}

NeighbourRouter fit_neighbour_router(const torch::Tensor& features, const std::vector<int64_t>& assignment) {
  check_points(features, 1, "neighbour router");
  if (static_cast<int64_t>(assignment.size()) != features.size(0)) {
    throw DataError("route", fmt::format("{} paths assigned to {} documents", assignment.size(), features.size(0)));
  }
  for (auto p : assignment) {
    if (p < 0) throw DataError("route", fmt::format("a document assigned to path {}", p));
  }
  return {features.to(torch::kFloat32).contiguous(), torch::tensor(assignment, torch::kInt64)};
}

std::vector<int64_t> NeighbourRouter::route(const torch::Tensor& query) const {
  if (query.dim() != 2 || query.size(1) != features.size(1)) {
    throw DataError("route", fmt::format("features of shape {} for a router fitted on width {} (another model?)",
                                         c10::str(query.sizes()), features.size(1)));
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(query.size(0)));
  for (int64_t start = 0; start < query.size(0); start += 1024) {  // bounded memory: 1024 x N distances at a time
    const auto rows = query.narrow(0, start, std::min<int64_t>(1024, query.size(0) - start)).to(torch::kFloat32).contiguous();
    const auto routed = paths.index_select(0, torch::cdist(rows, features).argmin(1)).contiguous();
    out.insert(out.end(), routed.data_ptr<int64_t>(), routed.data_ptr<int64_t>() + routed.numel());
  }
  return out;
}

LinearRouter fit_linear_router(const torch::Tensor& features, const torch::Tensor& labels, int64_t paths,
                               const torch::Tensor& balance) {
  LinearRouter r;  // (no randomness: zero initial weights, full-batch Adam)
  r.mean = features.mean(0);
  r.scale = features.std(0).clamp_min(1e-6);
  const auto x = (features - r.mean) / r.scale;
  auto weight = torch::zeros({x.size(1), paths}, torch::requires_grad());
  auto bias = torch::zeros({paths}, torch::requires_grad());
  torch::optim::Adam adam({weight, bias}, torch::optim::AdamOptions(0.05));
  for (int step = 0; step < 300; ++step) {
    adam.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(x.matmul(weight) + bias, labels) + 1e-2 * weight.pow(2).sum();
    loss.backward();
    adam.step();
  }
  r.weight = weight.detach();
  auto tuned = bias.detach().clone();
  const auto z = ((balance.to(torch::kFloat32) - r.mean) / r.scale).matmul(r.weight);
  const double target = static_cast<double>(balance.size(0)) / static_cast<double>(paths);
  // Sinkhorn's updates of the biases (the dual of an even transport of documents to paths) at a
  // falling temperature, keeping the biases whose hard assignment came closest to even.
  double best = INFINITY;
  r.bias = tuned.clone();
  for (const double temperature : {1.0, 0.5, 0.25, 0.1, 0.05}) {
    for (int round = 0; round < 200; ++round) {
      const auto scores = z + tuned;
      const auto counts = torch::bincount(scores.argmax(1), {}, paths).to(torch::kFloat32);
      const double off = (counts - target).abs().max().item<double>();
      if (off < best) best = off, r.bias = tuned.clone();
      if (off <= std::max(1.0, 0.05 * target)) return r;
      const auto mass = torch::softmax(scores / temperature, 1).sum(0).clamp_min(1e-12);  // (P)
      tuned += temperature * (std::log(target) - mass.log());
    }
  }
  return r;
}

}  // namespace loco::data
