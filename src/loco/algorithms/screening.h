// Screening of a sync's outer gradients (options.h, Screening), and the numbers each worker sends
// with its contribution so that every worker weighs every contribution alike without a collective
// of its own (comm::Tally): (s_m, counted_m, kept_m, ‖Δ_m‖²).
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "loco/algorithms/options.h"
#include "loco/comm/group.h"

namespace loco::algorithms {

// What screening made of one sync's contributions (rows: every rank's tally, in rank order;
// `names`, when given, names each row in `why` instead of "rank q").
struct ScreenedSync {
  std::vector<double> weights;  // w_m: s_m / Σ s over the contributions kept (1/K when every s is 0), times the clip
  int64_t kept = 0;             // contributions in the average
  int64_t rejected = 0;         // counted and not dropped, but left out by screening
  int64_t not_finite = 0;       // ... of them, for a value that is not finite
  std::string why;              // one clause per contribution left out or clipped ("" when none)
};
ScreenedSync screen(const std::vector<std::vector<double>>& rows, const Screening& screening,
                    const std::vector<std::string>& names = {});

// The median of `values` (not empty): the middle one, or the mean of the middle two.
double median(std::vector<double> values);

// A sync's tally: this worker's (s_m, counted_m, kept_m, ‖Δ_m‖²), weighted by screen().
comm::Tally sync_tally(double size, double counted, double kept, double squared_norm, const Screening& screening);

// ‖Δ_m‖², summed in double (NaN or infinite when a value is): `sent` holds Δ_m, or θ_m when
// `sends_theta` (Δ_m = θ − θ_m, with θ in `global`; otherwise `global` is not read).
double squared_outer_norm(const std::vector<torch::Tensor>& sent, const std::vector<torch::Tensor>& global, bool sends_theta);

// Poison: `sent` made to carry Δ_m·scale (scale NaN: its first value NaN instead).
void apply_poison(std::vector<torch::Tensor>& sent, const std::vector<torch::Tensor>& global, bool sends_theta, double scale);

}  // namespace loco::algorithms
