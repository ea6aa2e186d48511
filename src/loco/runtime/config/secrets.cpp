#include "loco/runtime/config/secrets.h"

#include <algorithm>
#include <array>

namespace loco::runtime {
namespace {

struct SecretKey {
  std::string_view key, variable;
};
constexpr std::array kSecretKeys = {SecretKey{"cluster.join_token", "LOCO_JOIN_TOKEN"},
                                    SecretKey{"dipaco.database", "LOCO_DIPACO_DATABASE"}};

}  // namespace

std::optional<std::string> secret_variable(std::string_view key) {
  for (const auto& secret : kSecretKeys) {
    if (secret.key == key) return std::string(secret.variable);
  }
  return std::nullopt;
}

std::vector<std::pair<std::string, std::string>> take_secret_overrides(std::vector<std::string>& overrides) {
  std::vector<std::pair<std::string, std::string>> environment;
  auto secret = [&](const std::string& assignment) {
    const auto eq = assignment.find('=');
    if (eq == std::string::npos) return false;
    auto variable = secret_variable(std::string_view(assignment).substr(0, eq));
    if (!variable) return false;
    environment.emplace_back(*variable, assignment.substr(eq + 1));
    return true;
  };
  overrides.erase(std::remove_if(overrides.begin(), overrides.end(), secret), overrides.end());
  return environment;
}

}  // namespace loco::runtime
