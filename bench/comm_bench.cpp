// loco-bench-comm: the cost of the wire encodings (comm/encoding.h) and of the encoded all-reduce
// (Group::all_reduce_sum with an encoding) against Gloo's own fp32 all-reduce of the same tensor.
//
//   build/loco-bench-comm [--values 4194304] [--ranks 4 [8 16...]] [--rounds 5] [--threads 1] [--json]
//                         [--data-plane open|authenticated|encrypted] [--combine sum|median|trimmed]
//
// 1. encode and decode throughput of each format, in GB/s of fp32 input, on one thread (the
//    vector target Highway chose is named), and the round trip's relative L2 error;
// 2. for each rank count M, the all-reduce of `values` fp32 numbers across M ranks (threads of
//    this process, each with its own Gloo group over 127.0.0.1, as in the tests), every format
//    with the algorithm kAuto picks, plus gather, scatter and ring for e3m0: median wall time,
//    bytes each rank sent, the relative L2 error of the result against the fp32 sum of the
//    inputs, and the link speed below which the format's all-reduce would beat fp32's (where the
//    bytes it saves take longer on the wire than its encoding costs).
// Loopback moves bytes at memory speed; the last column says where fp32 stops winning.
// --data-plane seals every message of the all-reduces (comm::DataPlane, a random secret): run it
// once with each and compare the times, for what sealing costs a sync (docs/benchmarks.md).
// --combine takes every all-reduce's terms by their median or trimmed mean (comm::Combine, the
// outer gradients' robust means) instead of summing them: run it with each and compare the times.
// --json prints one JSON line per measurement instead of the tables.
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <exception>
#include <thread>

#include "loco/comm/codec_kernels.h"
#include "loco/comm/encoding.h"
#include "loco/comm/group.h"
#include "loco/comm/key_value.h"
#include "loco/core/crypto.h"
#include "loco/core/error.h"

using Clock = std::chrono::steady_clock;
using loco::comm::Encoding;
using loco::comm::ReduceAlgorithm;

namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double relative_error(const torch::Tensor& got, const torch::Tensor& exact) {
  return ((got - exact).norm() / exact.norm()).item<double>();
}

constexpr Encoding kEncodings[] = {Encoding::kFp32, Encoding::kBf16, Encoding::kFp8,
                                   Encoding::kE3M0, Encoding::kInt8, Encoding::kInt4};

// Outer gradients look Gaussian: each rank's input is drawn from its own generator.
torch::Tensor input_of(int64_t rank, int64_t values) {
  auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(rank) + 1);
  return torch::randn({values}, generator) * 1e-3;
}

void bench_codecs(int64_t values, int rounds, bool json) {
  auto input = input_of(0, values);
  const double gigabytes = static_cast<double>(values) * 4 / 1e9;
  if (!json) {
    fmt::print("encode / decode of {} fp32 values ({:.0f} MB) on one thread ({}), median of {} rounds\n\n", values,
               gigabytes * 1e3, loco::comm::kernels::vector_target(), rounds);
    fmt::print("| format | bytes | vs fp32 | encode GB/s | decode GB/s | round-trip error |\n|---|---|---|---|---|---|\n");
  }
  for (auto encoding : kEncodings) {
    std::vector<double> encode_times, decode_times;
    torch::Tensor encoded;
    auto out = torch::zeros({values});
    for (int r = 0; r <= rounds; ++r) {  // round 0 warms up
      auto start = Clock::now();
      encoded = loco::comm::encode(input, encoding);
      const double encode_seconds = seconds_since(start);
      start = Clock::now();
      loco::comm::decode_add(encoded, encoding, out);
      const double decode_seconds = seconds_since(start);
      if (r > 0) encode_times.push_back(encode_seconds), decode_times.push_back(decode_seconds);
    }
    const int64_t bytes = loco::comm::encoded_bytes(encoding, values);
    const double error = relative_error(loco::comm::decode(encoded, encoding, values), input);
    const double encode_rate = gigabytes / median(encode_times), decode_rate = gigabytes / median(decode_times);
    if (json) {
      fmt::print("{}\n", nlohmann::json{{"kind", "codec"}, {"format", loco::comm::to_string(encoding)},
                                        {"target", loco::comm::kernels::vector_target()}, {"values", values},
                                        {"bytes", bytes}, {"encode_gbps", encode_rate}, {"decode_gbps", decode_rate},
                                        {"relative_error", error}}.dump());
    } else {
      fmt::print("| {} | {} | {:.2f}x fewer | {:.2f} | {:.2f} | {:.4f} |\n", loco::comm::to_string(encoding), bytes,
                 static_cast<double>(values) * 4 / static_cast<double>(bytes), encode_rate, decode_rate, error);
    }
  }
}

