#include "loco/runtime/simulate/simulate.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <tuple>

#include "loco/core/error.h"
#include "loco/core/run_folder.h"
#include "loco/data/dataset.h"
#include "loco/metrics/events.h"
#include "loco/metrics/progress.h"
#include "loco/runtime/config/links.h"

namespace loco::runtime {

void SimulationOptions::validate() const {
  const auto fail = [](const std::string& what) { throw ConfigError("simulate", what); };
  if (!(parameters > 0)) fail(fmt::format("the model needs parameters > 0, got {}", parameters));
  if (layers < 1) fail(fmt::format("the model needs layers >= 1, got {}", layers));
  if (!(step_s > 0)) fail(fmt::format("the step time must be > 0 s, got {}", step_s));
  if (workers < 1) fail(fmt::format("workers must be >= 1, got {}", workers));
  if (inner_steps < 1) fail(fmt::format("inner steps H must be >= 1, got {}", inner_steps));
  // More fragments than inner steps is allowed here (some steps then start several syncs), as the
  // published simulation has it; loco itself asks P <= H.
  if (algorithm == SimulatedAlgorithm::kStreaming && (fragments < 1 || fragments > layers)) {
    fail(fmt::format("fragments P must be in [1, layers = {}], got {}", layers, fragments));
  }
  if (overlap_steps < 0 || overlap_steps >= inner_steps) {
    fail(fmt::format("overlap steps must be in [0, H = {}), got {}", inner_steps, overlap_steps));
  }
  if (eager && (algorithm == SimulatedAlgorithm::kDdp || overlap_steps != 0)) {
    fail("eager updates are for diloco and streaming, with no overlap steps (they overlap a whole round)");
  }
  if (!(bits > 0)) fail(fmt::format("bits per value must be > 0, got {}", bits));
  if (!(bandwidth_bps > 0)) fail(fmt::format("the bandwidth must be > 0, got {}", bandwidth_bps));
  if (!(latency_s >= 0)) fail(fmt::format("the latency must be >= 0, got {}", latency_s));
  if (steps < 0) fail(fmt::format("steps must be >= 0, got {}", steps));
  if (!route.empty() && route != "gather" && route != "scatter") fail(fmt::format("route must be gather, scatter or empty, got '{}'", route));
  if (!(exchange_s_per_value >= 0 && sync_s_per_value >= 0 && outside_loop_s >= 0)) {
    fail("the machine's costs (exchange and sync seconds per value, time outside the loop) must be >= 0");
  }
}

double ring_all_reduce_s(double bytes, int64_t workers, double bandwidth_bps, double hop_latency_s) {
  if (workers <= 1) return 0;
  const double m = static_cast<double>(workers);
  return 2 * (m - 1) / m * bytes * 8 / bandwidth_bps + 2 * (m - 1) * hop_latency_s;
}

namespace {

// One all-reduce of `b` bytes on `o`'s transport: its seconds and the bytes each worker sends.
// `control`: a sync's, which on the Gloo ring started with the weights' all-reduce.
struct Cost {
  double seconds = 0, bytes = 0;
};
Cost all_reduce_cost(const SimulationOptions& o, double b, bool fp32, bool control) {
  using Transport = SimulationOptions::Transport;
  if (o.workers <= 1) return {};
  const double m = static_cast<double>(o.workers);
  const double ring_bytes = 2 * (m - 1) / m * b;
  if (o.transport == Transport::kDirect) {
    const Cost scatter{ring_bytes * 8 / o.bandwidth_bps + 3 * o.latency_s, ring_bytes};
    const Cost gather{(m - 1) * b * 8 / o.bandwidth_bps + 2 * o.latency_s, (m - 1) * b};
    if (o.route == "gather") return gather;
    if (o.route == "scatter") return scatter;
    if (o.workers == 2) return gather;
    if (!fp32 || (m - 1) * b > 64.0 * (1 << 20)) return scatter;  // as loco chooses (comm/group.h)
    return gather.seconds < scatter.seconds ? gather : scatter;
  }
  const double hop_s = o.transport == Transport::kGlooRing ? 2 * o.latency_s : o.latency_s;
  const double collectives =
      o.transport == Transport::kGlooRing && fp32 && o.bucket_bytes > 0 ? std::max(1.0, std::ceil(b / o.bucket_bytes)) : 1.0;
  double seconds = ring_all_reduce_s(b, o.workers, o.bandwidth_bps, 0) + collectives * ring_all_reduce_s(0, o.workers, o.bandwidth_bps, hop_s);
  if (control && o.transport == Transport::kGlooRing) seconds += ring_all_reduce_s(24, o.workers, o.bandwidth_bps, hop_s);
  return {seconds, ring_bytes};
}

}  // namespace

SimulationResult simulate(const SimulationOptions& o) {
  o.validate();
  const bool ddp = o.algorithm == SimulatedAlgorithm::kDdp;
  const int64_t h = ddp ? 1 : o.inner_steps;
  const int64_t p_count = o.algorithm == SimulatedAlgorithm::kStreaming ? o.fragments : 1;
  const int64_t tau = o.algorithm == SimulatedAlgorithm::kStreaming ? o.overlap_steps : 0;
  const int64_t total = o.steps > 0 ? o.steps : std::max<int64_t>(20 * h, 200);
  // One fragment's exchange, and the share of its last layer (what must follow the backward pass).
  const double bytes = o.parameters / static_cast<double>(p_count) * o.bits / 8;
  const double layers_per_fragment = std::max(1.0, static_cast<double>(o.layers) / static_cast<double>(p_count));
  const double values = o.parameters / static_cast<double>(p_count);
  Cost exchange = all_reduce_cost(o, bytes, o.bits >= 32, !ddp);
  exchange.seconds += o.exchange_s_per_value * values;
  const double tail_s = all_reduce_cost(o, bytes / layers_per_fragment, true, false).seconds;
  const double backward_s = o.step_s * 2 / 3;
  const double window_s = o.overlap_backward ? backward_s * (1 - 1 / static_cast<double>(o.layers)) : 0;

  struct Fragment {
    int64_t offset = 0, started = 0, due = 0, completed = -1;
    double finish = 0;
    bool pending = false;
  };
  std::vector<Fragment> fragments(static_cast<size_t>(p_count));
  for (int64_t p = 0; p < p_count; ++p) fragments[static_cast<size_t>(p)].offset = p * h / p_count;

  double t = 0, link_free = 0;
  SimulationResult result;
  const auto issue = [&](Fragment& f, int64_t step, int64_t due) {
    t += o.sync_s_per_value * values;  // the training thread's share, before the exchange starts
    const double start = o.concurrent_exchanges ? t - window_s : std::max(t - window_s, link_free);
    // DDP's last layer's gradients exist only once the backward pass ends (outer gradients are
    // whole when the exchange is issued).
    f.finish = std::max(start + exchange.seconds, o.overlap_backward && ddp ? t + tail_s : 0.0);
    link_free = f.finish;
    f.started = step;
    f.due = due;
    f.pending = true;
    result.bytes_sent += exchange.bytes;
  };
  int64_t step = 0;
  const auto wait = [&](Fragment& f) {
    t = std::max(t, f.finish);
    f.pending = false;
    f.completed = step;
  };
  for (step = 1; step <= total; ++step) {
    t += o.step_s;
    const bool last = step == total && o.final_sync;
    // As loco runs them (algorithms/streaming.cpp): results due now, then the syncs that start now
    // (at the end every fragment that trained since its last), then results due at once.
    if (!o.eager) {
      for (auto& f : fragments) {
        if (f.pending && f.due <= step) wait(f);
      }
    }
    for (auto& f : fragments) {
      const bool starts = step >= f.offset + h && (step - f.offset) % h == 0;
      if (!(starts || (last && f.started < step)) || (!o.eager && f.pending)) continue;
      // loco does not sync again a fragment whose result it applied exactly at the last step.
      if (!o.eager && last && !starts && f.completed == step) continue;
      if (o.eager) {
        if (f.pending) wait(f);  // the previous exchange, H steps old
        issue(f, step, step + h);
        if (last) {
          // loco's eager end: the last exchange, then the workers' θ averaged in fp32.
          wait(f);
          const Cost average = all_reduce_cost(o, o.parameters / static_cast<double>(p_count) * 4, true, false);
          t = std::max(t, link_free) + average.seconds;
          link_free = t;
          result.bytes_sent += average.bytes;
        }
      } else {
        issue(f, step, o.final_sync ? std::min(step + tau, total) : step + tau);
      }
    }
    if (!o.eager) {
      for (auto& f : fragments) {
        if (f.pending && f.due <= step) wait(f);
      }
    }
  }
  result.steps = total;
  result.wall_s = t;
  result.run_s = t + o.outside_loop_s;
  result.compute_s = static_cast<double>(total) * o.step_s;
  result.utilization = result.compute_s / result.wall_s;
  return result;
}

double bandwidth_for(SimulationOptions options, double target) {
  if (!(target > 0 && target <= 1)) throw ConfigError("simulate", fmt::format("a target utilization must be in (0, 1], got {}", target));
  const auto utilization = [&](double bandwidth) {
    options.bandwidth_bps = bandwidth;
    return simulate(options).utilization;
  };
  double lo = std::log(1e3), hi = std::log(1e14);
  if (utilization(std::exp(hi)) < target) return std::numeric_limits<double>::infinity();
  if (utilization(std::exp(lo)) >= target) return std::exp(lo);
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    (utilization(std::exp(mid)) >= target ? hi : lo) = mid;
  }
  return std::exp(hi);
}

