// The model's weights in and out of checkpoints, and scoring it: what the training loop, `loco
// eval` and `loco generate` share.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loco/data/batcher.h"
#include "loco/model/transformer_fwd.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/store/checkpoint.h"
#include "loco/runtime/store/safetensors.h"

namespace loco::runtime {

struct EvalResult {
  double loss = 0;  // mean cross entropy, nats/token
  double ppl = 0;
  int64_t tokens = 0;
};

// Mean loss of `model` over `batches` (no gradients; the model's training mode is restored).
EvalResult evaluate(model::Transformer& model, const std::vector<data::Batch>& batches, const torch::Device& device);
// Scores `parameters` (the global θ, in the model's order) in place of the model's own, which are
// put back afterwards.
EvalResult evaluate_parameters(model::Transformer& model, const std::vector<torch::Tensor>& parameters,
                               const std::vector<data::Batch>& batches, const torch::Device& device);

// Loads the parameters of `train.init_from` (a checkpoint or run folder; its global parameters
// when it has them) into `model`. Returns the positions the model was made for, to be carried to
// an export (a Hugging Face folder's max_position_embeddings, a checkpoint's max_positions; 0:
// none said). Throws DataError when the shapes or the tokenizer differ.
int64_t load_initial_weights(model::Transformer& model, const RunConfig& config, uint64_t tokenizer_hash);

// The model described by `config` (vocab_size already resolved), initialized from train.seed.
model::Transformer build_model(const RunConfig& config);
// The model's parameters by name, for checkpoints.
NamedTensors model_weights(const model::Transformer& model);
// Copies `weights` into the model; throws DataError naming a missing, extra or misshapen tensor.
void load_model_weights(model::Transformer& model, const NamedTensors& weights, const std::string& where);

// Throws DataError unless `tokenizer_hash` (of `what`: a dataset, a tokenizer file) is the one the
// checkpoint was trained with, hinting at --data.
void check_same_tokenizer(uint64_t tokenizer_hash, const std::string& what, const Checkpoint& checkpoint);

// Sets torch's intra-op threads: `threads`, or (0) the cores divided among the local processes
// (environment LOCO_LOCAL_PROCESSES, default 1). Returns the count set.
int64_t configure_threads(int64_t threads);

}  // namespace loco::runtime
