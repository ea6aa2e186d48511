#include "loco/model/paths.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "loco/core/error.h"

namespace loco::model {
namespace {

std::string trimmed(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

int64_t positive_integer(const std::string& text, const std::string& what, const std::string& level) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 1) {
    throw ConfigError("dipaco", fmt::format("dipaco.levels: level \"{}\": {} must be a positive integer, got \"{}\" "
                                            "(each level is BLOCKS:MODULES, e.g. \"2:2,2:2\")", level, what, text));
  }
  return value;
}

// 1,234,567: parameter counts a person can read.
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string block_range(int64_t first, int64_t count) {
  return count == 1 ? fmt::format("{}", first) : fmt::format("{}-{}", first, first + count - 1);
}

}  // namespace

std::vector<LevelSpec> PathOptions::parse_levels(const std::string& text) {
  std::vector<LevelSpec> levels;
  if (trimmed(text).empty()) return levels;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string level = trimmed(text.substr(begin, end - begin));
    const size_t colon = level.find(':');
    if (colon == std::string::npos) {
      throw ConfigError("dipaco", fmt::format("dipaco.levels: level \"{}\" is not BLOCKS:MODULES (e.g. \"2:2,2:2\"; "
                                              "MODULES may be \"path\" for path-specific blocks)", level));
    }
    LevelSpec spec;
    spec.blocks = positive_integer(trimmed(level.substr(0, colon)), "BLOCKS", level);
    const std::string modules = trimmed(level.substr(colon + 1));
    if (modules == "path") {
      spec.path_specific = true;
    } else {
      spec.modules = positive_integer(modules, "MODULES", level);
    }
    levels.push_back(spec);
    begin = end + 1;
  }
  return levels;
}

std::string PathOptions::format_levels(const std::vector<LevelSpec>& levels) {
  std::string out;
  for (const auto& level : levels) {
    if (!out.empty()) out += ',';
    out += level.path_specific ? fmt::format("{}:path", level.blocks) : fmt::format("{}:{}", level.blocks, level.modules);
  }
  return out;
}

void PathOptions::validate(int64_t layers) const {
  if (!enabled()) return;
  int64_t blocks = 0, paths = 1;
  for (const auto& level : levels) {
    if (level.blocks > layers - blocks) {  // (compared, not summed: huge counts must not overflow)
      throw ConfigError("dipaco", fmt::format("dipaco.levels \"{}\" spans more blocks than the model's {} (model.layers): "
                                              "the levels must cover every block exactly once, in order",
                                              format_levels(levels), layers));
    }
    blocks += level.blocks;
    if (!level.path_specific && level.modules > 1) {
      if (paths > kMaxPaths / level.modules) {
        throw ConfigError("dipaco", fmt::format("dipaco.levels \"{}\" makes more than {} paths", format_levels(levels), kMaxPaths));
      }
      paths *= level.modules;
    }
  }
  if (blocks != layers) {
    throw ConfigError("dipaco", fmt::format("dipaco.levels \"{}\" spans {} blocks but the model has {} (model.layers): "
                                            "the levels must cover every block exactly once, in order",
                                            format_levels(levels), blocks, layers));
  }
  if (paths < 2) {
    throw ConfigError("dipaco", fmt::format("dipaco.levels \"{}\" makes a single path: give some level 2 or more modules "
                                            "(a dense model is sync.algorithm = diloco without dipaco.levels)",
                                            format_levels(levels)));
  }
}

PathPlan::PathPlan(const ModelOptions& model, PathOptions options) : model_(model), options_(std::move(options)) {
  options_.validate(model_.layers);
  LOCO_CHECK(options_.enabled(), "a path plan needs dipaco.levels");
  // Per-block and outside-the-blocks counts from the closed form, which is linear in the layers.
  ModelOptions one = model_, two = model_;
  one.layers = 1, two.layers = 2;
  const int64_t per_block = parameter_count(two) - parameter_count(one);
  const int64_t outside = parameter_count(one) - per_block;
  for (const auto& level : options_.levels) {
    if (!level.path_specific) paths_ *= level.modules;
  }
  path_modules_.assign(static_cast<size_t>(paths_), {});
  std::vector<int64_t> all_paths(static_cast<size_t>(paths_));
  for (int64_t p = 0; p < paths_; ++p) all_paths[static_cast<size_t>(p)] = p;

  auto add = [&](Module module, const std::vector<int64_t>& through) {
    module.paths = through;
    for (int64_t p : through) path_modules_[static_cast<size_t>(p)].push_back(static_cast<int64_t>(modules_.size()));
    total_parameters_ += module.parameters;
    modules_.push_back(std::move(module));
  };
  // The embed level: the embeddings and the final norm.
  if (options_.embed_path_specific) {
    for (int64_t p = 0; p < paths_; ++p) add({fmt::format("embed.P{}", p), 0, {"embed", "head"}, {}, outside}, {p});
  } else {
    add({"embed", 0, {"embed", "head"}, {}, outside}, all_paths);
  }
  // Block levels. `radix` is the product of the K of the chosen levels after this one, so that
  // path p's choice at a chosen level is (p / radix) mod K.
  int64_t radix = paths_, first_block = 0;
  for (size_t l = 0; l < options_.levels.size(); ++l) {
    const auto& level = options_.levels[l];
    const auto number = static_cast<int64_t>(l + 1);
    std::vector<std::string> groups;
    for (int64_t b = first_block; b < first_block + level.blocks; ++b) groups.push_back(fmt::format("block.{}", b));
    const int64_t parameters = level.blocks * per_block;
    if (level.path_specific) {
      for (int64_t p = 0; p < paths_; ++p) add({fmt::format("L{}.P{}", number, p), number, groups, {}, parameters}, {p});
    } else {
      radix /= level.modules;
      for (int64_t k = 0; k < level.modules; ++k) {
        std::vector<int64_t> through;
        for (int64_t p = 0; p < paths_; ++p) {
          if ((p / radix) % level.modules == k) through.push_back(p);
        }
        add({fmt::format("L{}.M{}", number, k), number, groups, {}, parameters}, through);
      }
    }
    first_block += level.blocks;
  }
  path_parameters_ = parameter_count(model_);
}

