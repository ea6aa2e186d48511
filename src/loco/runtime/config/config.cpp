#include "loco/runtime/config/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <variant>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/data/corpus.h"
#include "loco/runtime/config/keys.h"
#include "loco/runtime/config/secrets.h"

namespace loco::runtime {
namespace {

using keys::EnumField;
using keys::Field;
using keys::FieldPtr;
using keys::kInf;

const char* type_name(const FieldPtr& p) {
  switch (p.index()) {
    case 0: return "integer";
    case 1: return "float";
    case 2: return "bool";
    case 3: return "string";
    default: return "choice";
  }
}

std::string value_text(const FieldPtr& p) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, EnumField>) {
          return v.get();
        } else if constexpr (std::is_same_v<T, std::string*>) {
          return *v;
        } else if constexpr (std::is_same_v<T, bool*>) {
          return *v ? "true" : "false";
        } else {
          return fmt::format("{}", *v);
        }
      },
      p);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

Field& find_field(std::vector<Field>& fields, const std::string& key, const std::string& where) {
  for (auto& f : fields) {
    if (f.key == key) return f;
  }
  std::string best;
  size_t best_distance = 4;
  for (auto& f : fields) {
    size_t d = edit_distance(key, f.key);
    if (d < best_distance) best_distance = d, best = f.key;
  }
  throw ConfigError("config", fmt::format("unknown key '{}'{}{}", key, where,
                                          best.empty() ? "; `loco config --reference` lists every key"
                                                       : fmt::format("; did you mean '{}'?", best)));
}

void check_range(const Field& f, double value) {
  const bool low = f.min_exclusive ? !(value > f.min) : !(value >= f.min);
  if (low || value > f.max || std::isnan(value)) {
    std::string range = f.max == kInf ? fmt::format("{} {}", f.min_exclusive ? ">" : ">=", f.min)
                                      : fmt::format("in [{}, {}]", f.min, f.max);
    throw ConfigError("config", fmt::format("{} must be {}, got {}", f.key, range, value));
  }
}

// Sets a field from text (command-line override). Throws ConfigError naming the key.
void set_from_text(Field& f, const std::string& text) {
  auto bad = [&](const char* expected) {
    // A secret's value is never echoed, not even when it is malformed.
    const std::string shown = secret_variable(f.key) ? fmt::format("{} bytes", text.size()) : "'" + text + "'";
    return ConfigError("config", fmt::format("{} expects {}, got {}", f.key, expected, shown));
  };
  std::visit(
      [&](auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t*>) {
          int64_t parsed = 0;
          auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed);
          if (ec != std::errc() || end != text.data() + text.size()) throw bad("an integer");
          *v = parsed;
        } else if constexpr (std::is_same_v<T, double*>) {
          size_t used = 0;
          double parsed = 0;
          try {
            parsed = std::stod(text, &used);
          } catch (const std::exception&) {
            throw bad("a number");
          }
          if (used != text.size()) throw bad("a number");
          *v = parsed;
        } else if constexpr (std::is_same_v<T, bool*>) {
          if (text == "true" || text == "1") *v = true;
          else if (text == "false" || text == "0") *v = false;
          else throw bad("true or false");
        } else if constexpr (std::is_same_v<T, std::string*>) {
          // TOML is UTF-8: the saved config.toml could not hold anything else (toml++ refuses it).
          try {
            data::check_utf8(text, f.key);
          } catch (const DataError&) {
            throw bad("UTF-8 text");
          }
          *v = text;
        } else {
          if (std::find(v.names.begin(), v.names.end(), text) == v.names.end()) {
            throw ConfigError("config", fmt::format("{} must be one of {}, got '{}'", f.key, fmt::join(v.names, ", "), text));
          }
          v.set(text);
        }
      },
      f.value);
}

const char* toml_type_name(const toml::node& node) {
  if (node.is_string()) return "string";
  if (node.is_integer()) return "integer";
  if (node.is_floating_point()) return "float";
  if (node.is_boolean()) return "boolean";
  if (node.is_array()) return "array";
  if (node.is_table()) return "table";
  return "date/time";
}

void set_from_toml(Field& f, const toml::node& node, const std::string& where) {
  auto bad = [&](const char* expected) {
    return ConfigError("config", fmt::format("{}{}: expected {}, got a TOML {}", f.key, where, expected,
                                             toml_type_name(node)));
  };
  std::visit(
      [&](auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t*>) {
          if (!node.is_integer()) throw bad("an integer");
          *v = node.as_integer()->get();
        } else if constexpr (std::is_same_v<T, double*>) {
          if (node.is_integer()) *v = static_cast<double>(node.as_integer()->get());
          else if (node.is_floating_point()) *v = node.as_floating_point()->get();
          else throw bad("a number");
        } else if constexpr (std::is_same_v<T, bool*>) {
          if (!node.is_boolean()) throw bad("true or false");
          *v = node.as_boolean()->get();
        } else if constexpr (std::is_same_v<T, std::string*>) {
          if (!node.is_string()) throw bad("a string");
          *v = node.as_string()->get();
        } else {
          if (!node.is_string()) throw bad("a string");
          set_from_text(f, node.as_string()->get());
        }
      },
      f.value);
}

