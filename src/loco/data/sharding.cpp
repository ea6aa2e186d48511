#include "loco/data/sharding.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "loco/core/error.h"
#include "loco/data/sampling.h"

namespace loco::data {
namespace {

void require_enough_documents(const Split& split, int64_t workers) {
  LOCO_CHECK(workers >= 1, "{} workers", workers);
  if (static_cast<int64_t>(split.documents.size()) < workers) {
    throw DataError("data", fmt::format("{} workers but only {} training documents: every worker needs at least one",
                                        workers, split.documents.size()));
  }
}

void sort_shards(ShardAssignment& a) {
  for (auto& docs : a.documents) std::sort(docs.begin(), docs.end());
}

}  // namespace

ShardAssignment shard_iid(const Split& split, int64_t workers, uint64_t seed) {
  require_enough_documents(split, workers);
  ShardAssignment a{"iid", std::vector<std::vector<uint32_t>>(static_cast<size_t>(workers))};
  const auto order = detail::permutation(split.documents.size(), seed);
  uint64_t total = 0;
  for (const auto& d : split.documents) total += d.length;
  // Cut the shuffled stream into M runs of about T/M tokens: move to the next worker once this
  // one holds its share, or when the documents left are just enough for one per remaining worker.
  const auto m = static_cast<uint64_t>(workers);
  uint64_t position = 0;
  size_t w = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t workers_after = static_cast<size_t>(workers) - 1 - w;
    const bool share_done = position * m >= (w + 1) * total;
    if (w + 1 < static_cast<size_t>(workers) && !a.documents[w].empty() && (share_done || order.size() - i <= workers_after)) {
      ++w;
    }
    const auto doc = static_cast<uint32_t>(order[i]);
    a.documents[w].push_back(doc);
    position += split.documents[doc].length;
  }
  sort_shards(a);
  return a;
}

ShardAssignment shard_by_label(const Split& split, const std::vector<std::string>& labels, int64_t workers) {
  require_enough_documents(split, workers);
  std::map<uint32_t, uint64_t> tokens_of_label;
  for (const auto& d : split.documents) tokens_of_label[d.label] += d.length;
  if (static_cast<int64_t>(tokens_of_label.size()) < workers) {
    std::vector<std::string> names;
    for (const auto& [label, tokens] : tokens_of_label) {
      names.push_back(label < labels.size() && !labels[label].empty() ? labels[label] : "(none)");
    }
    throw DataError("data", fmt::format("data.shard = \"label\" gives each worker whole labels, but the training split "
                                        "has {} label(s) ({}) for {} workers; hint: use data.shard = \"iid\" or \"kmeans\"",
                                        tokens_of_label.size(), fmt::join(names, ", "), workers));
  }
  // Largest label first, each to the worker with the fewest tokens so far (ties: lowest rank).
  std::vector<std::pair<uint32_t, uint64_t>> by_size(tokens_of_label.begin(), tokens_of_label.end());
  std::stable_sort(by_size.begin(), by_size.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<uint64_t> load(static_cast<size_t>(workers), 0);
  std::map<uint32_t, size_t> worker_of_label;
  for (const auto& [label, tokens] : by_size) {
    const size_t w = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    worker_of_label[label] = w;
    load[w] += tokens;
  }
  ShardAssignment a{"label", std::vector<std::vector<uint32_t>>(static_cast<size_t>(workers))};
  for (uint32_t i = 0; i < split.documents.size(); ++i) a.documents[worker_of_label.at(split.documents[i].label)].push_back(i);
  return a;
}

std::vector<int64_t> kmeans(const torch::Tensor& points, int64_t k, uint64_t seed, int64_t iterations) {
  LOCO_CHECK(points.dim() == 2 && points.scalar_type() == torch::kFloat32, "kmeans expects (N, D) float32");
  const int64_t n = points.size(0);
  LOCO_CHECK(k >= 1 && k <= n, "kmeans: k = {} for {} points", k, n);
  auto x = points.contiguous();
  std::mt19937_64 rng(seed);
  auto uniform01 = [&] { return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0); };

  // k-means++: the first centre uniformly, each next with probability proportional to D(x)^2.
  std::vector<int64_t> chosen{static_cast<int64_t>(detail::uniform_below(rng, static_cast<uint64_t>(n)))};
  auto nearest = (x - x[chosen[0]]).pow(2).sum(1);  // (N)
  while (static_cast<int64_t>(chosen.size()) < k) {
    auto weights = nearest.to(torch::kFloat64);
    const double total = weights.sum().item<double>();
    int64_t next = 0;
    if (total <= 0) {
      next = static_cast<int64_t>(detail::uniform_below(rng, static_cast<uint64_t>(n)));  // all points coincide
    } else {
      auto cumulative = weights.cumsum(0);
      const double target = uniform01() * total;
      next = std::min<int64_t>(n - 1, torch::searchsorted(cumulative, torch::tensor({target}, torch::kFloat64)).item<int64_t>());
    }
    chosen.push_back(next);
    nearest = torch::minimum(nearest, (x - x[next]).pow(2).sum(1));
  }
  auto centres = x.index_select(0, torch::tensor(chosen, torch::kInt64)).clone();  // (k, D)

  torch::Tensor assignment;
  for (int64_t it = 0; it < iterations; ++it) {
    auto distances = torch::cdist(x, centres);  // (N, k)
    auto next = distances.argmin(1);
    if (assignment.defined() && torch::equal(next, assignment)) break;
    assignment = next;
    for (int64_t c = 0; c < k; ++c) {
      auto members = (assignment == c).nonzero().squeeze(1);
      if (members.numel() > 0) {
        centres[c] = x.index_select(0, members).mean(0);
      } else {
        // An empty cluster takes the point farthest from its centre.
        auto far = distances.gather(1, assignment.unsqueeze(1)).squeeze(1).argmax().item<int64_t>();
        centres[c] = x[far];
      }
    }
  }
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = assignment[i].item<int64_t>();
  return out;
}

