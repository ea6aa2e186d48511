// Paired bootstrap over documents (Efron & Tibshirani 1993, ch. 13; Koehn 2004 for its use in
// comparing models on one test set): how sure a difference in loss between two models scored on
// the same documents is. Documents, not tokens, are resampled, since a document's tokens are not
// independent of each other.
#pragma once

#include <cstdint>
#include <span>

namespace loco::metrics {

struct PairedInterval {
  double difference = 0;  // a - b: the token-weighted mean loss difference over every document
  double low = 0, high = 0;  // its 95% interval: the 2.5th and 97.5th percentiles of the resampled differences
  int64_t documents = 0, resamples = 0;
};

// `a` and `b` hold each document's summed loss under two models, `tokens` its scored tokens (the
// same for both). Each resample draws as many documents as there are, with replacement, and takes
// sum(a - b) / sum(tokens) over them. Deterministic in `seed`. Throws std::invalid_argument when
// the lengths differ, there are no documents or no tokens, or resamples < 1.
PairedInterval paired_bootstrap(std::span<const double> a, std::span<const double> b, std::span<const int64_t> tokens,
                                int64_t resamples = 2000, uint64_t seed = 1);

}  // namespace loco::metrics