void walk_table(const toml::table& table, const std::string& prefix, std::vector<Field>& fields, const std::string& source) {
  for (const auto& [key, node] : table) {
    const std::string full = prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    const auto& begin = node.source().begin;
    const std::string where = fmt::format(" ({}:{})", source, begin.line);
    if (const auto* sub = node.as_table()) {
      walk_table(*sub, full, fields, source);
      continue;
    }
    set_from_toml(find_field(fields, full, where), node, where);
  }
}

}  // namespace

RunConfig parse_config(const std::string& toml_text, const std::string& source) {
  toml::table table;
  try {
    table = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    throw ConfigError("config", fmt::format("{}:{}:{}: {}", source, e.source().begin.line, e.source().begin.column,
                                            e.description()));
  }
  RunConfig config;
  auto fields = keys::table(config);
  walk_table(table, "", fields, source);
  validate(config);
  return config;
}

RunConfig load_config(const fs::path& file, const std::vector<std::string>& overrides) {
  RunConfig config = parse_config(read_file(file, "config"), file.string());
  for (const auto& assignment : overrides) apply_override(config, assignment);
  // A launcher hands a DiPaCo worker the database through the environment (config/secrets.h).
  if (const char* database = std::getenv("LOCO_DIPACO_DATABASE"); config.dipaco.database.empty() && database != nullptr) {
    config.dipaco.database = database;
  }
  // The values as given first: a default fills in only what was left at its "default" value, and an
  // out-of-range override (outer.lr = -0.5) is refused, not replaced by the default.
  validate(config);
  resolve_defaults(config);
  validate(config);
  return config;
}

const std::vector<std::string> kResumeFixedKeys = {"data.", "model.", "optim.", "train.batch_size",
                                                   "train.grad_accum", "train.seed", "train.z_loss",
                                                   "train.init_from", "sync.", "outer.", "cluster.workers"};

const std::vector<std::string> kPerWorkerKeys = {"run.dir",       "data.dir",     "train.device",
                                                 "train.threads", "train.log_every", "cluster.host",
                                                 "cluster.port",  "cluster.join_timeout_s", "cluster.connect_timeout_s",
                                                 "cluster.join_token", "cluster.tls_cert", "cluster.tls_key", "cluster.tls_ca",
                                                 "link.rate", "link.delay", "link.workers", "link.cpu"};

void apply_override(RunConfig& config, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError("config", fmt::format("override '{}' is not of the form --section.key=value", assignment));
  }
  auto fields = keys::table(config);
  auto& field = find_field(fields, assignment.substr(0, eq), " (command line)");
  set_from_text(field, assignment.substr(eq + 1));
}

namespace {

// The screening keys (docs/failure-model.md, "A worker that sends harm"), and sync.poison.
void check_screening(const RunConfig& c) {
  algorithms::Screening{c.sync.reject_ratio, c.sync.clip_norm, c.sync.robust_mean, c.sync.trim}.validate();
  algorithms::parse_poison(c.sync.poison);  // ConfigError when malformed
  if (!c.dipaco.levels.empty() && c.sync.robust_mean != comm::Combine::kSum) {
    throw ConfigError("config", "sync.robust_mean is not available to DiPaCo's module steps (they screen by "
                                "sync.reject_ratio, sync.clip_norm and sync.reject_not_finite): set sync.robust_mean = \"none\"");
  }
}

// sync.async: what asynchronous DiLoCo offers so far (docs/async.md), the rest refused by name.
void check_async(const RunConfig& c) {
  auto refuse = [](const std::string& why) { throw ConfigError("config", "sync.async (asynchronous DiLoCo) " + why); };
  if (c.sync.algorithm != Algorithm::kDiLoCo && c.sync.algorithm != Algorithm::kStreaming) {
    refuse(fmt::format("is for sync.algorithm = \"diloco\" or \"streaming\", got \"{}\"", to_string(c.sync.algorithm)));
  }
  if (c.sync.algorithm == Algorithm::kStreaming && c.sync.overlap_steps > 0) {
    refuse("exchanges each fragment in its turn and continues from the answer: set sync.overlap_steps = 0");
  }
  if (c.sync.eager) refuse("and sync.eager are two ways of not waiting: choose one");
  if (c.sync.round_seconds > 0) refuse("shares the steps by speed itself: set sync.round_seconds = 0");
  if (c.sync.robust_mean != comm::Combine::kSum) refuse("applies each outer gradient alone: there is no mean to make robust (sync.robust_mean = \"none\")");
  if (c.sync.exchange != comm::Encoding::kFp32) refuse("sends fp32 outer gradients for now: set sync.exchange = \"fp32\"");
  if (c.sync.drop_probability > 0) refuse("does not run the dropped-gradient experiment: set sync.drop_probability = 0");
  if (c.outer.optimizer != optim::OuterKind::kNesterov) refuse("steps with delayed Nesterov: set outer.optimizer = \"nesterov\"");
}

}  // namespace

