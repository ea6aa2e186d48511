#include "loco/runtime/worker/dipaco_worker.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <mutex>
#include <thread>
#include <sys/resource.h>
#include <unistd.h>

#include "loco/algorithms/dipaco.h"
#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/data/batcher.h"
#include "loco/data/dataset.h"
#include "loco/data/routing.h"
#include "loco/metrics/metrics_log.h"
#include "loco/metrics/progress.h"
#include "loco/model/paths.h"
#include "loco/model/precision.h"
#include "loco/optim/adamw.h"
#include "loco/optim/outer.h"
#include "loco/optim/schedule.h"
#include "loco/runtime/store/checkpoint.h"
#include "loco/runtime/store/modules.h"
#include "loco/runtime/store/safetensors.h"
#include "loco/runtime/worker/route.h"
#include "loco/runtime/worker/weights.h"
#include "loco/runtime/worker/worker.h"

namespace loco::runtime {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

int64_t file_bytes(const fs::path& file) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  return ec ? 0 : static_cast<int64_t>(size);
}

// Removes a file the run no longer needs; one already gone is fine (a duplicate of the task removed it).
void remove_file(const fs::path& file) {
  std::error_code ec;
  fs::remove(file, ec);
}

// DiPaCo's discriminative router: softmax regression on standardized document features, with
// biases tuned so that the routed documents spread over the paths evenly.
struct LinearRouter {
  torch::Tensor weight, bias, mean, scale;  // (D, P), (P), (D), (D)
  torch::Tensor scores(const torch::Tensor& features) const {
    return ((features.to(torch::kFloat32) - mean) / scale).matmul(weight) + bias;
  }
  std::vector<int64_t> route(const torch::Tensor& features) const {
    const auto best = scores(features).argmax(1).contiguous();
    return {best.data_ptr<int64_t>(), best.data_ptr<int64_t>() + best.numel()};
  }
};

// Fits the router on `features` (N, D) labelled with their best paths, then tunes its biases so
// that `balance` (the training documents' features) spread over the paths evenly: within 5% (or
// one document) of an equal share each, or as close as 2000 rounds came. Deterministic.
LinearRouter fit_linear_router(const torch::Tensor& features, const torch::Tensor& labels, int64_t paths,
                               const torch::Tensor& balance) {
  torch::manual_seed(0);
  LinearRouter r;
  r.mean = features.mean(0);
  r.scale = features.std(0).clamp_min(1e-6);
  const auto x = (features - r.mean) / r.scale;
  auto weight = torch::zeros({x.size(1), paths}, torch::requires_grad());
  auto bias = torch::zeros({paths}, torch::requires_grad());
  torch::optim::Adam adam({weight, bias}, torch::optim::AdamOptions(0.05));
  for (int step = 0; step < 300; ++step) {
    adam.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(x.matmul(weight) + bias, labels) + 1e-2 * weight.pow(2).sum();
    loss.backward();
    adam.step();
  }
  r.weight = weight.detach();
  auto tuned = bias.detach().clone();
  const auto z = ((balance.to(torch::kFloat32) - r.mean) / r.scale).matmul(r.weight);
  const double target = static_cast<double>(balance.size(0)) / static_cast<double>(paths);
  // Sinkhorn's updates of the biases (the dual of an even transport of documents to paths) at a
  // falling temperature, keeping the biases whose hard assignment came closest to even.
  double best = INFINITY;
  r.bias = tuned.clone();
  for (const double temperature : {1.0, 0.5, 0.25, 0.1, 0.05}) {
    for (int round = 0; round < 200; ++round) {
      const auto scores = z + tuned;
      const auto counts = torch::bincount(scores.argmax(1), {}, paths).to(torch::kFloat32);
      const double off = (counts - target).abs().max().item<double>();
      if (off < best) best = off, r.bias = tuned.clone();
      if (off <= std::max(1.0, 0.05 * target)) return r;
      const auto mass = torch::softmax(scores / temperature, 1).sum(0).clamp_min(1e-12);  // (P)
      tuned += temperature * (std::log(target) - mass.log());
    }
  }
  return r;
}

// A worker's name as a file name's part: letters, digits, '.', '-', '_' (others become '_').
std::string file_safe(const std::string& name) {
  std::string out = name;
  for (auto& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  }
  return out;
}

// What every part of a DiPaCo run opens the same way: the resolved config, the dataset, the plan,
// and the routing's documents per path.
struct RunParts {
  RunConfig config;
  data::Dataset dataset;
  model::PathPlan plan;
  fs::path run_dir;
  int64_t phases = 0;

  static RunParts open(const RunConfig& given) {
    RunConfig config = given;
    resolve_defaults(config);
    auto dataset = data::Dataset::open(config.data.dir);
    const int64_t vocab = dataset.manifest().vocab_size;
    if (config.model.vocab_size == 0) {
      config.model.vocab_size = vocab;
    } else if (config.model.vocab_size != vocab) {
      throw ConfigError("dipaco", fmt::format("model.vocab_size = {} but the dataset {} has a vocabulary of {}; hint: leave "
                                              "model.vocab_size = 0 to take the dataset's", config.model.vocab_size,
                                              config.data.dir, vocab));
    }
    validate(config);
    model::PathPlan plan(config.model, path_options(config));
    const int64_t phases = dipaco_phases(config);
    fs::path run_dir = config.run.dir;
    return RunParts{std::move(config), std::move(dataset), std::move(plan), std::move(run_dir), phases};
  }

