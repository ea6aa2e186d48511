// loco-bench train: the training loop's own overhead (data, logging, hooks, metrics) measured
// against a bare libtorch forward/backward/AdamW loop of the same model, in the same process, on
// the same batches. Also reports model FLOP utilization against a measured matmul peak (fp32 on
// the CPU, bf16 on a GPU) and, with --peak-tflops, against the device's published peak.
//
//   build/loco-bench --config configs/brown.toml [--steps 30] [--rounds 5] [--section.key=value ...]
//   build/loco-bench --config configs/gpt-small.toml --peak-tflops 989   # on a GPU: bf16 autocast
//
// After one unreported warm-up round of each, rounds alternate which loop goes first, so that a
// noisy machine affects both alike; the medians are reported. Target (docs/benchmarks.md): loco's
// loop within 3% of the bare loop. Config overrides take the --section.key=value form only.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loco/comm/group.h"
#include "loco/core/allocator.h"
#include "loco/core/error.h"
#include "loco/data/batcher.h"
#include "loco/model/transformer.h"
#include "loco/data/dataset.h"
#include "loco/model/precision.h"
#include "loco/runtime/config/config.h"
#include "loco/optim/adamw.h"
#include "loco/runtime/worker/inner_step.h"
#include "loco/runtime/worker/trainer.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Waits for the work queued on a GPU, so that a clock read after it counts that work.
void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// The model on the device and its AdamW, built as loco's step builds them, and the parameters
// that clipping takes.
struct Trainee {
  loco::model::Transformer model;
  loco::optim::AdamW adamw;
  std::vector<torch::Tensor> parameters;
};

Trainee trainee(const loco::runtime::RunConfig& config, const torch::Device& device) {
  auto model = loco::runtime::build_model(config);
  model->to(device);
  model->train();
  auto adamw = loco::runtime::make_inner_optimizer(model, config.optim.adamw);
  std::vector<torch::Tensor> parameters;
  for (const auto& p : adamw.parameters()) parameters.push_back(p.tensor);
  return {model, std::move(adamw), std::move(parameters)};
}

// Seconds per step of a bare loop: the same model, loss (runtime::training_loss: the head and
// cross entropy fused on a GPU, in bf16 autocast), clipping and AdamW as loco's step, with the batches already on the device
// and nothing read back until the end: what a loop around them adds (sampling, copies, reads,
// logging, hooks) is loco's overhead. Steps after `warmup` are timed.
double bare_loop(const loco::runtime::RunConfig& config, const std::vector<loco::data::Batch>& batches, int64_t warmup,
                 const torch::Device& device) {
  auto [model, adamw, parameters] = trainee(config, device);
  Clock::time_point start;
  torch::Tensor last_loss;
  for (size_t i = 0; i < batches.size(); ++i) {
    if (static_cast<int64_t>(i) == warmup) {
      synchronize(device);
      start = Clock::now();
    }
    adamw.zero_grad();
    loco::model::LossParts parts;
    {
      loco::model::AutocastGuard autocast(device, true);
      parts = loco::runtime::training_loss(model, batches[i].inputs, batches[i].targets, config.train.z_loss);
    }
    parts.loss.backward();
    loco::optim::clip_gradients(parameters, config.optim.grad_clip);
    adamw.step(config.optim.lr);
    last_loss = parts.cross_entropy;
  }
  (void)last_loss.item<double>();  // waits for the last step
  return std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(batches.size() - warmup);
}