namespace {

const char* algorithm_name(SimulatedAlgorithm algorithm) {
  switch (algorithm) {
    case SimulatedAlgorithm::kDdp: return "ddp";
    case SimulatedAlgorithm::kDiLoCo: return "diloco";
    case SimulatedAlgorithm::kStreaming: return "streaming";
  }
  return "?";
}

template <typename T>
T field(const nlohmann::json& json, const char* name) {
  if (!json.contains(name)) throw DataError("simulate", fmt::format("simulation JSON has no '{}'", name));
  try {
    return json.at(name).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw DataError("simulate", fmt::format("simulation JSON: '{}' has the wrong type", name));
  }
}

}  // namespace

const char* transport_name(SimulationOptions::Transport transport) {
  switch (transport) {
    case SimulationOptions::Transport::kDirect: return "direct";
    case SimulationOptions::Transport::kGlooRing: return "gloo-ring";
    case SimulationOptions::Transport::kIdeal: return "ideal";
  }
  return "?";
}

nlohmann::json to_json(const SimulationOptions& o) {
  return {{"parameters", o.parameters}, {"layers", o.layers}, {"step_s", o.step_s}, {"workers", o.workers},
          {"algorithm", algorithm_name(o.algorithm)}, {"inner_steps", o.inner_steps}, {"fragments", o.fragments},
          {"overlap_steps", o.overlap_steps}, {"eager", o.eager}, {"bits", o.bits}, {"bandwidth_bps", o.bandwidth_bps},
          {"latency_s", o.latency_s}, {"overlap_backward", o.overlap_backward}, {"final_sync", o.final_sync},
          {"concurrent_exchanges", o.concurrent_exchanges}, {"transport", transport_name(o.transport)}, {"route", o.route},
          {"bucket_bytes", o.bucket_bytes}, {"steps", o.steps}, {"exchange_s_per_value", o.exchange_s_per_value},
          {"sync_s_per_value", o.sync_s_per_value}, {"outside_loop_s", o.outside_loop_s}};
}

