#include "loco/algorithms/screening.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace loco::algorithms {
namespace {

// The tally's columns.
constexpr size_t kSize = 0, kKept = 2, kSquaredNorm = 3;

}  // namespace

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

ScreenedSync screen(const std::vector<std::vector<double>>& rows, const Screening& screening,
                    const std::vector<std::string>& names) {
  const size_t m = rows.size();
  const auto name = [&](size_t q) { return q < names.size() ? names[q] : fmt::format("rank {}", q); };
  std::vector<double> norm(m, 0);
  std::vector<bool> finite(m, false), kept(m, false);
  ScreenedSync out;
  for (size_t q = 0; q < m; ++q) {
    norm[q] = std::sqrt(rows[q].at(kSquaredNorm));
    finite[q] = std::isfinite(norm[q]);
    kept[q] = rows[q].at(kKept) != 0;
    // A row no honest worker sends (a size that is not a finite number >= 0, flags other than 0 or
    // 1): its worker is left out, so that no stated number can take the others' weights.
    const double size = rows[q].at(kSize), counted = rows[q].at(1), flag = rows[q].at(kKept);
    if (kept[q] && !(std::isfinite(size) && size >= 0 && size <= 1e18 && (counted == 0 || counted == 1) && flag == 1)) {
      kept[q] = false;
      out.rejected += 1;
      out.why += fmt::format("{}{}: malformed numbers", out.why.empty() ? "" : "; ", name(q));
    }
  }
  std::vector<double> clip(m, 1.0);
  for (size_t q = 0; q < m; ++q) {
    if (!kept[q]) continue;
    if (!finite[q] && screening.reject_not_finite) {
      kept[q] = false;
      out.rejected += 1;
      out.not_finite += 1;
      out.why += fmt::format("{}{}: not finite", out.why.empty() ? "" : "; ", name(q));
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
        out.why += fmt::format("{}{}: norm {:.4g} is {:.3g}x the others' median {:.4g}", out.why.empty() ? "" : "; ", name(q),
                               norm[q], typical > 0 ? norm[q] / typical : std::numeric_limits<double>::infinity(), typical);
        continue;
      }
    }
    if (screening.clip_norm > 0 && norm[q] > screening.clip_norm) {
      clip[q] = screening.clip_norm / norm[q];
      out.why += fmt::format("{}{}: norm {:.4g} clipped to {:.4g}", out.why.empty() ? "" : "; ", name(q), norm[q],
                             screening.clip_norm);
    }
  }
  double total = 0;
  for (size_t q = 0; q < m; ++q) {
    if (kept[q]) total += rows[q].at(kSize), out.kept += 1;
  }
  // A robust mean weighs every kept contribution alike (what a worker states of its size moves
  // nothing); the average weighs by size.
  const bool uniform = total <= 0 || screening.combine != comm::Combine::kSum;
  for (size_t q = 0; q < m; ++q) {
    const double share = uniform ? 1.0 / static_cast<double>(std::max<int64_t>(1, out.kept)) : rows[q].at(kSize) / total;
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
  constexpr int64_t kChunk = 1 << 20;  // values at a time: the temporaries stay small, whatever the tensor
  double total = 0;
  for (size_t i = 0; i < sent.size(); ++i) {
    const auto values = sent[i].reshape({-1});
    const auto reference = sends_theta ? global[i].reshape({-1}) : torch::Tensor();
    for (int64_t begin = 0; begin < values.numel(); begin += kChunk) {
      const int64_t n = std::min(kChunk, values.numel() - begin);
      auto delta = values.narrow(0, begin, n).to(torch::kFloat64);
      if (sends_theta) delta = reference.narrow(0, begin, n).to(torch::kFloat64) - delta;
      total += delta.dot(delta).item<double>();
    }
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