// Seconds per step of loco's own loop, from the timestamps of its train events, which excludes
// setup and the final evaluation and checkpoint. Events every `warmup` steps (train.log_every):
// on a GPU, loco reads the steps' losses at each, so the loop's reads are counted too.
double loco_loop(loco::runtime::RunConfig config, const fs::path& run_dir, int64_t steps, int64_t warmup) {
  fs::remove_all(run_dir);
  config.run.dir = run_dir.string();
  config.train.steps = steps;
  config.train.log_every = warmup;
  config.eval.every = steps + 1;
  config.checkpoint.every = 0;
  loco::algorithms::NoSync sync;
  loco::runtime::TrainOptions options;
  options.out = fopen("/dev/null", "w");
  if (options.out == nullptr) throw loco::Error("bench", "cannot open /dev/null");
  loco::runtime::train(config, sync, options);
  fclose(options.out);
  std::map<int64_t, double> time_at;  // step -> seconds
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "train") time_at[j["step"].get<int64_t>()] = j["time"].get<double>();
  }
  if (!time_at.contains(warmup) || !time_at.contains(steps)) {
    throw loco::Error("bench", fmt::format("loco's run logged no train event at step {} or {}", warmup, steps));
  }
  return (time_at[steps] - time_at[warmup]) / static_cast<double>(steps - warmup);
}

// Where a bare step's time goes, each part timed alone (the device synchronized around it), as
// medians over the batches after `warmup`, in seconds: the blocks' forward, the head and loss
// with their gradients (fused, as training runs them, and plain: the logits, then cross entropy in
// float32), the blocks' backward, clipping and AdamW.
struct Phases {
  double forward = 0, head_fused = 0, head_plain = 0, backward = 0, update = 0;
};

Phases phases(const loco::runtime::RunConfig& config, const std::vector<loco::data::Batch>& batches, int64_t warmup,
              const torch::Device& device) {
  auto [model, adamw, parameters] = trainee(config, device);
  const auto& head = model->lm_head ? model->lm_head->weight : model->tok_emb->weight;
  std::vector<double> forward, fused, plain, backward, update;
  auto lap = [&](Clock::time_point& since) {
    synchronize(device);
    const auto now = Clock::now();
    const double s = std::chrono::duration<double>(now - since).count();
    since = now;
    return s;
  };
  for (size_t i = 0; i < batches.size(); ++i) {
    adamw.zero_grad();
    auto t = Clock::now();
    lap(t);
    torch::Tensor hidden;
    {
      loco::model::AutocastGuard autocast(device, true);
      hidden = model->hidden(batches[i].inputs);
    }
    const double f = lap(t);
    auto cut = hidden.detach().requires_grad_();
    {
      loco::model::AutocastGuard autocast(device, true);
      auto parts = loco::model::linear_cross_entropy(cut, head, batches[i].targets, config.train.z_loss);
      parts.loss.backward();
    }
    const double h = lap(t);
    hidden.backward(cut.grad());
    const double b = lap(t);
    loco::optim::clip_gradients(parameters, config.optim.grad_clip);
    adamw.step(config.optim.lr);
    const double u = lap(t);
    auto cut_plain = hidden.detach().requires_grad_();
    {
      loco::model::AutocastGuard autocast(device, true);
      auto logits = torch::nn::functional::linear(cut_plain, head);
      loco::model::language_model_loss(logits, batches[i].targets, config.train.z_loss).loss.backward();
    }
    const double p = lap(t);
    if (static_cast<int64_t>(i) < warmup) continue;
    forward.push_back(f);
    fused.push_back(h);
    backward.push_back(b);
    update.push_back(u);
    plain.push_back(p);
  }
  return {median(forward), median(fused), median(plain), median(backward), median(update)};
}

// Best of a few large matmuls: the device's practical FLOP/s, fp32 with these threads on the
// CPU, bf16 on a GPU (where training runs in bf16 autocast).
double matmul_peak(const torch::Device& device) {
  const int64_t n = device.is_cuda() ? 8192 : 1024;
  const auto options = torch::TensorOptions().device(device).dtype(device.is_cuda() ? torch::kBFloat16 : torch::kFloat32);
  auto a = torch::randn({n, n}, options), b = torch::randn({n, n}, options);
  const int repeats = device.is_cuda() ? 10 : 1;
  double best = 0;
  for (int i = 0; i < 6; ++i) {
    synchronize(device);
    auto start = Clock::now();
    for (int r = 0; r < repeats; ++r) auto c = torch::mm(a, b);
    synchronize(device);
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, repeats * 2.0 * static_cast<double>(n * n * n) / s);
  }
  return best;
}