void validate(const RunConfig& c) {
  auto fields = keys::table(const_cast<RunConfig&>(c));
  for (const auto& f : fields) {
    if (const auto* i = std::get_if<int64_t*>(&f.value)) check_range(f, static_cast<double>(**i));
    if (const auto* d = std::get_if<double*>(&f.value)) check_range(f, **d);
  }
  // -1 is the marker of the optimizer's default; any other negative would be read as it.
  if (c.outer.momentum < 0 && c.outer.momentum != -1) {
    throw ConfigError("config", fmt::format("outer.momentum must be in [0, 1), or -1 for the optimizer's default; got {}",
                                            c.outer.momentum));
  }
  if (c.model.width % c.model.heads != 0) {
    throw ConfigError("config", fmt::format("model.heads ({}) must divide model.width ({})", c.model.heads, c.model.width));
  }
  if (c.model.position == model::PositionKind::kRope && c.model.head_dim() % 2 != 0) {
    throw ConfigError("config", fmt::format("model.position = \"rope\" needs an even head dimension; "
                                            "model.width / model.heads = {}", c.model.head_dim()));
  }
  if (c.run.dir.empty()) throw ConfigError("config", "run.dir must not be empty");
  if (c.cluster.tls_cert.empty() != c.cluster.tls_key.empty()) {
    throw ConfigError("config", "cluster.tls_cert and cluster.tls_key go together: set both (HTTPS) or neither (HTTP)");
  }
  if (c.data.dir.empty()) throw ConfigError("config", "data.dir must not be empty");
  // A DiPaCo run's workers share its modules through tasks (sync.inner_steps is H; no other sync.* key applies).
  if (c.sync.algorithm == Algorithm::kNone && c.cluster.workers > 1 && c.dipaco.levels.empty()) {
    throw ConfigError("config", fmt::format("cluster.workers = {} needs a sync.algorithm (ddp, diloco, streaming or local), "
                                            "not none", c.cluster.workers));
  }
  if (c.sync.algorithm == Algorithm::kStreaming) {
    if (c.sync.fragments > c.model.layers) {
      throw ConfigError("config", fmt::format("sync.fragments = {} exceeds model.layers = {}: each fragment needs a block",
                                              c.sync.fragments, c.model.layers));
    }
    streaming_options(c).validate();
  }
  path_options(c).validate(c.model.layers);
  if (c.dipaco.early_stopping && c.dipaco.keep_every == 0) {
    throw ConfigError("config", "dipaco.early_stopping picks among the versions each module keeps: set dipaco.keep_every "
                                "(e.g. 5: versions 0, 5, 10, ... and the last)");
  }
  if (c.sync.bucket_mb * 1e6 < 4) throw ConfigError("config", "sync.bucket_mb must hold at least one number");
  if (c.cluster.workers > 1 && c.checkpoint.keep < 2) {
    throw ConfigError("config", "checkpoint.keep must be >= 2 with several workers: a worker that dies loses its newest "
                                "checkpoint in the making, and the others must still hold the one before");
  }
  check_screening(c);
  if (c.sync.eager) {
    if (c.sync.algorithm != Algorithm::kDiLoCo && c.sync.algorithm != Algorithm::kStreaming) {
      throw ConfigError("config", fmt::format("sync.eager (eager outer updates) is for sync.algorithm = \"diloco\" or "
                                              "\"streaming\", got \"{}\"", to_string(c.sync.algorithm)));
    }
    if (c.sync.algorithm == Algorithm::kDiLoCo) diloco_options(c).as_streaming().validate();
  }
  if (c.sync.async) check_async(c);
  if (c.train.emulated_step_s > 0 && !c.dipaco.levels.empty()) {
    throw ConfigError("config", "train.emulated_step_s (emulated compute) is not for DiPaCo runs (dipaco.levels)");
  }
  if (c.sync.round_seconds > 0 && !c.cluster.elastic) {
    throw ConfigError("config", "sync.round_seconds (time-budgeted rounds) needs cluster.elastic = true: the coordinator "
                                "convenes each round and leaves out a worker that is too late");
  }
  if (c.cluster.elastic) {
    if (c.sync.algorithm != Algorithm::kDiLoCo && c.sync.algorithm != Algorithm::kStreaming) {
      throw ConfigError("config", fmt::format("cluster.elastic = true needs sync.algorithm = \"diloco\" or \"streaming\" "
                                              "(this version; got \"{}\"): set cluster.elastic = false for fixed membership",
                                              to_string(c.sync.algorithm)));
    }
    if (c.sync.algorithm == Algorithm::kStreaming && c.sync.round_seconds > 0) {
      throw ConfigError("config", "sync.round_seconds (time-budgeted rounds) is for sync.algorithm = \"diloco\"");
    }
    if (c.sync.algorithm == Algorithm::kStreaming && c.sync.overlap_steps * c.sync.fragments >= c.sync.inner_steps) {
      throw ConfigError("config", fmt::format("elastic Streaming DiLoCo needs sync.overlap_steps * sync.fragments < "
                                              "sync.inner_steps (one fragment on the wire at a time), got {} * {} >= {}",
                                              c.sync.overlap_steps, c.sync.fragments, c.sync.inner_steps));
    }
    if (c.sync.round_seconds > 0 && weighting(c) != algorithms::Weighting::kTokens) {
      throw ConfigError("config", "sync.round_seconds (time-budgeted rounds) needs sync.weighting = \"tokens\": workers take "
                                  "different numbers of steps, and their outer gradients must count by the tokens they saw");
    }
    if (c.cluster.min_workers > c.cluster.workers) {
      throw ConfigError("config", fmt::format("cluster.min_workers = {} exceeds cluster.workers = {}", c.cluster.min_workers,
                                              c.cluster.workers));
    }
    if (c.cluster.dead_after_s < 2 * c.cluster.heartbeat_s) {
      throw ConfigError("config", fmt::format("cluster.dead_after_s = {:g} must be at least twice cluster.heartbeat_s = {:g}: "
                                              "one late heartbeat must not declare a worker failed",
                                              c.cluster.dead_after_s, c.cluster.heartbeat_s));
    }
  }
  const auto& d = c.train.device;
  if (d != "auto" && d != "cpu" && d != "cuda" && !d.starts_with("cuda:")) {
    throw ConfigError("config", fmt::format("train.device must be auto, cpu, cuda or cuda:N, got '{}'", d));
  }
}

