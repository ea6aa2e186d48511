// `loco route`: DiPaCo's routing of the training documents to paths, decided once before training
// (docs/dipaco.md, "Routing"). Each document's feature is the initial model's (embed_documents);
// balanced k-means (dipaco.routing = "kmeans", k = the plan's paths) or product k-means ("product",
// k² = paths) assigns the paths. Written to RUN/routing/ (never over an earlier routing):
//   router.safetensors   the centres ("centres.<part>") with the plan's fingerprint, the routing
//                        kind and the dataset's tokenizer hash in the metadata
//   paths.json           per path: its documents (indices into the training split) and tokens
//   clusters.md          paths against the corpus's labels (Brown's genres): what the router learned
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "loco/runtime/config/config.h"

namespace loco::runtime {

struct RouteSummary {
  std::filesystem::path dir;          // RUN/routing
  std::vector<int64_t> documents;     // per path
  std::vector<int64_t> tokens;        // per path
  std::string table;                  // clusters.md's text
};

// Which model's features a routing reads (recorded with it, checked when it routes again):
// "the model in RUN" (train.init_from) or "the random initialization of seed N".
std::string features_model(const RunConfig& config);

// Whether training document `document` is one of the router's held-out documents (discriminative
// re-routing): a share `fraction` of them, chosen by a hash of (train.seed, document).
bool held_out_for_router(uint64_t seed, int64_t document, double fraction);

// Throws ConfigError without dipaco.levels or with product routing of a non-square path count,
// DataError for a run folder that already holds a routing, a dataset with fewer documents than
// paths, or files that cannot be written.
RouteSummary route_documents(const RunConfig& config);

}  // namespace loco::runtime