  // The training documents of each path, from `routing`/paths.json (RUN/routing: k-means's; a
  // re-routing's folder after it).
  std::vector<std::vector<int64_t>> path_documents(const std::string& routing = "routing") const {
    const auto file = run_dir / routing / "paths.json";
    nlohmann::json saved;
    try {
      saved = nlohmann::json::parse(read_file(file, "dipaco"));
      std::vector<std::vector<int64_t>> out;
      const auto documents = static_cast<int64_t>(dataset.train().documents.size());
      for (const auto& entry : saved.at("paths")) {
        auto& docs = out.emplace_back(entry.at("documents").get<std::vector<int64_t>>());
        for (auto d : docs) {
          if (d < 0 || d >= documents) throw DataError("dipaco", fmt::format("document {} is not in the training split", d));
        }
      }
      if (static_cast<int64_t>(out.size()) != plan.paths()) {
        throw DataError("dipaco", fmt::format("it routes to {} paths, the plan has {}", out.size(), plan.paths()));
      }
      return out;
    } catch (const nlohmann::json::exception& e) {
      throw DataError("dipaco", fmt::format("{} is malformed: {}", file.string(), e.what()));
    } catch (const DataError& e) {
      throw DataError("dipaco", fmt::format("{}: {} (another run's routing? route again into a fresh run folder)",
                                            file.string(), e.what()));
    }
  }

  // The tokens of `documents` of `split`, in order, and the same stream as targets with each
  // document's first data.route_tokens tokens left out: the router read them, so no loss counts
  // them, in training or evaluation (as in the paper).
  struct Stream {
    std::vector<int32_t> tokens, targets;
  };
  Stream stream_of(const data::Split& split, const std::vector<int64_t>& documents) const {
    Stream out;
    for (auto d : documents) {
      const auto& doc = split.documents[static_cast<size_t>(d)];
      const auto begin = split.tokens.begin() + static_cast<int64_t>(doc.offset);
      out.tokens.insert(out.tokens.end(), begin, begin + doc.length);
      const int64_t routed = std::min<int64_t>(config.data.route_tokens, doc.length);
      out.targets.insert(out.targets.end(), static_cast<size_t>(routed), data::kIgnoredTarget);
      out.targets.insert(out.targets.end(), begin + routed, begin + doc.length);
    }
    return out;
  }

  // A path model with `versions[m]` of each of its modules loaded (and no other module). Returns
  // the bytes read, by module.
  std::map<std::string, int64_t> load_path(model::Transformer& model, int64_t path,
                                           const std::map<std::string, int64_t>& versions) const {
    std::map<std::string, int64_t> bytes;
    torch::NoGradGuard no_grad;
    for (auto index : plan.modules_of(path)) {
      const auto& module = plan.module(index);
      const int64_t version = versions.at(module.name);
      const auto saved = load_module(run_dir, module.name, version, plan.fingerprint());
      bytes[module.name] = file_bytes(module_file(run_dir, module.name, version));
      const auto group = model::module_parameters(model, module);
      if (saved.parameters.size() != group.names.size()) {
        throw DataError("dipaco", fmt::format("module {} v{} holds {} tensors, the path model's module {}", module.name,
                                              version, saved.parameters.size(), group.names.size()));
      }
      for (size_t i = 0; i < group.names.size(); ++i) {
        const auto& [name, tensor] = saved.parameters[i];
        if (name != group.names[i] || !tensor.sizes().equals(group.parameters[i].sizes())) {
          throw DataError("dipaco", fmt::format("module {} v{}: tensor {} is not the model's {}", module.name, version, name,
                                                group.names[i]));
        }
        group.parameters[i].copy_(tensor);
      }
    }
    return bytes;
  }
};

// Renews a task's lease from its own thread and connection while the task runs.
class LeaseKeeper {
 public:
  LeaseKeeper(const RunConfig& config, TaskKey task, std::string worker, std::FILE* out)
      : task_(std::move(task)), worker_(std::move(worker)), lease_s_(config.dipaco.lease_s) {
    thread_ = std::thread([this, config, out] {
      std::unique_ptr<Registry> registry;
      std::unique_lock lock(mutex_);
      while (!done_) {
        wake_.wait_for(lock, std::chrono::duration<double>(lease_s_ / 4));
        if (done_) break;
        lock.unlock();
        try {
          if (!registry) registry = open_run_registry(config);
          if (!registry->renew(task_, worker_, unix_seconds(), lease_s_)) lost_ = true;
        } catch (const std::exception& e) {  // the database is away: the lease may run out; the end will tell
          registry.reset();
          std::fprintf(out, "%s: cannot renew the lease: %s\n", worker_.c_str(), e.what());
        } catch (...) {
          registry.reset();
        }
        lock.lock();
      }
    });
  }
  ~LeaseKeeper() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  bool lost() const { return lost_; }

 private:
  TaskKey task_;
  std::string worker_;
  double lease_s_;
  std::atomic<bool> lost_ = false;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

// A task given up before its end (a stop was asked, or its lease was lost).
struct Abandoned {
  bool lost = false;
};

class Worker {
 public:
  Worker(const RunConfig& config, const DipacoWorkerOptions& options)
      : options_(options), parts_(RunParts::open(config)),
        log_(parts_.run_dir / "metrics.jsonl") {
    // Through db(): a worker that starts while the database restarts waits for it like the others.
    auto layout = db([](Registry& r) { return r.layout(); });
    if (!layout) {
      throw DataError("dipaco", fmt::format("the run {} is not started (no layout in its registry); hint: `loco launch "
                                            "--config FILE` prepares and starts it", parts_.run_dir.string()));
    }
    if (layout->plan != parts_.plan.fingerprint() || layout->phases != parts_.phases) {
      throw DataError("dipaco", fmt::format("the run {} was started with plan {} and {} phases; this config makes plan {} "
                                            "and {} phases", parts_.run_dir.string(), layout->plan, layout->phases,
                                            parts_.plan.fingerprint(), parts_.phases));
    }
    layout_ = *layout;
    documents_ = parts_.path_documents();
    device_ = model::resolve_device(parts_.config.train.device);
    threads_ = configure_threads(parts_.config.train.threads);
  }

