#include "loco/optim/options.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

#include "loco/core/error.h"

namespace loco::optim {

void AdamWOptions::validate() const {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw ConfigError("optim", message);
  };
  require(beta1 >= 0 && beta1 < 1, fmt::format("beta1 must be in [0, 1), got {}", beta1));
  require(beta2 >= 0 && beta2 < 1, fmt::format("beta2 must be in [0, 1), got {}", beta2));
  require(eps > 0, fmt::format("eps must be > 0, got {}", eps));
  require(weight_decay >= 0, fmt::format("weight_decay must be >= 0, got {}", weight_decay));
}

const char* to_string(OuterKind kind) {
  switch (kind) {
    case OuterKind::kNesterov: return "nesterov";
    case OuterKind::kSgd: return "sgd";
    case OuterKind::kAdam: return "adam";
  }
  return "?";
}

void OuterOptions::validate() const {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw ConfigError("optim", message);
  };
  require(lr > 0 && std::isfinite(lr), fmt::format("the outer lr must be > 0, got {}", lr));
  require(momentum >= 0 && momentum < 1, fmt::format("the outer momentum must be in [0, 1), got {}", momentum));
  require(beta2 >= 0 && beta2 < 1, fmt::format("the outer beta2 must be in [0, 1), got {}", beta2));
  require(eps > 0, fmt::format("the outer eps must be > 0, got {}", eps));
  require(momentum_warmup >= 0, fmt::format("the outer momentum warm-up must be >= 0 steps, got {}", momentum_warmup));
}

OuterOptions default_outer_options(OuterKind kind) {
  OuterOptions o;
  o.kind = kind;
  switch (kind) {
    case OuterKind::kNesterov: o.lr = 0.7; o.momentum = 0.9; break;
    case OuterKind::kSgd: o.lr = 1.0; o.momentum = 0.0; break;
    case OuterKind::kAdam: o.lr = 0.1; o.momentum = 0.9; break;
  }
  return o;
}

}  // namespace loco::optim