struct Measured {
  std::vector<double> bare_s, loco_s;  // seconds per step of each round
};

// Alternating rounds of both loops after one unreported warm-up round of each (thread pools,
// allocator, page cache, CUDA kernels), so that the first measured loop does not pay for
// starting the process and drift in the machine's speed favours neither.
Measured measure(const loco::runtime::RunConfig& config, const std::vector<loco::data::Batch>& batches,
                 const torch::Device& device, const fs::path& work_dir, int64_t steps, int64_t warmup, int64_t rounds,
                 double tokens_per_step) {
  fmt::print("{:>6} {:>14} {:>14} {:>10}\n", "round", "bare tok/s", "loco tok/s", "overhead");
  bare_loop(config, batches, warmup, device);
  loco_loop(config, work_dir / "warm-up", steps, warmup);
  Measured m;
  for (int64_t r = 0; r < rounds; ++r) {
    const auto run_dir = work_dir / fmt::format("round-{}", r);
    if (r % 2 == 0) {
      m.bare_s.push_back(bare_loop(config, batches, warmup, device));
      m.loco_s.push_back(loco_loop(config, run_dir, steps, warmup));
    } else {
      m.loco_s.push_back(loco_loop(config, run_dir, steps, warmup));
      m.bare_s.push_back(bare_loop(config, batches, warmup, device));
    }
    fmt::print("{:>6} {:>14.0f} {:>14.0f} {:>9.1f}%\n", r + 1, tokens_per_step / m.bare_s.back(),
               tokens_per_step / m.loco_s.back(), 100.0 * (m.loco_s.back() / m.bare_s.back() - 1));
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  loco::keep_freed_memory();  // as `loco` does, so that both loops run as training does
  loco::report_crashes();
  loco::comm::turn_off_flight_recorder();  // as `loco` does (comm/group.h)
  CLI::App app{"loco-bench: training-loop overhead and model FLOP utilization", "loco-bench"};
  std::string config_file, json_file;
  int64_t steps = 30, warmup = 5, rounds = 5;
  double peak_tflops = 0;
  std::string work_dir = "runs/bench";
  app.add_option("--config", config_file, "TOML run config")->required();
  app.add_option("--steps", steps, "steps per measurement")->capture_default_str()->check(CLI::Range(10, 100000));
  app.add_option("--rounds", rounds, "alternating bare/loco rounds; medians are reported")->capture_default_str()->check(CLI::Range(1, 100));
  app.add_option("--work-dir", work_dir, "scratch run folder (removed and rewritten)")->capture_default_str();
  app.add_option("--peak-tflops", peak_tflops, "the device's published peak (e.g. 989 for an H100 or H200 in dense bf16): "
                 "MFU is reported against it too")->check(CLI::PositiveNumber);
  app.add_option("--json", json_file, "also write the results to this JSON file");
  app.allow_extras();
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<std::string> overrides;
    for (const auto& extra : app.remaining()) overrides.push_back(extra.starts_with("--") ? extra.substr(2) : extra);
    auto config = loco::runtime::load_config(config_file, overrides);
    const torch::Device device = loco::model::resolve_device(config.train.device);
    config.train.device = device.str();
    auto dataset = loco::data::Dataset::open(config.data.dir);
    if (config.model.vocab_size == 0) config.model.vocab_size = dataset.manifest().vocab_size;
    const int64_t threads = loco::runtime::configure_threads(config.train.threads);
    // The bare loop gets the same batches loco's sampler would draw, prepared in advance.
    loco::data::WindowSampler sampler(dataset.train().tokens, config.model.context, static_cast<uint64_t>(config.train.seed));
    std::vector<loco::data::Batch> batches;
    for (int64_t i = 0; i < steps; ++i) {
      auto batch = sampler.next(config.train.batch_size * config.train.grad_accum);
      batches.push_back({batch.inputs.to(device), batch.targets.to(device)});
    }

    const double tokens_per_step = static_cast<double>(config.train.batch_size * config.train.grad_accum * config.model.context);
    const double flops_per_token = loco::model::training_flops_per_token(config.model);
    const double peak = matmul_peak(device);
    fmt::print("device: {} (LibTorch {}); model: {} parameters, {:.1f} MFLOP/token (6N + attention); {} threads; "
               "matmul peak {:.1f} TFLOP/s ({})\n", device.str(), TORCH_VERSION, loco::model::parameter_count(config.model),
               flops_per_token / 1e6, threads, peak / 1e12, device.is_cuda() ? "bf16" : "fp32");
    fmt::print("{} rounds of {} steps ({} warm-up), {} tokens/step\n\n", rounds, steps, warmup, tokens_per_step);
    const auto m = measure(config, batches, device, work_dir, steps, warmup, rounds, tokens_per_step);
    const double bare = median(m.bare_s), ours = median(m.loco_s);
    const double overhead = 100.0 * (ours / bare - 1);
    auto mfu = [&](double seconds, double against) { return 100.0 * flops_per_token * tokens_per_step / seconds / against; };
    fmt::print("\n{:>6} {:>14.0f} {:>14.0f} {:>9.1f}%   (median; target: overhead < 3%)\n", "median",
               tokens_per_step / bare, tokens_per_step / ours, overhead);
    fmt::print("MFU vs measured matmul peak: bare {:.1f}%, loco {:.1f}%\n", mfu(bare, peak), mfu(ours, peak));
    if (peak_tflops > 0) {
      fmt::print("MFU vs published peak {:.0f} TFLOP/s: bare {:.1f}%, loco {:.1f}%\n", peak_tflops, mfu(bare, peak_tflops * 1e12),
                 mfu(ours, peak_tflops * 1e12));
    }
    const auto parts = phases(config, batches, warmup, device);
    const double timed = parts.forward + parts.head_fused + parts.backward + parts.update;
    fmt::print("\nparts of a bare step, each timed alone (ms, median): blocks forward {:.1f}, head and loss {:.1f} "
               "(plain, with float32 logits: {:.1f}), blocks backward {:.1f}, clip and AdamW {:.1f}; {:.1f} in all\n",
               1e3 * parts.forward, 1e3 * parts.head_fused, 1e3 * parts.head_plain, 1e3 * parts.backward, 1e3 * parts.update,
               1e3 * timed);
    // Printed before the teardown: on LibTorch 2.11 with CUDA the process was seen to crash at
    // exit after its last line (docs/benchmarks.md, "On a GPU").
    std::fflush(stdout);
    if (!json_file.empty()) {
      nlohmann::json j{{"device", device.str()}, {"libtorch", TORCH_VERSION}, {"config", config_file},
                       {"parameters", loco::model::parameter_count(config.model)}, {"flops_per_token", flops_per_token},
                       {"tokens_per_step", tokens_per_step}, {"steps", steps}, {"warmup", warmup},
                       {"bare_s", m.bare_s}, {"loco_s", m.loco_s}, {"bare_tokens_per_s", tokens_per_step / bare},
                       {"loco_tokens_per_s", tokens_per_step / ours}, {"overhead_percent", overhead},
                       {"matmul_peak_flops", peak}, {"mfu_measured_peak", mfu(ours, peak)},
                       {"parts_s", {{"blocks_forward", parts.forward}, {"head_and_loss", parts.head_fused},
                                    {"head_and_loss_plain", parts.head_plain}, {"blocks_backward", parts.backward},
                                    {"clip_and_adamw", parts.update}}}};
      if (peak_tflops > 0) {
        j["published_peak_tflops"] = peak_tflops;
        j["mfu_published_peak"] = mfu(ours, peak_tflops * 1e12);
      }
      std::ofstream(json_file) << j.dump(2) << "\n";
    }
    fs::remove_all(work_dir);
  } catch (const loco::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