struct Variant {
  Encoding encoding;
  ReduceAlgorithm algorithm;
};

const char* algorithm_name(ReduceAlgorithm algorithm, Encoding encoding, int64_t ranks) {
  if (encoding == Encoding::kFp32) return "gloo";
  if (algorithm == ReduceAlgorithm::kAuto) algorithm = ranks > 2 ? ReduceAlgorithm::kScatter : ReduceAlgorithm::kGather;
  return loco::comm::to_string(algorithm);
}

void bench_all_reduce(int64_t values, int64_t ranks, int rounds, bool json, loco::comm::DataPlane plane,
                      loco::comm::Combine combine) {
  std::vector<Variant> variants;
  for (auto encoding : kEncodings) variants.push_back({encoding, ReduceAlgorithm::kAuto});
  for (auto algorithm : {ReduceAlgorithm::kGather, ReduceAlgorithm::kScatter, ReduceAlgorithm::kRing}) {
    if (std::string(algorithm_name(algorithm, Encoding::kE3M0, ranks)) != algorithm_name(ReduceAlgorithm::kAuto, Encoding::kE3M0, ranks)) {
      variants.push_back({Encoding::kE3M0, algorithm});
    }
  }

  // times[v][round] on rank 0 (the slowest rank decides when an all-reduce is over; every rank
  // leaves within one message of the others), bytes[v] sent by rank 0 in one all-reduce, and
  // rank 0's result (every rank holds the same).
  std::vector<std::vector<double>> times(variants.size());
  std::vector<int64_t> bytes(variants.size());
  std::vector<torch::Tensor> results(variants.size());
  auto store = std::make_shared<loco::comm::MemoryKeyValueStore>();
  const std::string secret = loco::random_bytes(32);
  std::barrier sync(ranks);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        loco::comm::GroupOptions options;
        options.rank = rank;
        options.size = ranks;
        options.timeout = std::chrono::seconds(120);
        options.data_plane = plane;
        options.secret = secret;
        auto group = loco::comm::Group::connect(store, options);
        const auto input = input_of(rank, values);
        for (size_t v = 0; v < variants.size(); ++v) {
          for (int r = 0; r <= rounds; ++r) {
            auto t = input.clone();
            sync.arrive_and_wait();
            auto start = Clock::now();
            loco::comm::ReduceOptions reduce{variants[v].encoding, variants[v].algorithm};
            reduce.combine = combine;
            auto stats = group.all_reduce_sum(t, reduce);
            const double elapsed = seconds_since(start);
            if (rank == 0 && r > 0) times[v].push_back(elapsed), bytes[v] = stats.bytes_sent, results[v] = t;
          }
        }
      } catch (...) {
        errors[static_cast<size_t>(rank)] = std::current_exception();
        sync.arrive_and_drop();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  auto exact = torch::zeros({values}, torch::kFloat64);
  for (int64_t rank = 0; rank < ranks; ++rank) exact += input_of(rank, values).to(torch::kFloat64);

  if (!json) {
    fmt::print("\nall-reduce of {} fp32 values ({:.0f} MB) across {} ranks on 127.0.0.1, data plane {}, combine {}, median of {} "
               "rounds\n\n", values, static_cast<double>(values) * 4 / 1e6, ranks, loco::comm::to_string(plane),
               loco::comm::to_string(combine), rounds);
    fmt::print("| format | algorithm | ms | MB sent per rank | vs fp32 time | error vs fp32 sum | wins below (MB/s per rank) |\n");
    fmt::print("|---|---|---|---|---|---|---|\n");
  }
  const double fp32_seconds = median(times[0]);
  const auto fp32_bytes = static_cast<double>(bytes[0]);
  for (size_t v = 0; v < variants.size(); ++v) {
    const double t = median(times[v]);
    const double error = relative_error(results[v].to(torch::kFloat64), exact);
    const char* algorithm = algorithm_name(variants[v].algorithm, variants[v].encoding, ranks);
    const double saved_bytes = fp32_bytes - static_cast<double>(bytes[v]), extra_seconds = t - fp32_seconds;
    if (json) {
      nlohmann::json line{{"kind", "all_reduce"}, {"format", loco::comm::to_string(variants[v].encoding)},
                          {"algorithm", algorithm}, {"ranks", ranks}, {"values", values}, {"ms", t * 1e3},
                          {"bytes_per_rank", bytes[v]}, {"relative_error", error},
                          {"data_plane", loco::comm::to_string(plane)}, {"combine", loco::comm::to_string(combine)}};
      if (v > 0) line["break_even_mb_per_s"] = extra_seconds <= 0 ? nlohmann::json("always") : nlohmann::json(saved_bytes / extra_seconds / 1e6);
      fmt::print("{}\n", line.dump());
      continue;
    }
    std::string break_even = "-";
    if (v > 0) break_even = extra_seconds <= 0 ? "always" : fmt::format("{:.0f}", saved_bytes / extra_seconds / 1e6);
    fmt::print("| {} | {} | {:.1f} | {:.2f} | {:.2f}x | {:.4f} | {} |\n", loco::comm::to_string(variants[v].encoding),
               algorithm, t * 1e3, static_cast<double>(bytes[v]) / 1e6, t / fp32_seconds, error, break_even);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loco-bench-comm: wire encodings and the encoded all-reduce against fp32"};
  int64_t values = 4 << 20;
  std::vector<int64_t> ranks{4};
  int rounds = 5;
  int threads = 1;
  bool json = false;
  std::string plane = "open", combine = "sum";
  app.add_option("--values", values, "fp32 values per tensor")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--ranks", ranks, "ranks of the all-reduce (threads of this process); several: one table each")
      ->check(CLI::Range(2, 64));
  app.add_option("--rounds", rounds, "timed rounds (after one warm-up)")->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads, "torch intra-op threads")->check(CLI::Range(1, 256));
  app.add_flag("--json", json, "one JSON line per measurement instead of the tables");
  app.add_option("--data-plane", plane, "seal the all-reduces' messages: open, authenticated or encrypted")
      ->check(CLI::IsMember({"open", "authenticated", "encrypted"}));
  app.add_option("--combine", combine, "how the terms become the result: sum, median or trimmed (mean, one left out at each end)")
      ->check(CLI::IsMember({"sum", "median", "trimmed"}));
  CLI11_PARSE(app, argc, argv);
  try {
    torch::set_num_threads(threads);
    torch::manual_seed(0);
    bench_codecs(values, rounds, json);
    const auto combined = combine == "median"    ? loco::comm::Combine::kMedian
                          : combine == "trimmed" ? loco::comm::Combine::kTrimmedMean
                                                 : loco::comm::Combine::kSum;
    for (int64_t m : ranks) bench_all_reduce(values, m, rounds, json, loco::comm::parse_data_plane(plane), combined);
  } catch (const std::exception& e) {
    fmt::print(stderr, "loco-bench-comm: {}\n", e.what());
    return 1;
  }
  return 0;
}