  DipacoWorkerSummary run() {
    const auto start = Clock::now();
    say(fmt::format("joined {} ({} paths, {} phases of {} inner steps; device {}, {} threads)", parts_.run_dir.string(),
                    parts_.plan.paths(), parts_.phases, parts_.config.sync.inner_steps, device_.str(), threads_));
    int64_t tasks = 0;
    while (options_.max_tasks < 0 || tasks < options_.max_tasks) {
      if (stopping()) {
        summary_.interrupted = true;
        break;
      }
      auto task = db([&](Registry& r) { return r.lease(options_.name, unix_seconds(), parts_.config.dipaco.lease_s); });
      if (!task) {
        if (db([](Registry& r) { return r.finished(); })) break;
        std::this_thread::sleep_for(std::chrono::duration<double>(options_.poll_s));
        continue;
      }
      ++tasks;
      const auto task_start = Clock::now();
      try {
        LeaseKeeper keeper(parts_.config, *task, options_.name, options_.out);
        switch (task->kind) {
          case TaskKey::Kind::kPath: run_path(*task, keeper); break;
          case TaskKey::Kind::kStep: run_step(*task); break;
          case TaskKey::Kind::kRoute: run_route(*task); break;
        }
      } catch (const LeaseLost& e) {
        ++summary_.lost_tasks;
        say(fmt::format("dropped {}: {}", describe(*task), e.what()));
      } catch (const DataError& e) {
        // A task that lost its lease may find its inputs gone (the worker that completed it in its
        // place removed them): dropped like a lost lease. Held still, the error is real.
        if (db([&](Registry& r) { return r.holds(*task, options_.name); })) throw;
        ++summary_.lost_tasks;
        say(fmt::format("dropped {}: its lease ran out and another worker has it ({})", describe(*task), e.what()));
      } catch (const Abandoned& a) {
        if (a.lost) {
          ++summary_.lost_tasks;
          say(fmt::format("dropped {}: its lease ran out and another worker has it", describe(*task)));
        } else {
          db([&](Registry& r) { r.release(*task, options_.name); });
          say(fmt::format("stopped; {} is open again for another worker", describe(*task)));
        }
      }
      summary_.busy_s += seconds_since(task_start);
    }
    summary_.wall_s = seconds_since(start);
    rusage usage{};
    if (::getrusage(RUSAGE_SELF, &usage) == 0) summary_.peak_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
    log_.write("worker_summary", {{"worker", options_.name}, {"path_tasks", summary_.path_tasks},
                                  {"step_tasks", summary_.step_tasks}, {"lost_tasks", summary_.lost_tasks},
                                  {"inner_steps", summary_.inner_steps}, {"tokens", summary_.tokens},
                                  {"bytes_read", summary_.bytes_read}, {"bytes_written", summary_.bytes_written},
                                  {"wall_s", summary_.wall_s}, {"busy_s", summary_.busy_s},
                                  {"peak_rss_bytes", summary_.peak_rss_bytes},
                                  {"interrupted", summary_.interrupted}});
    return summary_;
  }

 private:
  bool stopping() const { return options_.stop != nullptr && options_.stop->load(); }