SimulationOptions simulation_options_from_json(const nlohmann::json& j) {
  SimulationOptions o;
  o.parameters = field<double>(j, "parameters");
  o.layers = field<int64_t>(j, "layers");
  o.step_s = field<double>(j, "step_s");
  o.workers = field<int64_t>(j, "workers");
  const auto algorithm = field<std::string>(j, "algorithm");
  if (algorithm == "ddp") o.algorithm = SimulatedAlgorithm::kDdp;
  else if (algorithm == "diloco") o.algorithm = SimulatedAlgorithm::kDiLoCo;
  else if (algorithm == "streaming") o.algorithm = SimulatedAlgorithm::kStreaming;
  else throw DataError("simulate", fmt::format("simulation JSON: unknown algorithm '{}'", algorithm));
  o.inner_steps = field<int64_t>(j, "inner_steps");
  o.fragments = field<int64_t>(j, "fragments");
  o.overlap_steps = field<int64_t>(j, "overlap_steps");
  o.eager = field<bool>(j, "eager");
  o.bits = field<double>(j, "bits");
  o.bandwidth_bps = field<double>(j, "bandwidth_bps");
  o.latency_s = field<double>(j, "latency_s");
  o.overlap_backward = field<bool>(j, "overlap_backward");
  o.final_sync = field<bool>(j, "final_sync");
  o.concurrent_exchanges = field<bool>(j, "concurrent_exchanges");
  // Entries written before the direct transport say "gloo": true for the Gloo ring, false for ideal.
  if (j.contains("route")) o.route = field<std::string>(j, "route");
  if (j.contains("transport")) {
    const auto transport = field<std::string>(j, "transport");
    if (transport == "direct") o.transport = SimulationOptions::Transport::kDirect;
    else if (transport == "gloo-ring") o.transport = SimulationOptions::Transport::kGlooRing;
    else if (transport == "ideal") o.transport = SimulationOptions::Transport::kIdeal;
    else throw DataError("simulate", fmt::format("simulation JSON: unknown transport '{}'", transport));
  } else {
    o.transport = field<bool>(j, "gloo") ? SimulationOptions::Transport::kGlooRing : SimulationOptions::Transport::kIdeal;
  }
  o.bucket_bytes = field<double>(j, "bucket_bytes");
  o.steps = field<int64_t>(j, "steps");
  if (j.contains("exchange_s_per_value")) {  // written since the machine's costs were fitted
    o.exchange_s_per_value = field<double>(j, "exchange_s_per_value");
    o.sync_s_per_value = field<double>(j, "sync_s_per_value");
    o.outside_loop_s = field<double>(j, "outside_loop_s");
  }
  return o;
}