std::string to_toml(const RunConfig& config) {
  auto fields = keys::table(const_cast<RunConfig&>(config));
  toml::table root;
  for (const auto& f : fields) {
    if (f.secret) continue;
    const auto dot = f.key.find('.');
    const std::string section = f.key.substr(0, dot), key = f.key.substr(dot + 1);
    if (!root.contains(section)) root.insert(section, toml::table{});
    auto& table = *root[section].as_table();
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, EnumField>) table.insert(key, v.get());
          else table.insert(key, *v);
        },
        f.value);
  }
  std::ostringstream out;
  out << root << "\n";
  return out.str();
}

std::vector<std::string> differences(const RunConfig& a, const RunConfig& b, const std::vector<std::string>& prefixes) {
  auto fa = keys::table(const_cast<RunConfig&>(a));
  auto fb = keys::table(const_cast<RunConfig&>(b));
  std::vector<std::string> out;
  for (size_t i = 0; i < fa.size(); ++i) {
    const bool selected = prefixes.empty() || std::any_of(prefixes.begin(), prefixes.end(),
                                                          [&](const std::string& p) { return fa[i].key.starts_with(p); });
    const std::string va = value_text(fa[i].value), vb = value_text(fb[i].value);
    if (!selected || va == vb) continue;
    if (fa[i].secret) {
      out.push_back(fmt::format("{}: differs (not shown)", fa[i].key));
    } else {
      out.push_back(fmt::format("{}: {} -> {}", fa[i].key, va, vb));
    }
  }
  return out;
}

std::vector<std::string> differences_except(const RunConfig& a, const RunConfig& b, const std::vector<std::string>& excluded) {
  std::vector<std::string> out;
  for (auto& line : differences(a, b)) {
    const bool skip = std::any_of(excluded.begin(), excluded.end(), [&](const std::string& p) { return line.starts_with(p); });
    if (!skip) out.push_back(std::move(line));
  }
  return out;
}

std::string reference_markdown() {
  RunConfig defaults;
  auto fields = keys::table(defaults);
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& f : fields) {
    std::string type = type_name(f.value);
    if (const auto* e = std::get_if<EnumField>(&f.value)) type = fmt::format("{}", fmt::join(e->names, " \\| "));
    std::string value = value_text(f.value);
    if (std::holds_alternative<std::string*>(f.value) || std::holds_alternative<EnumField>(f.value)) value = "\"" + value + "\"";
    out += fmt::format("| `{}` | {} | `{}` | {} |\n", f.key, type, value, f.help);
  }
  return out;
}

}  // namespace loco::runtime
