#include "loco/algorithms/dipaco.h"

#include <cmath>
#include <set>

#include "loco/core/error.h"

namespace loco::algorithms {

std::vector<torch::Tensor> module_outer_gradient(const std::vector<PathReport>& reports, bool rescale) {
  if (reports.empty()) throw DataError("dipaco", "a module's outer step needs at least one path's outer gradient");
  std::set<int64_t> seen;
  double total = 0;
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
    total += report.weight;
  }
  const double factor = rescale ? std::sqrt(static_cast<double>(reports.size())) : 1.0;
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < first.size(); ++i) {
    // In float64, in report order, then once to fp32: the result does not depend on how the
    // weights happen to round in fp32.
    auto sum = torch::zeros(first[i].sizes(), first[i].options().dtype(torch::kFloat64));
    for (const auto& report : reports) sum.add_(report.outer_gradient[i].to(torch::kFloat64), report.weight / total);
    out.push_back(sum.mul_(factor).to(torch::kFloat32));
  }
  return out;
}

ModuleState::ModuleState(std::string name, std::vector<std::string> tensor_names, std::vector<torch::Tensor> parameters,
                         optim::OuterOptions outer)
    : name_(std::move(name)), parameters_(parameters), optimizer_(std::move(tensor_names), std::move(parameters), outer) {}

void ModuleState::step(const std::vector<PathReport>& reports, bool rescale) {
  const auto delta = module_outer_gradient(reports, rescale);
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