nlohmann::json to_json(const SimulationResult& r) {
  return {{"wall_s", r.wall_s}, {"run_s", r.run_s}, {"compute_s", r.compute_s}, {"utilization", r.utilization}, {"bytes_sent", r.bytes_sent},
          {"steps", r.steps}};
}

nlohmann::json to_json(const MeasuredRun& m) {
  return {{"step_s", m.step_s}, {"loop_s", m.loop_s}, {"utilization", m.utilization}, {"end_to_end", m.end_to_end},
          {"bytes_sent", m.bytes_sent}, {"steps", m.steps}, {"workers", m.workers}, {"wall_s", m.wall_s},
          {"compute_s", m.compute_s}, {"stall_s", m.stall_s}, {"syncs", m.syncs}, {"sync_median_s", m.sync_median_s}};
}

MeasuredRun measured_run_from_json(const nlohmann::json& j) {
  MeasuredRun m;
  m.step_s = field<double>(j, "step_s");
  m.loop_s = field<double>(j, "loop_s");
  m.utilization = field<double>(j, "utilization");
  m.end_to_end = field<double>(j, "end_to_end");
  m.bytes_sent = field<double>(j, "bytes_sent");
  m.steps = field<int64_t>(j, "steps");
  m.workers = field<int64_t>(j, "workers");
  if (j.contains("sync_median_s")) {
    m.wall_s = field<double>(j, "wall_s");
    m.compute_s = field<double>(j, "compute_s");
    m.stall_s = field<double>(j, "stall_s");
    m.syncs = field<double>(j, "syncs");
    m.sync_median_s = field<double>(j, "sync_median_s");
  }
  return m;
}

