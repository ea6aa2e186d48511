// `loco simulate`: the compute utilization and wall time a run should get over a link, from its
// model, its step time, its workers, its algorithm and the link, by replaying the run's schedule of
// computation and communication step by step (the Streaming DiLoCo paper's kind of simulator,
// arXiv 2501.18512; docs/slow-links.md). And the inverse: the bandwidth a target utilization needs.
//
// The model of time:
//   - each inner step computes for `step_s` seconds (forward a third, backward two thirds, spread
//     evenly over the layers);
//   - an all-reduce of B bytes over M workers costs its bytes at the bandwidth plus its delays, by
//     the transport (SimulationOptions::Transport: loco's direct all-reduce, 2 or 3 one-way delays;
//     the Gloo ring loco used before, 2(M − 1) round trips; an ideal ring, 2(M − 1) one-way hops);
//     each worker's link carries one at a time, in the order they were issued;
//   - DDP all-reduces every step's gradients after the backward pass and waits for them; DiLoCo
//     every H steps its outer gradients, waiting at once; Streaming DiLoCo one fragment (1/P of
//     the parameters) every H/P steps, waiting τ steps later; eager updates wait for a fragment's
//     exchange only at its next sync (H steps later), and at the run's end for everything;
//   - with `overlap_backward` (the papers' assumption, not loco's implementation), an exchange
//     issued at a step's end may start during that step's backward pass (all of it but the first
//     layer's), and DDP's last layer's share of the gradients still goes after the backward ends.
// Left out unless fitted (`--fit`, below): the CPU the exchange itself takes, the training thread's
// share of a sync, and the time outside the training loop (start-up, evaluation, the end).
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loco/runtime/config/config.h"