  // Runs `request` on the registry; when the database is unavailable (a server restarting), on a
  // new connection, again, for up to cluster.coordinator_timeout_s. A request that committed but
  // whose answer was lost is safe to repeat: a second lease only delays a task by its lease, a
  // second completion is refused as a lost lease (the work was recorded the first time).
  template <class F>
  auto db(F&& request) -> decltype(request(std::declval<Registry&>())) {
    const auto start = Clock::now();
    for (int attempt = 0;; ++attempt) {
      try {
        if (!registry_) registry_ = open_run_registry(parts_.config);
        return request(*registry_);
      } catch (const DatabaseUnavailable& e) {
        registry_.reset();
        if (seconds_since(start) > parts_.config.cluster.coordinator_timeout_s || stopping()) throw;
        if (attempt == 0) {
          say(fmt::format("the registry is unavailable ({}); trying again for up to {:g} s (cluster.coordinator_timeout_s)",
                          e.what(), parts_.config.cluster.coordinator_timeout_s));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    }
  }
  void say(const std::string& line) {
    fmt::print(options_.out, "{}: {}\n", options_.name, line);
    std::fflush(options_.out);
  }

  // The path's inner AdamW state left by its last completed task (phase − 1, or with a phase
  // deadline an earlier one), loaded into `adamw`; its file, to remove once this phase completed.
  std::optional<std::string> load_inner_state(optim::AdamW& adamw, int64_t path, int64_t phase, int64_t& read) {
    std::optional<std::string> previous_inner;
    if (phase > 0) {  // the path's inner optimizer state continues across phases, whichever worker ran the last one
      const auto previous = db([&](Registry& r) { return r.latest_path_result(path, phase); });
      // Without a phase deadline every phase of a path completes; with one, a late task may have
      // been cancelled, and the path continues from the last state it completed.
      if ((!previous || previous->first != phase - 1) && parts_.config.dipaco.phase_deadline_s <= 0) {
        throw DataError("dipaco", fmt::format("path {} phase {} has no recorded inner state", path, phase - 1));
      }
      if (previous && !previous->second.empty()) {
        previous_inner = previous->second;
        const auto file = load_safetensors(parts_.run_dir / *previous_inner);
        read += file_bytes(parts_.run_dir / *previous_inner);
        const auto steps = file.metadata.find("loco.inner_steps");
        if (steps == file.metadata.end()) {
          throw DataError("dipaco", fmt::format("{}: not a path's inner state (no loco.inner_steps)", *previous_inner));
        }
        adamw.load_state(file.tensors, std::strtoll(steps->second.c_str(), nullptr, 10));
      }
    }
    return previous_inner;
  }

  // The path's sampler over its shard (the k-means one, or the re-routing's from its phase on),
  // at the phase's position: a function of the phase, so a task issued again reads the same data.
  // `weight`: the shard's tokens, the weight of the path's outer gradients.
  data::WindowSampler path_sampler(int64_t path, int64_t phase, double& weight) {
    const auto& config = parts_.config;
    // After a re-routing the path trains on its new shard, from its start.
    const bool rerouted = layout_.reroute_phase > 0 && phase >= layout_.reroute_phase;
    if (rerouted && !rerouted_documents_) {
      const auto folder = db([&](Registry& r) { return r.task_result({TaskKey::Kind::kRoute, -1, "", layout_.reroute_phase}); });
      if (!folder) throw DataError("dipaco", fmt::format("phase {} has no re-routing recorded", layout_.reroute_phase));
      rerouted_documents_ = parts_.path_documents(*folder);
    }
    const auto& shards = rerouted ? *rerouted_documents_ : documents_;
    const int64_t shard_phase = rerouted ? phase - layout_.reroute_phase : phase;
    const auto stream = parts_.stream_of(parts_.dataset.train(), shards.at(static_cast<size_t>(path)));
    weight = static_cast<double>(stream.tokens.size());
    data::WindowSampler sampler(stream.tokens, config.model.context, static_cast<uint64_t>(config.train.seed + path),
                                &stream.targets);
    const int64_t windows_per_step = config.train.batch_size * config.train.grad_accum;
    const auto taken = static_cast<uint64_t>(shard_phase * config.sync.inner_steps * windows_per_step);
    const auto per_epoch = static_cast<uint64_t>(sampler.windows_per_epoch());
    sampler.restore({taken / per_epoch, taken % per_epoch});

    return sampler;
  }

  // The phase's inner steps; returns the sum of their losses. Gives the task up (Abandoned) when a
  // stop is asked or its lease was lost.
  double train_steps(model::Transformer& model, optim::AdamW& adamw, data::WindowSampler& sampler, int64_t path,
                     int64_t first, int64_t steps, const LeaseKeeper& keeper) {
    const auto& config = parts_.config;
    std::vector<torch::Tensor> parameters;
    for (const auto& p : adamw.parameters()) parameters.push_back(p.tensor);
    const optim::ScheduleOptions schedule{config.optim.lr, config.optim.warmup_steps, config.train.steps, config.optim.min_lr_ratio};
    double loss_sum = 0;
    for (int64_t i = 0; i < steps; ++i) {
      if (stopping()) throw Abandoned{false};
      if (keeper.lost()) throw Abandoned{true};
      adamw.zero_grad();
      double loss = 0;
      for (int64_t micro = 0; micro < config.train.grad_accum; ++micro) {
        auto batch = sampler.next(config.train.batch_size);
        if ((batch.targets != data::kIgnoredTarget).sum().item<int64_t>() == 0) continue;  // only routing tokens
        torch::Tensor total, ce;
        {
          model::AutocastGuard autocast(device_, true);
          auto logits = model->forward(batch.inputs.to(device_));
          auto parts = model::language_model_loss(logits, batch.targets.to(device_), config.train.z_loss);
          total = parts.loss;
          ce = parts.cross_entropy;
        }
        (total / static_cast<double>(config.train.grad_accum)).backward();
        loss += ce.item<double>() / static_cast<double>(config.train.grad_accum);
      }
      if (!std::isfinite(loss)) {
        throw Error("dipaco", fmt::format("path {}: the loss became {} at step {}; hint: lower optim.lr (the modules' "
                                          "published versions are intact)", path, loss, first + i));
      }
      optim::clip_grad_norm(parameters, config.optim.grad_clip);
      adamw.step(optim::learning_rate(schedule, first + i));
      loss_sum += loss;
    }
    return loss_sum;
  }

  // Trains path `task.path` for the phase's inner steps from its modules' versions `task.phase`.
  void run_path(const TaskKey& task, const LeaseKeeper& keeper) {
    const auto& config = parts_.config;
    const int64_t path = task.path, phase = task.phase;
    int64_t read = 0, written = 0;
    auto model = build_model(config);
    std::map<std::string, int64_t> versions;
    for (auto index : parts_.plan.modules_of(path)) versions[parts_.plan.module(index).name] = phase;
    const auto read_by_module = parts_.load_path(model, path, versions);
    std::map<std::string, int64_t> written_by_module;
    for (const auto& [name, bytes] : read_by_module) read += bytes;
    // θ_m of each module at the phase's start: the outer gradients are taken against them.
    std::vector<std::pair<const model::Module*, std::vector<torch::Tensor>>> start;
    for (auto index : parts_.plan.modules_of(path)) {
      const auto& module = parts_.plan.module(index);
      std::vector<torch::Tensor> copies;
      for (const auto& t : model::module_parameters(model, module).parameters) copies.push_back(t.detach().clone());
      start.emplace_back(&module, std::move(copies));
    }
    model->to(device_);
    model->train();

    std::vector<optim::NamedParameter> named;
    for (const auto& [name, tensor] : model_weights(model)) named.push_back({name, tensor, tensor.dim() >= 2});
    optim::AdamW adamw(std::move(named), config.optim.adamw);
    int64_t inner_read = 0;
    const auto previous_inner = load_inner_state(adamw, path, phase, inner_read);
    read += inner_read;
    double weight = 0;
    auto sampler = path_sampler(path, phase, weight);
    const int64_t windows_per_step = config.train.batch_size * config.train.grad_accum;

    const int64_t first = phase * config.sync.inner_steps;
    const int64_t steps = std::min(config.sync.inner_steps, config.train.steps - first);
    const auto compute_start = Clock::now();
    const double loss_sum = train_steps(model, adamw, sampler, path, first, steps, keeper);
    const double compute_s = seconds_since(compute_start);

    // One outer gradient per module, Δ = θ_m − θ_p, and the inner state; then the task's end.
    const std::string who = file_safe(options_.name);
    std::vector<ModuleReport> reports;
    model->to(torch::kCPU);
    for (const auto& [module, before] : start) {
      const auto group = model::module_parameters(model, *module);
      NamedTensors delta;
      for (size_t i = 0; i < group.names.size(); ++i) {
        delta.emplace_back(group.names[i], (before[i] - group.parameters[i].detach().to(torch::kFloat32)).contiguous());
      }
      const auto relative = fmt::format("reports/{}/phase{}/P{}-{}.safetensors", module->name, phase, path, who);
      save_safetensors(parts_.run_dir / relative, delta,
                       {{"loco.module", module->name}, {"loco.phase", std::to_string(phase)},
                        {"loco.path", std::to_string(path)}, {"loco.plan", parts_.plan.fingerprint()}});
      written_by_module[module->name] = file_bytes(parts_.run_dir / relative);
      written += written_by_module[module->name];
      reports.push_back({module->name, phase, path, weight, relative});
    }
    const auto inner = fmt::format("paths/P{}/inner-{}-{}.safetensors", path, phase, who);
    save_safetensors(parts_.run_dir / inner, adamw.state(), {{"loco.inner_steps", std::to_string(adamw.steps())}});
    written += file_bytes(parts_.run_dir / inner);
    const auto late = db([&](Registry& r) {
      return r.complete_path(task, options_.name, reports, inner, unix_seconds(), config.dipaco.phase_deadline_s);
    });
    for (const auto& m : late) {  // not recorded: nothing will read them
      for (const auto& report : reports) {
        if (report.module == m) remove_file(parts_.run_dir / report.file);
      }
    }
    if (!late.empty()) {
      say(fmt::format("path {} phase {} reported after the phase deadline of {} closed: those modules stepped without it",
                      path, phase + 1, fmt::join(late, ", ")));
    }
    if (previous_inner) remove_file(parts_.run_dir / *previous_inner);  // the next phase continues from `inner`

    const double mean_loss = steps > 0 ? loss_sum / static_cast<double>(steps) : NAN;
    const int64_t step_tokens = steps * windows_per_step * config.model.context;
    ++summary_.path_tasks;
    summary_.inner_steps += steps;
    summary_.tokens += step_tokens;
    summary_.bytes_read += read;
    summary_.bytes_written += written;
    say(fmt::format("path {} phase {}/{}: {} steps, loss {:.4f}, {:.0f} tok/s; read {}, wrote {}", path, phase + 1,
                    parts_.phases, steps, mean_loss, static_cast<double>(step_tokens) / std::max(compute_s, 1e-9),
                    metrics::format_bytes(static_cast<double>(read)), metrics::format_bytes(static_cast<double>(written))));
    log_.write("path_task", {{"worker", options_.name}, {"path", path}, {"phase", phase}, {"steps", steps},
                             {"loss", mean_loss}, {"tokens", step_tokens}, {"compute_s", compute_s},
                             {"bytes_read", read}, {"bytes_written", written}, {"module_bytes_read", read_by_module},
                             {"module_bytes_written", written_by_module}});
  }

  // Module `task.module`'s outer step of phase `task.phase`: from version phase to phase + 1.
  void run_step(const TaskKey& task) {
    const auto& module = parts_.plan.module(parts_.plan.find(task.module));
    const auto saved = load_module(parts_.run_dir, module.name, task.phase, parts_.plan.fingerprint());
    int64_t read = file_bytes(module_file(parts_.run_dir, module.name, task.phase));
    std::vector<std::string> names;
    std::vector<torch::Tensor> parameters;
    for (const auto& [name, tensor] : saved.parameters) {
      names.push_back(name);
      parameters.push_back(tensor.clone());
    }
    algorithms::ModuleState state(module.name, names, parameters, outer_options(parts_.config));
    state.load_optimizer_state(saved.outer_state);
    if (state.version() != task.phase) {
      throw DataError("dipaco", fmt::format("module {} v{} holds an outer optimizer of {} steps", module.name, task.phase,
                                            state.version()));
    }
    std::vector<algorithms::PathReport> reports;
    std::vector<std::string> consumed;
    for (const auto& report : db([&](Registry& r) { return r.reports(module.name, task.phase); })) {
      const auto file = load_safetensors(parts_.run_dir / report.file);
      read += file_bytes(parts_.run_dir / report.file);
      algorithms::PathReport path_report{report.path, report.weight, {}};
      for (size_t i = 0; i < names.size(); ++i) {
        if (i >= file.tensors.size() || file.tensors[i].first != names[i]) {
          throw DataError("dipaco", fmt::format("{}: the outer gradient does not hold module {}'s tensor {}", report.file,
                                                module.name, names[i]));
        }
        path_report.outer_gradient.push_back(file.tensors[i].second);
      }
      reports.push_back(std::move(path_report));
      consumed.push_back(report.file);
    }
    state.step(reports);
    ModuleVersion next{module.name, task.phase + 1, parts_.plan.fingerprint(), {}, state.optimizer().state()};
    for (size_t i = 0; i < names.size(); ++i) next.parameters.emplace_back(names[i], state.parameters()[i]);
    save_module(parts_.run_dir, next);
    const auto file = module_file(parts_.run_dir, module.name, next.version);
    const int64_t written = file_bytes(file);
    db([&](Registry& r) { r.complete_step(task, options_.name, fs::relative(file, parts_.run_dir).string()); });
    // What the step consumed: the phase's outer gradients, and the version before the previous one
    // (no task reads it any more: every path through the module has reported past it).
    for (const auto& report : consumed) remove_file(parts_.run_dir / report);
    if (task.phase >= 1 && !db([&](Registry& r) { return r.version_needed(module.name, task.phase - 1); })) {
      remove_file(module_file(parts_.run_dir, module.name, task.phase - 1));
    }
    ++summary_.step_tasks;
    summary_.bytes_read += read;
    summary_.bytes_written += written;
    say(fmt::format("module {} v{} from {} path(s)", module.name, next.version, reports.size()));
    log_.write("step_task", {{"worker", options_.name}, {"module", module.name}, {"version", next.version},
                             {"paths", reports.size()}, {"bytes_read", read}, {"bytes_written", written}});
  }

  // Discriminative re-routing before phase `task.phase` (every module is at that version): every
  // path scores the held-out router documents, a linear router learns each one's best path from its
  // features, its biases are tuned until the training documents spread over the paths as evenly as
  // k-means spread them, and it re-shards the training documents (validation and prompts follow
  // it at evaluation and inference).
  void run_route(const TaskKey& task) {
    const auto& config = parts_.config;
    const auto routing = nlohmann::json::parse(read_file(parts_.run_dir / "routing" / "paths.json", "dipaco"));
    const auto held_out = routing.at("held_out").get<std::vector<int64_t>>();
    const auto& train = parts_.dataset.train();
    const int64_t paths = parts_.plan.paths();
    // Each held-out document's loss on every path, its routing tokens left out.
    auto losses = torch::full({static_cast<int64_t>(held_out.size()), paths}, NAN, torch::kFloat64);
    for (int64_t p = 0; p < paths; ++p) {
      auto model = build_model(config);
      std::map<std::string, int64_t> versions;
      for (auto index : parts_.plan.modules_of(p)) versions[parts_.plan.module(index).name] = task.phase;
      parts_.load_path(model, p, versions);
      model->to(device_);
      for (size_t i = 0; i < held_out.size(); ++i) {
        const auto stream = parts_.stream_of(train, {held_out[i]});
        if (static_cast<int64_t>(stream.tokens.size()) <= config.model.context) continue;  // too short to score
        const auto batches = data::evaluation_batches(stream.tokens, config.model.context, 4, 4, &stream.targets);
        const auto result = evaluate(model, batches, device_);
        if (result.tokens > 0) losses[static_cast<int64_t>(i)][p] = result.loss;
      }
    }
    const auto scored = losses.isfinite().all(1);
    if (scored.sum().item<int64_t>() == 0) {
      throw DataError("dipaco", "re-routing: no held-out document is long enough to score (more than model.context tokens); "
                                "hint: raise dipaco.router_fraction");
    }
    const auto labels = losses.index({scored}).argmin(1);
    std::vector<int64_t> labelled;
    for (size_t i = 0; i < held_out.size(); ++i) {
      if (scored[static_cast<int64_t>(i)].item<bool>()) labelled.push_back(held_out[i]);
    }
    const auto features = embed_documents(config, parts_.dataset);  // (N, D): the initial model's, as routing reads
    std::set<int64_t> held(held_out.begin(), held_out.end());
    std::vector<int64_t> trained;
    for (int64_t d = 0; d < static_cast<int64_t>(train.documents.size()); ++d) {
      if (held.count(d) == 0) trained.push_back(d);
    }
    const auto trained_features = features.index_select(0, torch::tensor(trained, torch::kInt64));
    const auto router = fit_linear_router(features.index_select(0, torch::tensor(labelled, torch::kInt64)), labels, paths,
                                          trained_features);

    // The training documents (not the held-out ones) to the paths the router scores highest, evenly
    // (every path floor or ceil of an equal share, the surest documents first, as k-means's shards
    // are), and with dipaco.top_n = n also to their next n - 1 best.
    const auto scores = router.scores(trained_features);
    const auto primary = data::balanced_assignment(-torch::log_softmax(scores, 1));
    const auto order = std::get<1>(scores.sort(/*stable=*/true, 1, /*descending=*/true)).narrow(1, 0, config.dipaco.top_n);
    std::vector<std::vector<int64_t>> members(static_cast<size_t>(paths));
    for (size_t j = 0; j < trained.size(); ++j) {
      members[static_cast<size_t>(primary[j])].push_back(trained[j]);
      int64_t more = config.dipaco.top_n - 1;
      for (int64_t r = 0; r < config.dipaco.top_n && more > 0; ++r) {
        const auto p = order[static_cast<int64_t>(j)][r].item<int64_t>();
        if (p == primary[j]) continue;
        members[static_cast<size_t>(p)].push_back(trained[j]);
        --more;
      }
    }
    nlohmann::json by_path = nlohmann::json::array();
    for (int64_t p = 0; p < paths; ++p) {
      if (members[static_cast<size_t>(p)].empty()) {
        throw DataError("dipaco", fmt::format("re-routing left path {} without training documents", p));
      }
      by_path.push_back({{"path", p}, {"documents", members[static_cast<size_t>(p)]}});
    }
    std::vector<int64_t> label_list(labels.data_ptr<int64_t>(), labels.data_ptr<int64_t>() + labels.numel());
    const auto relative = fmt::format("routing/phase{}", task.phase);
    const auto folder = parts_.run_dir / relative;
    if (!fs::exists(folder)) {  // a duplicate of this task may have written it whole already
      const auto partial = parts_.run_dir / fmt::format("routing/phase{}.partial-{}", task.phase, file_safe(options_.name));
      fs::remove_all(partial);
      fs::create_directories(partial);
      save_safetensors(partial / "router.safetensors",
                       {{"weight", router.weight}, {"bias", router.bias}, {"mean", router.mean}, {"scale", router.scale}},
                       {{"loco.routing", "linear"}, {"loco.plan", parts_.plan.fingerprint()}});
      write_file_atomic(partial / "paths.json",
                        nlohmann::json{{"routing", "linear"}, {"phase", task.phase}, {"top_n", config.dipaco.top_n},
                                       {"router_documents", labelled}, {"router_labels", label_list},
                                       {"paths", by_path}}.dump(1) + "\n", "dipaco");
      std::error_code ec;
      fs::rename(partial, folder, ec);
      if (ec && !fs::exists(folder)) throw Error("dipaco", fmt::format("cannot write {}: {}", folder.string(), ec.message()));
      fs::remove_all(partial, ec);
    }
    db([&](Registry& r) { r.complete_route(task, options_.name, relative); });
    std::string sizes;
    for (int64_t p = 0; p < paths; ++p) sizes += fmt::format("{}{}", p == 0 ? "" : ", ", members[static_cast<size_t>(p)].size());
    say(fmt::format("re-routed before phase {}: {} held-out documents labelled by their best path, a linear router fitted; "
                    "training documents per path: {}", task.phase + 1, labelled.size(), sizes));
    log_.write("route_task", {{"worker", options_.name}, {"phase", task.phase}, {"router_documents", labelled.size()},
                              {"documents_per_path", sizes}});
  }

  DipacoWorkerOptions options_;
  RunParts parts_;
  std::unique_ptr<Registry> registry_;
  metrics::MetricsLog log_;
  std::vector<std::vector<int64_t>> documents_;                   // k-means's shards
  std::optional<std::vector<std::vector<int64_t>>> rerouted_documents_;  // the re-routing's, once read
  RunLayout layout_;
  torch::Device device_ = torch::kCPU;
  int64_t threads_ = 1;
  DipacoWorkerSummary summary_;
};

}  // namespace

std::unique_ptr<Registry> open_run_registry(const RunConfig& config) {
  if (!config.dipaco.database.empty()) return open_postgres_registry(config.dipaco.database);
  return open_sqlite_registry(fs::path(config.run.dir) / "dipaco.sqlite");
}

int64_t dipaco_phases(const RunConfig& config) {
  return (config.train.steps + config.sync.inner_steps - 1) / config.sync.inner_steps;
}

RunLayout prepare_dipaco_run(const RunConfig& config, std::FILE* out) {
  if (!path_options(config).enabled()) {
    throw ConfigError("dipaco", "the config sets no dipaco.levels: there are no paths to train");
  }
  if (!fs::exists(fs::path(config.run.dir) / "routing")) {
    fmt::print(out, "routing the training documents to paths (as `loco route`)...\n");
    const auto routed = route_documents(config);
    fmt::print(out, "{}\n", routed.table);
  }
  auto parts = RunParts::open(config);
  auto registry = open_run_registry(config);
  if (config.dipaco.reroute_phase >= parts.phases) {
    throw ConfigError("dipaco", fmt::format("dipaco.reroute_phase = {} but the run has {} phases (train.steps / "
                                            "sync.inner_steps)", config.dipaco.reroute_phase, parts.phases));
  }
  if (config.dipaco.reroute_phase > 0 &&
      nlohmann::json::parse(read_file(parts.run_dir / "routing" / "paths.json", "dipaco"))
          .value("held_out", std::vector<int64_t>{})
          .empty()) {
    throw DataError("dipaco", fmt::format("{}/routing was routed without held-out router documents, which "
                                          "dipaco.reroute_phase needs; hint: route into a fresh run folder",
                                          parts.run_dir.string()));
  }
  RunLayout layout{parts.plan.fingerprint(), parts.phases, {}, config.dipaco.reroute_phase};
  for (int64_t p = 0; p < parts.plan.paths(); ++p) {
    auto& names = layout.path_modules.emplace_back();
    for (auto index : parts.plan.modules_of(p)) names.push_back(parts.plan.module(index).name);
  }
  if (registry->layout()) {
    registry->start(layout);  // refuses another plan or number of phases
    return layout;
  }
  write_file_atomic(parts.run_dir / "config.toml", to_toml(parts.config), "dipaco");
  // Version 0 of every module, from the initial model (every path starts from the same one).
  auto initial = build_model(parts.config);
  if (!parts.config.train.init_from.empty()) {
    load_initial_weights(initial, parts.config, parts.dataset.manifest().tokenizer_hash);
  }
  for (const auto& module : parts.plan.modules()) {
    if (registry->latest_version(module.name)) continue;
    const auto group = model::module_parameters(initial, module);
    ModuleVersion v0{module.name, 0, parts.plan.fingerprint(), {}, {}};
    std::vector<torch::Tensor> copies;
    for (size_t i = 0; i < group.names.size(); ++i) {
      copies.push_back(group.parameters[i].detach().clone());
      v0.parameters.emplace_back(group.names[i], copies.back());
    }
    v0.outer_state = optim::OuterOptimizer(group.names, copies, outer_options(parts.config)).state();
    save_module(parts.run_dir, v0);
    registry->publish_module(module.name, 0, fs::relative(module_file(parts.run_dir, module.name, 0), parts.run_dir).string());
  }
  registry->start(layout);
  fmt::print(out, "started {}: {} paths through {} modules, {} phases of {} inner steps\n", parts.run_dir.string(),
             parts.plan.paths(), parts.plan.modules().size(), parts.phases, parts.config.sync.inner_steps);
  return layout;
}

DipacoWorkerSummary run_dipaco_worker(const RunConfig& config, const DipacoWorkerOptions& options) {
  DipacoWorkerOptions resolved = options;
  if (resolved.name.empty()) resolved.name = process_name(::getpid());
  return Worker(config, resolved).run();
}

namespace {

// The run's router as it stands: the re-routing's linear router once it ran, else the k-means
// centres of RUN/routing; checked to route for this plan. Routes (N, D) features to paths.
std::function<std::vector<int64_t>(const torch::Tensor&)> load_router(const RunParts& parts, Registry& registry) {
  std::string folder = "routing";
  const auto layout = registry.layout();
  if (layout && layout->reroute_phase > 0) {
    if (auto done = registry.task_result({TaskKey::Kind::kRoute, -1, "", layout->reroute_phase})) folder = *done;
  }
  const auto file = load_safetensors(parts.run_dir / folder / "router.safetensors");
  if (file.metadata.count("loco.plan") == 0 || file.metadata.at("loco.plan") != parts.plan.fingerprint()) {
    throw DataError("dipaco", fmt::format("{}/{} routes for another plan", parts.run_dir.string(), folder));
  }
  if (file.metadata.count("loco.routing") && file.metadata.at("loco.routing") == "linear") {
    std::map<std::string, torch::Tensor> t(file.tensors.begin(), file.tensors.end());
    LinearRouter router{t.at("weight"), t.at("bias"), t.at("mean"), t.at("scale")};
    return [router](const torch::Tensor& features) { return router.route(features); };
  }
  data::KMeansRouter router;
  for (const auto& [name, centres] : file.tensors) router.centres.push_back(centres);
  router.k = router.centres.at(0).size(0);
  return [router](const torch::Tensor& features) { return router.route(features); };
}

// The latest published version of each module of `path`.
std::map<std::string, int64_t> latest_versions(const RunParts& parts, Registry& registry, int64_t path) {
  std::map<std::string, int64_t> versions;
  for (auto index : parts.plan.modules_of(path)) {
    const auto& name = parts.plan.module(index).name;
    auto latest = registry.latest_version(name);
    if (!latest) throw DataError("dipaco", fmt::format("module {} has no published version", name));
    versions[name] = *latest;
  }
  return versions;
}

}  // namespace

DipacoEvaluation evaluate_dipaco(const RunConfig& config, const std::vector<std::string>& baselines) {
  auto parts = RunParts::open(config);
  auto registry = open_run_registry(config);
  const auto route = load_router(parts, *registry);
  const auto& val = parts.dataset.val();
  const auto routes = route(embed_documents(parts.config, parts.dataset, val));
  std::vector<std::vector<int64_t>> documents(static_cast<size_t>(parts.plan.paths()));
  for (size_t d = 0; d < routes.size(); ++d) documents[static_cast<size_t>(routes[d])].push_back(static_cast<int64_t>(d));

  // The dense models to compare, each scored on the same windows.
  struct Baseline {
    std::string name;
    model::Transformer model{nullptr};
  };
  std::vector<Baseline> dense;
  for (const auto& path : baselines) {
    const auto checkpoint = load_checkpoint(path);
    if (checkpoint.state.tokenizer_hash != parts.dataset.manifest().tokenizer_hash) {
      throw DataError("dipaco", fmt::format("baseline {} was trained with another tokenizer than {}", path, parts.config.data.dir));
    }
    const auto theirs = parse_config(checkpoint.state.config_toml, (checkpoint.dir / "state.json").string());
    Baseline b{path, build_model(theirs)};
    load_model_weights(b.model, inference_weights(checkpoint), checkpoint.dir.string());
    dense.push_back(std::move(b));
  }

  const auto device = model::resolve_device(parts.config.train.device);
  DipacoEvaluation out;
  out.baselines.resize(dense.size());
  double weighted = 0;
  std::vector<double> dense_weighted(dense.size(), 0.0);
  for (size_t b = 0; b < dense.size(); ++b) {
    out.baselines[b].checkpoint = dense[b].name;
    dense[b].model->to(device);
  }
  for (int64_t p = 0; p < parts.plan.paths(); ++p) {
    PathScore score{p, static_cast<int64_t>(documents[static_cast<size_t>(p)].size()), 0, NAN};
    const auto stream = parts.stream_of(val, documents[static_cast<size_t>(p)]);
    for (auto& b : out.baselines) b.paths.push_back(NAN);
    if (static_cast<int64_t>(stream.tokens.size()) > parts.config.model.context) {
      auto model = build_model(parts.config);
      parts.load_path(model, p, latest_versions(parts, *registry, p));
      model->to(device);
      const auto batches = data::evaluation_batches(stream.tokens, parts.config.model.context, parts.config.eval.windows,
                                                    parts.config.eval.batch_size, &stream.targets);
      const auto result = evaluate(model, batches, device);
      score.loss = result.loss;
      score.tokens = result.tokens;
      weighted += result.loss * static_cast<double>(result.tokens);
      out.tokens += result.tokens;
      for (size_t b = 0; b < dense.size(); ++b) {
        const auto theirs = evaluate(dense[b].model, batches, device);
        out.baselines[b].paths.back() = theirs.loss;
        dense_weighted[b] += theirs.loss * static_cast<double>(theirs.tokens);
      }
    }
    out.paths.push_back(score);
  }
  out.loss = out.tokens > 0 ? weighted / static_cast<double>(out.tokens) : NAN;
  for (size_t b = 0; b < dense.size(); ++b) {
    out.baselines[b].loss = out.tokens > 0 ? dense_weighted[b] / static_cast<double>(out.tokens) : NAN;
  }
  return out;
}

struct PathInference::Impl {
  RunParts parts;
  std::unique_ptr<Registry> registry;
  std::function<std::vector<int64_t>(const torch::Tensor&)> router;
  std::map<int64_t, model::Transformer> models;
};

PathInference::PathInference(const RunConfig& config) {
  auto parts = RunParts::open(config);
  auto registry = open_run_registry(config);
  auto router = load_router(parts, *registry);
  impl_.reset(new Impl{std::move(parts), std::move(registry), std::move(router), {}});
}

PathInference::~PathInference() = default;

int64_t PathInference::route(const std::vector<int32_t>& tokens, bool latest) {
  const auto length = static_cast<int64_t>(tokens.size());
  const int64_t start = latest ? std::max<int64_t>(0, length - impl_->parts.config.data.route_tokens) : 0;
  data::Split split;
  split.tokens.assign(tokens.begin() + start, tokens.end());
  split.documents.push_back({0, static_cast<uint32_t>(split.tokens.size()), 0});
  return impl_->router(embed_documents(impl_->parts.config, impl_->parts.dataset, split)).at(0);
}

model::Transformer& PathInference::model(int64_t path, const torch::Device& device) {
  auto it = impl_->models.find(path);
  if (it == impl_->models.end()) {
    auto model = build_model(impl_->parts.config);
    impl_->parts.load_path(model, path, latest_versions(impl_->parts, *impl_->registry, path));
    model->to(device);
    model->eval();
    it = impl_->models.emplace(path, std::move(model)).first;
  }
  return it->second;
}

}  // namespace loco::runtime
