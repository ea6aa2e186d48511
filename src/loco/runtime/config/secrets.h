// Config values that are secrets (the join token, a PostgreSQL connection string with its password)
// and how they reach a child process: through its environment, which only its user and root can
// read (/proc/PID/environ), never its command line, which `ps` shows every local user.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loco::runtime {

// The environment variable a secret key's value travels in ("cluster.join_token": LOCO_JOIN_TOKEN,
// "dipaco.database": LOCO_DIPACO_DATABASE), read back when the key is not set; nullopt for a key
// that is no secret.
std::optional<std::string> secret_variable(std::string_view key);

// Removes from `overrides` ("section.key=value") those that set a secret key and returns them as
// (variable, value) pairs for a child's environment.
std::vector<std::pair<std::string, std::string>> take_secret_overrides(std::vector<std::string>& overrides);

}  // namespace loco::runtime
