// DiPaCo's modular model (Douillard et al. 2024, arXiv 2403.10616, section 2;
// docs/dipaco.md): the blocks of a base transformer are grouped into levels, each level holds
// alternative parameter sets (modules), and a path picks one module per level. A path is an
// ordinary Transformer of the base shape; a module is a named set of its parameter groups
// (TransformerImpl::parameter_groups(): "embed", "block.<i>", "head"), and no process ever needs
// more than the modules of the path it trains.
//
//   level kinds    K modules, chosen by the path  (K ≥ 2: the path's choice at that level)
//                  1 module,  shared by every path
//                  path-specific: one module per path, never shared
//   paths          P = Π K over the chosen levels; path p's choices are p's digits in the mixed
//                  radix of those K, the first level most significant
//   embed level    the token (and learned position) embeddings and the final norm: one module
//                  shared by every path (default), or path-specific
//
// Written in the config as dipaco.levels, one "BLOCKS:MODULES" per level in block order, MODULES a
// count or "path":   "2:2,2:2"          2 levels of 2 blocks, 2 modules each: 4 paths
//                    "6:16,6:16"        the paper's 16x16 on a 12-block model: 256 paths
//                    "5:16,5:16,2:path" ... with the last 2 blocks path-specific
// Only plain data here: counts come from the model's closed form, so that planning a 16x16 model
// of 150M-parameter paths allocates nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loco/model/options.h"

namespace loco::model {

class Transformer;      // transformer.h
struct ParameterGroup;  // transformer.h

struct LevelSpec {
  int64_t blocks = 1;          // consecutive blocks the level spans
  int64_t modules = 1;         // K (ignored when path_specific)
  bool path_specific = false;  // one module per path
  bool operator==(const LevelSpec&) const = default;
};

struct PathOptions {
  std::vector<LevelSpec> levels;     // in block order; empty: not a modular model
  bool embed_path_specific = false;  // the embed level: shared (false) or one module per path

  // "2:2,2:2" (see above); "" gives no levels. Throws ConfigError("[dipaco] ...") naming the bad part.
  static std::vector<LevelSpec> parse_levels(const std::string& text);
  static std::string format_levels(const std::vector<LevelSpec>& levels);
  bool enabled() const { return !levels.empty(); }
  // The levels must cover blocks 0 .. layers − 1 exactly, and P stay at most kMaxPaths.
  // Throws ConfigError naming what is wrong.
  void validate(int64_t layers) const;
};

inline constexpr int64_t kMaxPaths = 65536;

// One module: a set of parameter groups with its own global copy and outer optimizer state.
struct Module {
  std::string name;                 // "embed", "L<l>.M<k>" (chosen or shared), "L<l>.P<p>" (path-specific), "embed.P<p>"
  int64_t level = 0;                // 0 = the embed level, l = 1 .. L for the block levels
  std::vector<std::string> groups;  // parameter group names it holds, in the model's order
  std::vector<int64_t> paths;       // the paths through it, ascending
  int64_t parameters = 0;
};

class PathPlan {
 public:
  // Throws ConfigError when `options` does not fit `model` (see PathOptions::validate).
  PathPlan(const ModelOptions& model, PathOptions options);

  int64_t paths() const { return paths_; }
  int64_t levels() const { return static_cast<int64_t>(options_.levels.size()); }  // block levels
  const std::vector<Module>& modules() const { return modules_; }
  const Module& module(int64_t index) const;
  // The modules of path p, one per level, the embed level first: indices into modules().
  const std::vector<int64_t>& modules_of(int64_t path) const;
  // Index into modules() of the module named `name`; throws DataError when there is none.
  int64_t find(const std::string& name) const;

  int64_t path_parameters() const { return path_parameters_; }    // every path has the base shape
  int64_t total_parameters() const { return total_parameters_; }  // every module once
  // A Markdown table of the levels and their modules with counts, for `loco plan`.
  std::string describe() const;
  // What a module file records to be matched with its plan: the levels, the embed level's kind
  // and the base model's shape. A module saved under another plan or model is refused.
  std::string fingerprint() const;

 private:
  ModelOptions model_;
  PathOptions options_;
  int64_t paths_ = 1;
  std::vector<Module> modules_;
  std::vector<std::vector<int64_t>> path_modules_;
  int64_t path_parameters_ = 0, total_parameters_ = 0;
};

// The parameters of `module` in a path model (a Transformer of the plan's base shape): its groups'
// names and live tensors, in the model's order. Loading a path is copying each of its modules in.
ParameterGroup module_parameters(const Transformer& path_model, const Module& module);

}  // namespace loco::model
