#include "loco/algorithms/screening.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace loco::algorithms {
namespace {

// The tally's columns.
constexpr size_t kSize = 0, kKept = 2, kSquaredNorm = 3;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

ScreenedSync screen(const std::vector<std::vector<double>>& rows, const Screening& screening) {
  const size_t m = rows.size();
  std::vector<double> norm(m, 0);
  std::vector<bool> finite(m, false), kept(m, false);
  for (size_t q = 0; q < m; ++q) {
    norm[q] = std::sqrt(rows[q].at(kSquaredNorm));
    finite[q] = std::isfinite(norm[q]);
    kept[q] = rows[q].at(kKept) != 0;
  }
  ScreenedSync out;
  std::vector<double> clip(m, 1.0);
  for (size_t q = 0; q < m; ++q) {
    if (!kept[q]) continue;
    if (!finite[q] && screening.reject_not_finite) {
      kept[q] = false;
      out.rejected += 1;
      out.not_finite += 1;
      out.why += fmt::format("{}rank {}: not finite", out.why.empty() ? "" : "; ", q);
      continue;
    }
    if (screening.reject_ratio > 0) {
      std::vector<double> others;
      for (size_t k = 0; k < m; ++k) {
        if (k != q && rows[k].at(kKept) != 0 && finite[k]) others.push_back(norm[k]);
      }
      const double typical = others.empty() ? 0 : median(others);
      if (!others.empty() && norm[q] > screening.reject_ratio * typical) {
        kept[q] = false;
        out.rejected += 1;
        out.why += fmt::format("{}rank {}: norm {:.4g} is {:.3g}x the others' median {:.4g}", out.why.empty() ? "" : "; ", q,
                               norm[q], typical > 0 ? norm[q] / typical : std::numeric_limits<double>::infinity(), typical);
        continue;
      }
    }
    if (screening.clip_norm > 0 && norm[q] > screening.clip_norm) {
      clip[q] = screening.clip_norm / norm[q];
      out.why += fmt::format("{}rank {}: norm {:.4g} clipped to {:.4g}", out.why.empty() ? "" : "; ", q, norm[q], screening.clip_norm);
    }
  }
  double total = 0;
  for (size_t q = 0; q < m; ++q) {
    if (kept[q]) total += rows[q].at(kSize), out.kept += 1;
  }
  for (size_t q = 0; q < m; ++q) {
    const double share = total > 0 ? rows[q].at(kSize) / total : 1.0 / static_cast<double>(std::max<int64_t>(1, out.kept));
    out.weights.push_back(kept[q] ? share * clip[q] : 0.0);
  }
  return out;
}

comm::Tally sync_tally(double size, double counted, double kept, double squared_norm, const Screening& screening) {
  comm::Tally tally;
  tally.mine = {size, counted, kept, squared_norm};
  tally.weights = [screening](const std::vector<std::vector<double>>& all) { return screen(all, screening).weights; };
  return tally;
}

double squared_outer_norm(const std::vector<torch::Tensor>& sent, const std::vector<torch::Tensor>& global, bool sends_theta) {
  double total = 0;
  for (size_t i = 0; i < sent.size(); ++i) {
    const auto delta = sends_theta ? global[i] - sent[i] : sent[i];
    total += delta.square().sum(torch::kFloat64).item<double>();
  }
  return total;
}

void apply_poison(std::vector<torch::Tensor>& sent, const std::vector<torch::Tensor>& global, bool sends_theta, double scale) {
  if (sent.empty()) return;
  if (std::isnan(scale)) {
    sent.front().view({-1})[0].fill_(std::numeric_limits<float>::quiet_NaN());
    return;
  }
  for (size_t i = 0; i < sent.size(); ++i) {
    if (sends_theta) sent[i].sub_(global[i]).mul_(scale).add_(global[i]);  // θ + scale·(θ_m − θ) = θ − scale·Δ_m
    else sent[i].mul_(scale);
  }
}

}  // namespace loco::algorithms
