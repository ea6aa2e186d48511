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
#include <fstream>
#include <nlohmann/json.hpp>

#include "loco/core/allocator.h"
#include "loco/core/error.h"
#include "loco/data/batcher.h"
#include "loco/model/transformer.h"
#include "loco/data/dataset.h"
#include "loco/model/precision.h"
#include "loco/runtime/config/config.h"
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

// Seconds per step of a bare loop: batches prepared on the device, forward (bf16 autocast on a
// GPU, as loco's loop), cross entropy, backward, clip, torch::optim::AdamW. Steps after `warmup`
// are timed.
double bare_loop(const loco::runtime::RunConfig& config, const std::vector<loco::data::Batch>& batches, int64_t warmup,
                 const torch::Device& device) {
  auto model = loco::runtime::build_model(config);
  model->to(device);
  model->train();
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(config.optim.lr)
                                                     .betas({config.optim.adamw.beta1, config.optim.adamw.beta2})
                                                     .weight_decay(config.optim.adamw.weight_decay));
  Clock::time_point start;
  for (size_t i = 0; i < batches.size(); ++i) {
    if (static_cast<int64_t>(i) == warmup) {
      synchronize(device);
      start = Clock::now();
    }
    adamw.zero_grad();
    torch::Tensor loss;
    {
      loco::model::AutocastGuard autocast(device, true);
      auto logits = model->forward(batches[i].inputs);
      loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), batches[i].targets.reshape({-1}));
    }
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), config.optim.grad_clip);
    adamw.step();
    (void)loss.item<double>();  // the loop reads the loss too
  }
  synchronize(device);
  return std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(batches.size() - warmup);
}

// Seconds per step of loco's own loop, from the timestamps of its train events (logged every step),
// which excludes setup and the final evaluation and checkpoint.
double loco_loop(loco::runtime::RunConfig config, const fs::path& run_dir, int64_t steps, int64_t warmup) {
  fs::remove_all(run_dir);
  config.run.dir = run_dir.string();
  config.train.steps = steps;
  config.train.log_every = 1;
  config.eval.every = steps + 1;
  config.checkpoint.every = 0;
  loco::algorithms::NoSync sync;
  loco::runtime::TrainOptions options;
  options.out = fopen("/dev/null", "w");
  if (options.out == nullptr) throw loco::Error("bench", "cannot open /dev/null");
  loco::runtime::train(config, sync, options);
  fclose(options.out);
  std::vector<double> times;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "train") times.push_back(j["time"].get<double>());
  }
  return (times.back() - times[static_cast<size_t>(warmup - 1)]) / static_cast<double>(steps - warmup);
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
    // Printed before the teardown: on LibTorch 2.11 with CUDA the process was seen to crash at
    // exit after its last line (docs/benchmarks.md, "On a GPU").
    std::fflush(stdout);
    if (!json_file.empty()) {
      nlohmann::json j{{"device", device.str()}, {"libtorch", TORCH_VERSION}, {"config", config_file},
                       {"parameters", loco::model::parameter_count(config.model)}, {"flops_per_token", flops_per_token},
                       {"tokens_per_step", tokens_per_step}, {"steps", steps}, {"warmup", warmup},
                       {"bare_s", m.bare_s}, {"loco_s", m.loco_s}, {"bare_tokens_per_s", tokens_per_step / bare},
                       {"loco_tokens_per_s", tokens_per_step / ours}, {"overhead_percent", overhead},
                       {"matmul_peak_flops", peak}, {"mfu_measured_peak", mfu(ours, peak)}};
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
