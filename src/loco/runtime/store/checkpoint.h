// Checkpoints: everything needed to continue a run bit-exactly.
//
//   RUN/checkpoints/step-00000500/
//       model.safetensors      weights by parameter name (readable by Python's safetensors)
//       optimizer.safetensors  AdamW moments "<param>.exp_avg" / ".exp_avg_sq"
//       sync.safetensors       the sync strategy's state (empty for a single process)
//       state.json             step, tokens, data position, seed, the resolved config, the
//                              tokenizer hash, size + XXH3-64 of each file above, and (elastic
//                              runs) the run's section: rounds completed and every shard's position
//   RUN/checkpoints/latest     name of the newest complete checkpoint
//
// A checkpoint is written into a temporary folder and renamed into place, then `latest` is
// replaced atomically: a crash at any moment leaves the previous checkpoint intact and loadable.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "loco/data/batcher.h"
#include "loco/runtime/store/safetensors.h"

namespace loco::runtime {

namespace fs = std::filesystem;

// The run's own section of a checkpoint (elastic runs): the rounds completed and where every slot's
// shard stands as of the last one. The runtime writes it (the coordinator's plan says it); a sync
// strategy's state never carries data positions.
struct RunProgress {
  int64_t rounds = 0;
  std::vector<data::SamplerPosition> shards;  // by slot
};

struct TrainingState {
  int64_t step = 0;     // optimizer steps completed
  int64_t tokens = 0;   // training tokens consumed
  data::SamplerPosition sampler;
  int64_t seed = 0;
  uint64_t tokenizer_hash = 0;
  std::string config_toml;  // the resolved run config
  double wall_s = 0;        // training wall time so far
  // XXH3-64 of the global parameters θ as of the last synchronization (0 without one, e.g. a
  // single process): workers resuming together pick checkpoints that agree on it.
  uint64_t global_hash = 0;
  std::optional<RunProgress> run;
  // A fixed run's worker that held no checkpoint on resume got this copy of another's (that rank):
  // its data position is then not the one saved, but its own shard's at `step`.
  std::optional<int64_t> copied_from;
  // The positions the model was made for, where it came from a Hugging Face folder or a checkpoint
  // that says (its max_position_embeddings), written back by an export; 0: none said.
  int64_t max_positions = 0;
};

struct Checkpoint {
  fs::path dir;
  TrainingState state;
  NamedTensors model, optimizer, sync;
};

class CheckpointStore {
 public:
  // `root` is RUN/checkpoints. Keeps the `keep` most recent checkpoints.
  CheckpointStore(fs::path root, int64_t keep);

  // Writes a complete checkpoint and points `latest` at it; then, when `prune`, removes
  // checkpoints beyond `keep`. (A checkpoint taken because the run stops does not prune: the
  // older ones may be what the other workers can resume with.) Throws Error naming the file on I/O
  // failure (a full disk included); the previous checkpoint stays intact in that case.
  fs::path save(const TrainingState& state, const NamedTensors& model, const NamedTensors& optimizer,
                const NamedTensors& sync, bool prune = true) const;

  // The folder `latest` names, if any.
  std::optional<fs::path> latest() const;
  // Steps of the complete checkpoints present, oldest first.
  std::vector<int64_t> steps() const;
  // The folder of the checkpoint of `step` (which may not exist).
  fs::path at(int64_t step) const;
  // Keeps the checkpoint of `step` from being pruned (the one an elastic run's coordinator told its
  // members to continue from: a member it had given up on may still save and prune), until
  // another is pinned or `unpin`. The pin is a file, `pinned`, beside `latest`.
  void pin(int64_t step) const;
  void unpin() const;
  const fs::path& root() const { return root_; }

 private:
  std::string pinned_name() const;

  fs::path root_;
  int64_t keep_;
};

// Loads and verifies a checkpoint. `path` is a checkpoint folder, a run's checkpoints/ folder or a
// run folder (the latter two mean its latest checkpoint). Throws DataError naming the file for a
// missing file, a size or checksum mismatch, or malformed state.json.
Checkpoint load_checkpoint(const fs::path& path);

// A checkpoint as one message and back (a fixed run's copy to a worker that holds none): its parts'
// tensors and its state in one safetensors buffer. decode_checkpoint verifies as decode_safetensors
// does and throws DataError naming `where`.
std::string encode_checkpoint(const Checkpoint& checkpoint);
Checkpoint decode_checkpoint(const std::string& bytes, const std::string& where);

// Resolves `path` as load_checkpoint does, without loading. A run folder means RUN/checkpoints
// (one process) or, for a multi-worker run, worker 0's RUN/workers/0/checkpoints.
fs::path resolve_checkpoint_dir(const fs::path& path);

// The parameters to evaluate or sample from: the global θ ("global.<name>" in the sync state, as
// DiLoCo saves it) when there is one, else the model's weights.
NamedTensors inference_weights(const Checkpoint& checkpoint);

}  // namespace loco::runtime
