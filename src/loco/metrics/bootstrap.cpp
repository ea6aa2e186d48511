#include "loco/metrics/bootstrap.h"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <vector>

namespace loco::metrics {

PairedInterval paired_bootstrap(std::span<const double> a, std::span<const double> b, std::span<const int64_t> tokens,
                                int64_t resamples, uint64_t seed) {
  const size_t n = tokens.size();
  if (a.size() != n || b.size() != n) throw std::invalid_argument("paired bootstrap: the models scored different documents");
  if (n == 0) throw std::invalid_argument("paired bootstrap: no documents");
  if (resamples < 1) throw std::invalid_argument("paired bootstrap: resamples must be >= 1");
  double total = 0;
  int64_t scored = 0;
  for (size_t i = 0; i < n; ++i) total += a[i] - b[i], scored += tokens[i];
  if (scored <= 0) throw std::invalid_argument("paired bootstrap: no scored tokens");

  std::mt19937_64 draw(seed);  // its sequence is fixed by the standard
  std::vector<double> differences;
  differences.reserve(static_cast<size_t>(resamples));
  for (int64_t r = 0; r < resamples; ++r) {
    double sum = 0;
    int64_t count = 0;
    for (size_t i = 0; i < n; ++i) {
      const size_t d = static_cast<size_t>(draw() % n);
      sum += a[d] - b[d];
      count += tokens[d];
    }
    // A resample of documents with no scored tokens says nothing; it counts as no difference.
    differences.push_back(count > 0 ? sum / static_cast<double>(count) : 0.0);
  }
  std::sort(differences.begin(), differences.end());
  auto percentile = [&](double q) {  // linear interpolation between the closest ranks
    const double at = q * static_cast<double>(differences.size() - 1);
    const auto below = static_cast<size_t>(at);
    const size_t above = std::min(below + 1, differences.size() - 1);
    return differences[below] + (at - static_cast<double>(below)) * (differences[above] - differences[below]);
  };
  return {total / static_cast<double>(scored), percentile(0.025), percentile(0.975), static_cast<int64_t>(n), resamples};
}

}  // namespace loco::metrics