SimulationOptions simulation_options(const RunConfig& config) {
  SimulationOptions o;
  o.parameters = static_cast<double>(model::parameter_count(config.model));
  o.layers = config.model.layers;
  o.workers = config.cluster.workers;
  o.steps = config.train.steps;
  o.inner_steps = config.sync.inner_steps;
  switch (config.sync.algorithm) {
    case Algorithm::kDdp: o.algorithm = SimulatedAlgorithm::kDdp; break;
    case Algorithm::kDiLoCo: o.algorithm = SimulatedAlgorithm::kDiLoCo; break;
    case Algorithm::kStreaming:
      o.algorithm = SimulatedAlgorithm::kStreaming;
      o.fragments = config.sync.fragments;
      o.overlap_steps = config.sync.overlap_steps;
      break;
    default:
      throw ConfigError("simulate", fmt::format("sync.algorithm = \"{}\" does not communicate over a link: simulate "
                                                "ddp, diloco or streaming", to_string(config.sync.algorithm)));
  }
  o.eager = config.sync.eager;
  const std::map<comm::Encoding, double> bits = {{comm::Encoding::kFp32, 32}, {comm::Encoding::kBf16, 16},
                                                  {comm::Encoding::kFp8, 8},   {comm::Encoding::kE3M0, 4},
                                                  {comm::Encoding::kInt8, 8},  {comm::Encoding::kInt4, 4}};
  o.bits = o.algorithm == SimulatedAlgorithm::kDdp ? 32 : bits.at(config.sync.exchange);
  o.bucket_bytes = config.sync.bucket_mb * 1e6;
  // A ring runs at its slowest link: the least shaped rate and the longest delay of the workers'.
  const auto plan = LinkPlan::from_config(config.link, {}, config.cluster.workers);
  o.bandwidth_bps = 0;
  o.latency_s = 0;
  for (int64_t r = 0; r < config.cluster.workers; ++r) {
    const auto link = plan.for_worker(r);
    if (link.rate_bps > 0) o.bandwidth_bps = o.bandwidth_bps > 0 ? std::min(o.bandwidth_bps, link.rate_bps) : link.rate_bps;
    o.latency_s = std::max(o.latency_s, link.delay_s);
  }
  return o;
}

MeasuredRun measure_run(const std::filesystem::path& run) {
  const RunFolder folder(run);
  if (!std::filesystem::exists(folder.metrics())) {
    throw DataError("simulate", fmt::format("{} holds no metrics.jsonl: not a finished run", run.string()));
  }
  std::map<int64_t, metrics::TrainSummary> last;  // each worker's last summary
  bool direct = false;
  std::map<std::string, int64_t> routes;
  std::vector<double> sync_s;
  for (const auto& [time, event] : metrics::read_events(folder.metrics())) {
    if (const auto* s = std::get_if<metrics::SummaryEvent>(&event)) last[s->worker.rank] = s->summary;
    if (const auto* s = std::get_if<metrics::SyncEvent>(&event)) sync_s.push_back(s->seconds);
    if (const auto* s = std::get_if<metrics::SyncEvent>(&event); s != nullptr && !s->route.empty()) {
      direct = true;
      routes[s->route] += 1;
    }
    if (const auto* s = std::get_if<metrics::StartEvent>(&event); s != nullptr && s->resumed) {
      throw DataError("simulate", fmt::format("{} was resumed: its summaries time its last session only; compare with a run "
                                              "trained in one go", run.string()));
    }
  }
  if (last.empty()) throw DataError("simulate", fmt::format("{}/metrics.jsonl has no worker summary: the run did not finish", run.string()));
  MeasuredRun m;
  for (const auto& [worker, s] : last) {
    if (s.steps <= 0 || s.compute_s <= 0 || s.compute_utilization <= 0) {
      throw DataError("simulate", fmt::format("{}: worker {}'s summary has no compute time (a run from before loco measured it?)",
                                              run.string(), worker));
    }
    m.step_s = std::max(m.step_s, s.compute_s / static_cast<double>(s.steps));
    m.loop_s += s.compute_s / s.compute_utilization;
    m.utilization += s.compute_utilization;
    m.end_to_end += s.end_to_end_utilization;
    m.bytes_sent += static_cast<double>(s.bytes_sent);
    m.steps = std::max(m.steps, s.steps);
    m.wall_s += s.wall_s;
    m.compute_s += s.compute_s;
    m.stall_s += s.stall_s;
  }
  const double n = static_cast<double>(last.size());
  m.workers = static_cast<int64_t>(last.size());
  for (double* mean : {&m.loop_s, &m.utilization, &m.end_to_end, &m.bytes_sent, &m.wall_s, &m.compute_s, &m.stall_s}) *mean /= n;
  m.syncs = static_cast<double>(sync_s.size()) / n;
  if (!sync_s.empty()) {
    std::nth_element(sync_s.begin(), sync_s.begin() + static_cast<std::ptrdiff_t>(sync_s.size() / 2), sync_s.end());
    m.sync_median_s = sync_s[sync_s.size() / 2];
  }
  m.direct = direct;
  int64_t most = 0;
  for (const auto& [route, count] : routes) {
    if (count > most) std::tie(m.route, most) = std::tie(route, count);
  }
  return m;
}

