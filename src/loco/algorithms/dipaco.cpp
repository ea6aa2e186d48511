#include "loco/algorithms/dipaco.h"

#include <cmath>
#include <set>

#include "loco/core/error.h"

namespace loco::algorithms {

std::vector<torch::Tensor> module_outer_gradient(const std::vector<PathReport>& reports, bool rescale,
                                                 const Screening& screening, ScreenedSync* screened) {
  if (reports.empty()) throw DataError("dipaco", "a module's outer step needs at least one path's outer gradient");
  std::set<int64_t> seen;
  const auto& first = reports.front().outer_gradient;
  for (const auto& report : reports) {
    if (!seen.insert(report.path).second) {
      throw DataError("dipaco", fmt::format("path {} reported twice for one module in one phase: its work would count twice",
                                            report.path));
    }
    if (!(report.weight > 0) || !std::isfinite(report.weight)) {
      throw DataError("dipaco", fmt::format("path {} reported weight {}: a weight is the path's shard size, positive and finite",
                                            report.path, report.weight));
    }
    if (report.outer_gradient.size() != first.size()) {
      throw DataError("dipaco", fmt::format("path {} reported {} tensors for a module of {}", report.path,
                                            report.outer_gradient.size(), first.size()));
    }
    for (size_t i = 0; i < first.size(); ++i) {
      if (!report.outer_gradient[i].sizes().equals(first[i].sizes())) {
        throw DataError("dipaco", fmt::format("path {} reported tensor {} of shape {} where the module's is {}", report.path,
                                              i, c10::str(report.outer_gradient[i].sizes()), c10::str(first[i].sizes())));
      }
    }
  }
  // Screening: each report a row of (size, counted, kept, ‖Δ_p‖²), as a sync's workers send them.
  std::vector<std::vector<double>> rows;
  std::vector<std::string> names;
  for (const auto& report : reports) {
    rows.push_back({report.weight, 1, 1, squared_outer_norm(report.outer_gradient, {}, false)});
    names.push_back(fmt::format("path {}", report.path));
  }
  auto kept = screen(rows, screening, names);
  if (kept.kept == 0) {
    throw DataError("dipaco", fmt::format("every outer gradient of the module's step was left out ({}): training "
                                          "diverged, or every path sent harm; hint: lower optim.lr or outer.lr", kept.why));
  }
  const double factor = rescale ? std::sqrt(static_cast<double>(kept.kept)) : 1.0;
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < first.size(); ++i) {
    // In float64, in report order, then once to fp32: the result does not depend on how the
    // weights happen to round in fp32. A report left out is not touched (0 × NaN is NaN).
    auto sum = torch::zeros(first[i].sizes(), first[i].options().dtype(torch::kFloat64));
    for (size_t p = 0; p < reports.size(); ++p) {
      if (kept.weights[p] != 0) sum.add_(reports[p].outer_gradient[i].to(torch::kFloat64), kept.weights[p]);
    }
    out.push_back(sum.mul_(factor).to(torch::kFloat32));
  }
  if (screened != nullptr) *screened = std::move(kept);
  return out;
}

ModuleState::ModuleState(std::string name, std::vector<std::string> tensor_names, std::vector<torch::Tensor> parameters,
                         optim::OuterOptions outer)
    : name_(std::move(name)), parameters_(parameters), optimizer_(std::move(tensor_names), std::move(parameters), outer) {}

void ModuleState::step(const std::vector<PathReport>& reports, bool rescale, const Screening& screening,
                       ScreenedSync* screened) {
  const auto delta = module_outer_gradient(reports, rescale, screening, screened);
  if (delta.size() != parameters_.size()) {
    throw DataError("dipaco", fmt::format("module {}: the paths reported {} tensors, the module holds {}", name_,
                                          delta.size(), parameters_.size()));
  }
  for (size_t i = 0; i < delta.size(); ++i) {
    if (!delta[i].sizes().equals(parameters_[i].sizes())) {
      throw DataError("dipaco", fmt::format("module {}: tensor {} reported with shape {}, the module's is {}", name_, i,
                                            c10::str(delta[i].sizes()), c10::str(parameters_[i].sizes())));
    }
  }
  optimizer_.step(delta);
}

}  // namespace loco::algorithms
