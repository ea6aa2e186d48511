// Emulated compute (train.emulated_step_s > 0): a worker whose inner steps take a stated time
// instead of running the model, so that one small machine can measure what links, codecs, the
// all-reduce and the outer step do at model scale (docs/slow-links.md, "At model scale").
//
// Everything but the forward and backward passes is real. The model is built at its configured
// size; a step waits until its stated time has passed, then moves parameters by the learning rate
// along a fixed direction of this worker's: a tile of 2^20 standard normal values (drawn from the
// run's seed and the worker's rank) repeated over the parameters, about the size of AdamW's
// normalized step. Outer gradients are so dense, of the model's size and different on every
// worker; a tile rather than a direction per parameter keeps 8 islands of a 100M-parameter model
// within this machine's memory.
//
// Each step moves one of kRotation interleaved parts of the parameters (tile-sized pieces i with
// i mod kRotation = step mod kRotation) by the learning rates of every step since that part last
// moved: every parameter moves every kRotation steps by exactly the sum of their learning rates,
// so that after H steps it has moved as far as H steps of lr would take it, give or take the last
// kRotation − 1 steps' worth. Moving all of a 100M-parameter model at each step would take 8
// workers 1.5 of this machine's 2 cores (an axpy of 420 MB, ~95 ms a step each), CPU that a GPU
// island spends in microseconds and that would be taken from the communication measured here.
//
// With DDP the direction is written into the gradients, which DDP averages, and the step follows
// their average. Such a step has no loss: an emulated run reports none and evaluates nothing. A
// fixed run saves no checkpoint; an elastic one saves its rounds' state as with real compute, for
// its restarts (the rotation's pending learning rates are not saved: a restart begins it anew).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "loco/model/transformer_fwd.h"

namespace loco::runtime {

class EmulatedCompute {
 public:
  static constexpr int64_t kTile = int64_t{1} << 20;
  static constexpr int64_t kRotation = 8;

  // `model` must outlive this. `gradients`: the direction is written into the parameters'
  // gradients (for a sync strategy that reads them: DDP), and each step follows the gradients.
  EmulatedCompute(model::Transformer& model, double step_s, uint64_t seed, bool gradients);

  // The step's compute: sleeps `step_s` less what the previous update took, so that a step's
  // compute and update together take `step_s` when the machine keeps up.
  void forward_backward();
  // Step `lr`: the part of the parameters due this step moved along the direction (or its
  // gradient) by this and the earlier learning rates not yet applied to it.
  void update(double lr);

  double step_s() const { return step_s_; }

 private:
  // The parameters (or their gradients, with DDP) in tile-sized pieces, flat.
  struct Piece {
    torch::Tensor parameter, gradient;
  };
  std::vector<Piece> pieces_;
  std::vector<double> pending_lr_ = std::vector<double>(kRotation, 0.0);  // per part, not yet applied
  int64_t steps_ = 0;
  torch::Tensor tile_;
  bool gradients_;
  double step_s_;
  double update_s_ = 0;  // what the last update took
};

}  // namespace loco::runtime
