// Shared by the algorithm tests: a tiny model, Gloo groups of ranks as threads, fixed batches and
// one real AdamW inner step.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/rank_threads.h"
#include "loco/comm/group.h"
#include "loco/model/transformer.h"
#include "loco/optim/adamw.h"

namespace loco::algorithms {

inline model::ModelOptions tiny_model(int64_t layers = 2) {
  model::ModelOptions o;
  o.vocab_size = 50;
  o.context = 8;
  o.layers = layers;
  o.width = 16;
  o.heads = 2;
  return o;
}

inline comm::Group connect(const std::shared_ptr<comm::KeyValueStore>& store, int64_t rank, int64_t size,
                           const std::string& prefix) {
  comm::GroupOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = std::chrono::seconds(20);
  o.prefix = prefix;
  return comm::Group::connect(store, o);
}

inline std::vector<torch::Tensor> snapshot(const model::Transformer& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

// Batch `index` of a fixed random stream: (tokens (B, T+1)) for rank-independent reproducibility.
inline torch::Tensor batch(int64_t index, int64_t size) {
  auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + index));
  return torch::randint(0, 50, {size, 9}, generator, torch::kInt64);
}

inline double train_step(model::Transformer& model, optim::AdamW& adamw, const torch::Tensor& tokens) {
  adamw.zero_grad();
  auto logits = model->forward(tokens.narrow(1, 0, 8));
  auto loss = model::language_model_loss(logits, tokens.narrow(1, 1, 8), 0).loss;
  loss.backward();
  return loss.item<double>();
}

inline optim::AdamW make_adamw(model::Transformer& model) {
  std::vector<optim::NamedParameter> named;
  for (const auto& item : model->named_parameters()) named.push_back({item.key(), item.value(), item.value().dim() >= 2});
  return optim::AdamW(std::move(named), optim::AdamWOptions{});
}

}  // namespace loco::algorithms
