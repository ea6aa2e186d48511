// A checkpoint's model, loaded for `loco eval`, `loco generate` and `loco export` (implemented in
// weights.cpp). Apart from weights.h because it holds the model by value, which needs all of
// model/transformer.h and so torch::nn; weights.h's users take the model by reference.
#pragma once

#include <torch/types.h>

#include <string>

#include "loco/model/transformer.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/store/checkpoint.h"

namespace loco::runtime {

// Its config (data.dir replaced by `data_dir` when given) and its weights (the global parameters
// when it holds them), on `device`, in evaluation mode. Throws DataError for a missing or corrupt
// checkpoint.
struct InferenceModel {
  Checkpoint checkpoint;
  RunConfig config;
  model::Transformer model{nullptr};
};
InferenceModel load_for_inference(const std::string& checkpoint, const std::string& data_dir, const torch::Device& device);

}  // namespace loco::runtime