const Module& PathPlan::module(int64_t index) const {
  LOCO_CHECK(index >= 0 && index < static_cast<int64_t>(modules_.size()), "module {} of {}", index, modules_.size());
  return modules_[static_cast<size_t>(index)];
}

const std::vector<int64_t>& PathPlan::modules_of(int64_t path) const {
  LOCO_CHECK(path >= 0 && path < paths_, "path {} of {}", path, paths_);
  return path_modules_[static_cast<size_t>(path)];
}

int64_t PathPlan::find(const std::string& name) const {
  for (size_t i = 0; i < modules_.size(); ++i) {
    if (modules_[i].name == name) return static_cast<int64_t>(i);
  }
  throw DataError("dipaco", fmt::format("no module named '{}' in this plan (levels \"{}\", {} modules)", name,
                                        PathOptions::format_levels(options_.levels), modules_.size()));
}

std::string PathPlan::fingerprint() const {
  auto print = fmt::format("levels={};embed={};vocab={};context={};layers={};width={};heads={};mlp_ratio={};norm={};"
                           "position={};mlp={};qk_norm={}",
                           PathOptions::format_levels(options_.levels), options_.embed_path_specific ? "path" : "shared",
                           model_.vocab_size, model_.context, model_.layers, model_.width, model_.heads, model_.mlp_ratio,
                           to_string(model_.norm), to_string(model_.position), to_string(model_.mlp), model_.qk_norm);
  // Later options only where they are not their defaults, so that earlier runs keep their fingerprint.
  if (model_.kv_heads > 0) print += fmt::format(";kv_heads={}", model_.kv_heads);
  if (model_.mlp_hidden_size > 0) print += fmt::format(";mlp_hidden={}", model_.mlp_hidden_size);
  if (!model_.tie_embeddings) print += ";tie_embeddings=false";
  if (model_.attention_bias) print += ";attention_bias=true";
  return print;
}

std::string PathPlan::describe() const {
  std::string out = fmt::format("DiPaCo plan: levels \"{}\", embeddings {}, {} paths, {} modules\n\n",
                                PathOptions::format_levels(options_.levels),
                                options_.embed_path_specific ? "path-specific" : "shared", paths_, modules_.size());
  out += "| level | holds | kind | modules | parameters per module | paths through each |\n|---|---|---|---|---|---|\n";
  auto row = [&](const std::string& level, const std::string& holds, int64_t first_module, int64_t count) {
    const auto& m = modules_[static_cast<size_t>(first_module)];
    const std::string kind = m.paths.size() == static_cast<size_t>(paths_) ? "shared"
                             : m.paths.size() == 1                           ? "path-specific"
                                                                              : "chosen";
    out += fmt::format("| {} | {} | {} | {} | {} | {} |\n", level, holds, kind, count, grouped(m.parameters), m.paths.size());
  };
  const int64_t embed_modules = options_.embed_path_specific ? paths_ : 1;
  row("embed", "embeddings, final norm (and an untied head)", 0, embed_modules);
  int64_t next = embed_modules, first_block = 0;
  for (size_t l = 0; l < options_.levels.size(); ++l) {
    const auto& level = options_.levels[l];
    const int64_t count = level.path_specific ? paths_ : level.modules;
    row(fmt::format("{}", l + 1), fmt::format("blocks {}", block_range(first_block, level.blocks)), next, count);
    next += count;
    first_block += level.blocks;
  }
  out += fmt::format("\nparameters: {} per path (what a worker holds and inference runs), {} in all modules together "
                     "(never in one place; {:.1f}x a path)\n",
                     grouped(path_parameters_), grouped(total_parameters_),
                     static_cast<double>(total_parameters_) / static_cast<double>(path_parameters_));
  return out;
}

}  // namespace loco::model