ShardAssignment shard_by_kmeans(const torch::Tensor& embeddings, int64_t workers, uint64_t seed) {
  const auto n = embeddings.size(0);
  if (n < workers) {
    throw DataError("data", fmt::format("{} workers but only {} training documents: every worker needs at least one", workers, n));
  }
  auto cluster = kmeans(embeddings, workers, seed);
  // Number clusters by their first document, so the worker of a cluster does not depend on k-means' labels.
  std::vector<int64_t> rank_of_cluster(static_cast<size_t>(workers), -1);
  int64_t next = 0;
  for (auto c : cluster) {
    if (rank_of_cluster[static_cast<size_t>(c)] < 0) rank_of_cluster[static_cast<size_t>(c)] = next++;
  }
  ShardAssignment a{"kmeans", std::vector<std::vector<uint32_t>>(static_cast<size_t>(workers))};
  for (size_t i = 0; i < cluster.size(); ++i) {
    const auto r = rank_of_cluster[static_cast<size_t>(cluster[i])];
    if (r >= 0) a.documents[static_cast<size_t>(r)].push_back(static_cast<uint32_t>(i));
  }
  for (size_t w = 0; w < a.documents.size(); ++w) {
    if (a.documents[w].empty()) {
      throw DataError("data", fmt::format("k-means left worker {}'s cluster empty ({} documents, {} workers); hint: use "
                                          "data.shard = \"iid\"", w, n, workers));
    }
  }
  return a;
}

std::vector<int32_t> shard_tokens(const Split& split, const std::vector<uint32_t>& documents) {
  std::vector<int32_t> out;
  for (auto d : documents) {
    const auto& doc = split.documents.at(d);
    out.insert(out.end(), split.tokens.begin() + static_cast<int64_t>(doc.offset),
               split.tokens.begin() + static_cast<int64_t>(doc.offset + doc.length));
  }
  return out;
}

std::vector<uint64_t> shard_token_counts(const Split& split, const ShardAssignment& assignment) {
  std::vector<uint64_t> out;
  for (const auto& docs : assignment.documents) {
    uint64_t n = 0;
    for (auto d : docs) n += split.documents.at(d).length;
    out.push_back(n);
  }
  return out;
}

}  // namespace loco::data