void fit_machine_costs(SimulationOptions& options, const MeasuredRun& ideal) {
  if (!(ideal.syncs > 0 && ideal.sync_median_s > 0 && ideal.wall_s > 0)) {
    throw DataError("simulate", "the run to fit the machine's costs on recorded no timed syncs (a run of loco from before "
                                "they were timed, or one that never synchronized)");
  }
  const double values = options.parameters / static_cast<double>(options.algorithm == SimulatedAlgorithm::kStreaming ? options.fragments : 1);
  options.exchange_s_per_value = ideal.sync_median_s / values;
  options.sync_s_per_value = std::max(0.0, ideal.loop_s - ideal.compute_s - ideal.stall_s) / ideal.syncs / values;
  options.outside_loop_s = std::max(0.0, ideal.wall_s - ideal.loop_s);
}

PreparedSimulation prepare_simulation(RunConfig config, const SimulationRequest& request) {
  // The model's size from the dataset's vocabulary, as training takes it; --params sets it instead.
  if (request.params > 0) {
    if (config.model.vocab_size == 0) config.model.vocab_size = 1;
  } else {
    config = resolve_for_dataset(config, data::read_manifest(config.data.dir));
  }
  PreparedSimulation out;
  auto& o = out.options;
  o = simulation_options(config);
  if (request.params > 0) o.parameters = request.params;
  if (request.layers > 0) o.layers = request.layers;
  if (!request.link.empty()) {
    const auto spec = LinkSpec::parse(request.link);
    o.bandwidth_bps = spec.rate_bps;
    o.latency_s = spec.delay_s;
  }
  o.overlap_backward = request.overlap_backward;
  o.final_sync = !request.steady_state;
  if (!request.run_dir.empty()) {
    out.measured = measure_run(request.run_dir);
    out.run = request.run_dir.filename().string();
    o.steps = out.measured->steps;  // the steps it ran, which its measurements cover
    if (!out.measured->direct) o.transport = SimulationOptions::Transport::kGlooRing;  // a run from before
    if (out.measured->route == "gather" || out.measured->route == "scatter") o.route = out.measured->route;
  }
  if (!request.fit_run.empty()) {
    fit_machine_costs(o, measure_run(request.fit_run));
    out.fitted_on = request.fit_run.string();
  }
  out.step_source = "--step-time";
  if (request.step_s > 0) {
    o.step_s = request.step_s;
  } else if (request.flops > 0) {
    const int64_t tokens = config.train.batch_size * config.train.grad_accum * config.model.context;
    o.step_s = 6 * o.parameters * static_cast<double>(tokens) / request.flops;
    out.step_source = fmt::format("6 x {:.3g} parameters x {} tokens / {:.3g} FLOP/s", o.parameters, tokens, request.flops);
  } else if (out.measured) {
    o.step_s = out.measured->step_s;
    out.step_source = fmt::format("measured: the slowest worker's compute time / {} steps", out.measured->steps);
  } else {
    throw ConfigError("simulate", "give the step time: --step-time SECONDS, --flops FLOP/s, or --from-run RUN");
  }
  return out;
}