namespace loco::runtime {

enum class SimulatedAlgorithm { kDdp, kDiLoCo, kStreaming };

struct SimulationOptions {
  double parameters = 0;          // N
  int64_t layers = 1;             // L (the blocks)
  double step_s = 0;              // compute of one inner step, seconds
  int64_t workers = 2;            // M
  SimulatedAlgorithm algorithm = SimulatedAlgorithm::kDiLoCo;
  int64_t inner_steps = 50;       // H
  int64_t fragments = 1;          // P (streaming)
  int64_t overlap_steps = 0;      // τ (streaming)
  bool eager = false;             // eager outer updates (diloco, streaming)
  double bits = 32;               // bits per value on the wire (DDP's gradients; outer gradients)
  double bandwidth_bps = 1e9;     // each worker's link, bits per second
  double latency_s = 0;           // one-way
  bool overlap_backward = false;
  // The run's end: the last step synchronizes every fragment at once (and eager updates wait for
  // everything, then average θ), as loco ends a run. false: the steady state alone.
  bool final_sync = true;
  // How an exchange crosses the link:
  //   kDirect   loco's transport (comm/group.h): one direct all-reduce per exchange, whatever its
  //             size, every receive posted first; a gather costs (M − 1)·B bytes and 2 one-way
  //             delays, a scatter 2(M − 1)/M·B and 3; as loco chooses, a gather at M = 2, a
  //             scatter for an encoded exchange at M > 2, and for fp32 the faster of the two (a
  //             gather only while the others' tensors take at most 64 MiB); the weights ride with
  //             the data.
  //   kGlooRing loco's transport before (runs without a "route" in their sync events): Gloo's
  //             TCP pairs send a buffer only once the receiver has announced it, so each of a ring's
  //             2(M − 1) hops costs a round trip; each DiLoCo or Streaming DiLoCo sync starts with a
  //             small all-reduce of the workers' weights, a ring of its own; fp32 exchanges go in
  //             buckets of `bucket_bytes`, each with its own hops.
  //   kIdeal    a ring with one-way hops and nothing else (the published simulations' model).
  enum class Transport { kDirect, kGlooRing, kIdeal };
  Transport transport = Transport::kDirect;
  // kDirect: the route every exchange takes ("gather", "scatter"), or "" for the faster (loco's
  // choice once it knows the goodput); `--from-run` takes the one its run took most.
  std::string route;
  double bucket_bytes = 32e6;     // kGlooRing: bytes per fp32 bucket; 0 = one
  // false: exchanges share each worker's link one at a time (loco's one background thread); true:
  // each runs at the full bandwidth whatever else is on the wire (an idealized link).
  bool concurrent_exchanges = false;
  int64_t steps = 0;              // steps replayed; 0 = max(20 H, 200)
  // The machine's own costs of a sync, beyond the link (0: left out, as the published simulations
  // leave them); fit_machine_costs measures them on a run of the same setup over no link:
  double exchange_s_per_value = 0;  // the exchange's compute (encode, sum, decode), in series with its bytes
  double sync_s_per_value = 0;      // the training thread's work for a sync (copies, outer step, merge)
  double outside_loop_s = 0;        // the run's time outside its training loop, added to the wall time
  void validate() const;          // ConfigError naming the bad option
};

const char* transport_name(SimulationOptions::Transport transport);  // "direct", "gloo-ring", "ideal"

struct SimulationResult {
  double wall_s = 0;              // the replayed steps' wall time
  double run_s = 0;               // the whole run's: wall_s + SimulationOptions::outside_loop_s
  double compute_s = 0;           // steps × step_s
  double utilization = 0;         // compute_s / wall_s
  double bytes_sent = 0;          // per worker, over the replayed steps
  int64_t steps = 0;
};

// Seconds of a ring all-reduce of `bytes` (the model above; `hop_latency_s` per hop); 0 for one worker.
double ring_all_reduce_s(double bytes, int64_t workers, double bandwidth_bps, double hop_latency_s);

SimulationResult simulate(const SimulationOptions& options);

// The least bandwidth (bits/s) at which `options` reaches `target` utilization (bisection over
// log bandwidth between 1 kbit/s and 100 Tbit/s); +infinity when even that does not (latency
// alone can forbid it).
double bandwidth_for(SimulationOptions options, double target);

// Options and measurements as JSON (what `loco simulate --json` prints and the tests read back).
nlohmann::json to_json(const SimulationOptions& options);
SimulationOptions simulation_options_from_json(const nlohmann::json& json);  // DataError on a missing field
nlohmann::json to_json(const SimulationResult& result);

// The simulation of `config`'s run: its model's parameters and blocks, workers, algorithm (DDP sends
// fp32 gradients; DiLoCo and Streaming DiLoCo their sync.exchange's bits), H, P, τ, eager, steps,
// and the link of its [link] section (bandwidth 0 when it sets no rate). The step time is left 0.
SimulationOptions simulation_options(const RunConfig& config);

// What a finished run measured, from RUN/metrics.jsonl's summaries: the step time of its slowest
// worker (compute_s / steps; every method waits for the slowest at a sync, so it sets the pace),
// and the workers' means of the seconds in the training loop (compute_s / compute_utilization),
// the compute utilization there and end to end, and the bytes each worker sent. Throws DataError
// when the run has no summaries.
struct MeasuredRun {
  double step_s = 0, loop_s = 0, utilization = 0, end_to_end = 0, bytes_sent = 0;
  // The workers' means of their wall, compute and stall seconds and of their syncs, and the median
  // of every sync's seconds from its start to its completion (0 in JSON written before them).
  double wall_s = 0, compute_s = 0, stall_s = 0, syncs = 0, sync_median_s = 0;
  int64_t steps = 0, workers = 0;
  bool direct = false;  // its syncs name their route: it ran on the direct transport (kDirect)
  std::string route;    // the route its syncs took most
};
MeasuredRun measure_run(const std::filesystem::path& run);

// Sets `options`' machine costs (exchange_s_per_value, sync_s_per_value, outside_loop_s) from
// `ideal`, a run of the same setup over no emulated link, where a sync's time is its compute: the
// median sync's seconds per value exchanged, the training loop's time beyond computing and waiting
// per sync and value, and the wall time beyond the loop. DataError when `ideal` has no syncs.
void fit_machine_costs(SimulationOptions& options, const MeasuredRun& ideal);
nlohmann::json to_json(const MeasuredRun& measured);
MeasuredRun measured_run_from_json(const nlohmann::json& json);

// What `loco simulate` is asked: a config's run (or a finished run's, `run_dir`), over a link,
// with a step time given, derived from FLOP/s, or measured by the finished run.
struct SimulationRequest {
  std::filesystem::path run_dir;  // a finished run: its measured step time and what it measured
  std::string link;               // "rate=...,delay=..." over the config's [link]; "" keeps it
  double step_s = 0, flops = 0;   // seconds per inner step; or the device's FLOP/s
  double params = 0;              // the model's parameters instead of the config's (0: the config's)
  int64_t layers = 0;             // ... and its layers
  bool overlap_backward = false, steady_state = false;
  std::filesystem::path fit_run;  // a run of the same setup over no link: the machine's costs (fit_machine_costs)
};

struct PreparedSimulation {
  SimulationOptions options;
  std::optional<MeasuredRun> measured;  // with a run_dir
  std::string step_source;              // where the step time came from, in words
  std::string run;                      // the finished run's folder name ("" without one)
  std::string fitted_on;                // the run the machine's costs were fitted on ("" without)
};

// The options for `config` (model.vocab_size = 0 read from the dataset unless `params` sets the
// size) under `request`. Throws ConfigError when no step time can be had, DataError for a run
// folder that holds no finished run.
PreparedSimulation prepare_simulation(RunConfig config, const SimulationRequest& request);
// `loco simulate --json`: the options, the bandwidth needed for each of `targets`, the prediction
// (when the link has a rate) and the measurement.
nlohmann::json simulation_json(const PreparedSimulation& prepared, const std::vector<double>& targets);
// `loco simulate`'s text: the setting, the prediction against the measurement, and the bandwidth
// each of `targets` needs.
std::string describe_simulation(const PreparedSimulation& prepared, const std::vector<double>& targets);

// The published simulations this one is checked against: the Streaming DiLoCo paper's (Douillard
// et al. 2025, arXiv 2501.18512, Table 4: Data-Parallel, DiLoCo, Streaming DiLoCo with τ = 0, with
// τ = 1 inner step, and with τ = 1 in FP4), and Kale et al. 2025 (arXiv 2502.12996, Table 5), which
// repeats three of those rows and adds FP4 exchanges overlapped by τ = 1 at H = 30 and by a whole
// outer step (eager) at H = 30 and 100. Gbit/s needed for 50, 80, 90, 95 and 99% compute
// utilization; models of 1B, 10B and 100B parameters (24, 48, 108 layers; steps of 0.1, 0.8, 4.9 s
// at 60% MFU); H = 100 unless the method says 30; fragments of 3 layers (8, 16 and 36 of them, the
// paper's appendix, whatever H). Each value is, evidently, the first of 50 log-spaced bandwidths
// from 0.1 to 1000 Gbit/s that reaches the target (every value lies within 7% of one of them,
// printed with one decimal).
struct PublishedRow {
  std::string model;
  double parameters = 0;
  int64_t layers = 0;
  double step_s = 0;
  std::string method;
  std::string tables;         // where it is published: "Douillard T4", "Kale T5" or both
  std::vector<double> gbits;  // for kPublishedTargets
};
extern const std::vector<double> kPublishedTargets;  // 0.5, 0.8, 0.9, 0.95, 0.99
const std::vector<PublishedRow>& published_simulation();
// The options that reproduce a row's setting: 2 workers (two datacenters), bf16 (16 bits) for
// Data-Parallel and Streaming DiLoCo, 4 bits for FP4, exchanges overlapping the backward pass, no
// latency, the steady state (no end of run).
SimulationOptions published_options(const PublishedRow& row);
// `gbits` rounded up to the published grid (logspace(-1, 3, 50) Gbit/s).
double on_published_grid(double gbits);
// The place on that grid nearest to `gbits` (0..49; 50 for infinity): a published value (printed
// with one decimal) and ours rounded up to the grid lie within one grid step when their places
// differ by at most 1.
int published_grid_index(double gbits);
// `loco simulate --published`: every published row against ours, as a Markdown table.
std::string published_comparison_markdown();

}  // namespace loco::runtime