nlohmann::json simulation_json(const PreparedSimulation& prepared, const std::vector<double>& targets) {
  const auto& o = prepared.options;
  nlohmann::json out = {{"options", to_json(o)}};
  nlohmann::json needed = nlohmann::json::array();
  for (double target : targets) {
    const double bps = bandwidth_for(o, target);
    needed.push_back({{"utilization", target}, {"bandwidth_bps", std::isinf(bps) ? nlohmann::json(nullptr) : nlohmann::json(bps)}});
  }
  out["bandwidth_needed"] = needed;
  if (o.bandwidth_bps > 0) out["predicted"] = to_json(simulate(o));
  if (prepared.measured) out["measured"] = to_json(*prepared.measured);
  if (!prepared.run.empty()) out["run"] = prepared.run;
  if (!prepared.fitted_on.empty()) out["fitted_on"] = prepared.fitted_on;
  return out;
}

std::string describe_simulation(const PreparedSimulation& prepared, const std::vector<double>& targets) {
  const auto& o = prepared.options;
  std::string method = algorithm_name(o.algorithm);
  if (o.algorithm != SimulatedAlgorithm::kDdp) method += fmt::format(" H={}", o.inner_steps);
  if (o.algorithm == SimulatedAlgorithm::kStreaming) method += fmt::format(" P={} tau={}", o.fragments, o.overlap_steps);
  if (o.eager) method += " eager";
  std::string out = fmt::format("model {:.4g} parameters, {} layers; step {:.4g} s ({}); {} workers; {}, {:g} bits per value; "
                                "{} steps\n", o.parameters, o.layers, o.step_s, prepared.step_source, o.workers, method,
                                o.bits, o.steps);
  if (o.bandwidth_bps > 0) {
    const auto r = simulate(o);
    out += fmt::format("over {}, {}: compute utilization {:.1f}%, {} for the steps ({} computing), {} sent per worker\n",
                       LinkSpec{o.bandwidth_bps, o.latency_s}.describe(),
                       o.overlap_backward ? "overlapping the backward pass" : "as loco runs it", 100 * r.utilization,
                       metrics::format_duration(r.wall_s), metrics::format_duration(r.compute_s),
                       metrics::format_bytes(r.bytes_sent));
    if (!prepared.fitted_on.empty()) {
      out += fmt::format("with this machine's costs fitted on {}: exchanges {:.3g} ns and syncs {:.3g} ns of compute per value, "
                         "{} outside the training loop: the run {}\n", prepared.fitted_on, o.exchange_s_per_value * 1e9,
                         o.sync_s_per_value * 1e9, metrics::format_duration(o.outside_loop_s), metrics::format_duration(r.run_s));
    }
    if (const auto& m = prepared.measured) {
      out += fmt::format("measured by {}: compute utilization {:.1f}% in the training loop ({}), {:.1f}% end to end; {} sent "
                         "per worker; predicted / measured loop time {:.2f}\n",
                         prepared.run, 100 * m->utilization, metrics::format_duration(m->loop_s), 100 * m->end_to_end,
                         metrics::format_bytes(m->bytes_sent), r.wall_s / m->loop_s);
      if (!prepared.fitted_on.empty() && m->wall_s > 0) {
        out += fmt::format("predicted / measured wall time {:.2f} ({} against {})\n", r.run_s / m->wall_s,
                           metrics::format_duration(r.run_s), metrics::format_duration(m->wall_s));
      }
    }
  }
  if (o.workers == 1) return out + "one worker: no link is needed\n";
  out += fmt::format("bandwidth needed ({:g} ms one-way):", o.latency_s * 1e3);
  for (double target : targets) {
    const double needed = bandwidth_for(o, target);
    out += fmt::format("  {:g}%: {}", 100 * target, std::isinf(needed) ? std::string("unreachable") : format_bandwidth(needed));
  }
  return out + "\n(unreachable: part of each exchange costs time no bandwidth removes: its latency, or a wait no overlap "
               "hides)\n";
}

}  // namespace loco::runtime
