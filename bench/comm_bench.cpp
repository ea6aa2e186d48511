// loco-bench-comm: the cost of the wire encodings (comm/encoding.h) and of the encoded all-reduce
// (Group::all_reduce_sum with an encoding) against Gloo's own fp32 all-reduce of the same tensor.
//
//   build/loco-bench-comm [--values 4194304] [--ranks 4] [--rounds 5] [--threads 1]
//
// 1. encode and decode throughput of each format, in GB/s of fp32 input, on one thread;
// 2. the all-reduce of `values` fp32 numbers across `ranks` ranks (threads of this process, each
//    with its own Gloo group over 127.0.0.1, as in the tests), every format with the algorithm
//    kAuto picks, plus gather and ring for e3m0: median wall time, bytes each rank sent, and the
//    link speed below which the format's all-reduce would beat fp32's (where the bytes it saves
//    take longer on the wire than its encoding costs).
// Loopback moves bytes at memory speed, so here fp32 wins; the last column says where it stops.
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <exception>
#include <thread>

#include "loco/comm/encoding.h"
#include "loco/comm/group.h"
#include "loco/comm/key_value.h"
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

constexpr Encoding kEncodings[] = {Encoding::kFp32, Encoding::kBf16, Encoding::kFp8,
                                   Encoding::kE3M0, Encoding::kInt8, Encoding::kInt4};

void bench_codecs(int64_t values, int rounds) {
  auto input = torch::randn({values}) * 1e-3;
  const double gigabytes = static_cast<double>(values) * 4 / 1e9;
  fmt::print("encode / decode of {} fp32 values ({:.0f} MB), median of {} rounds\n\n", values, gigabytes * 1e3, rounds);
  fmt::print("| format | bytes | vs fp32 | encode GB/s | decode GB/s |\n|---|---|---|---|---|\n");
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
    fmt::print("| {} | {} | {:.2f}x fewer | {:.2f} | {:.2f} |\n", loco::comm::to_string(encoding), bytes,
               static_cast<double>(values) * 4 / static_cast<double>(bytes), gigabytes / median(encode_times),
               gigabytes / median(decode_times));
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

void bench_all_reduce(int64_t values, int64_t ranks, int rounds) {
  std::vector<Variant> variants;
  for (auto encoding : kEncodings) variants.push_back({encoding, ReduceAlgorithm::kAuto});
  variants.push_back({Encoding::kE3M0, ReduceAlgorithm::kGather});
  variants.push_back({Encoding::kE3M0, ReduceAlgorithm::kScatter});
  variants.push_back({Encoding::kE3M0, ReduceAlgorithm::kRing});

  // times[v][round] on rank 0 (the slowest rank decides when an all-reduce is over; every rank
  // leaves within one message of the others), bytes[v] sent by rank 0 in one all-reduce.
  std::vector<std::vector<double>> times(variants.size());
  std::vector<int64_t> bytes(variants.size());
  auto store = std::make_shared<loco::comm::MemoryKeyValueStore>();
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
        auto group = loco::comm::Group::connect(store, options);
        auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(rank) + 1);
        const auto input = torch::randn({values}, generator) * 1e-3;
        for (size_t v = 0; v < variants.size(); ++v) {
          for (int r = 0; r <= rounds; ++r) {
            auto t = input.clone();
            sync.arrive_and_wait();
            auto start = Clock::now();
            auto stats = group.all_reduce_sum(t, loco::comm::ReduceOptions{variants[v].encoding, variants[v].algorithm});
            const double elapsed = seconds_since(start);
            if (rank == 0 && r > 0) times[v].push_back(elapsed), bytes[v] = stats.bytes_sent;
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

  fmt::print("\nall-reduce of {} fp32 values ({:.0f} MB) across {} ranks on 127.0.0.1, median of {} rounds\n\n", values,
             static_cast<double>(values) * 4 / 1e6, ranks, rounds);
  fmt::print("| format | algorithm | ms | MB sent per rank | vs fp32 time | wins below (MB/s per rank) |\n");
  fmt::print("|---|---|---|---|---|---|\n");
  const double fp32_seconds = median(times[0]);
  const auto fp32_bytes = static_cast<double>(bytes[0]);
  for (size_t v = 0; v < variants.size(); ++v) {
    const double t = median(times[v]);
    std::string break_even = "-";
    if (v > 0) {
      const double saved_bytes = fp32_bytes - static_cast<double>(bytes[v]);
      const double extra_seconds = t - fp32_seconds;
      break_even = extra_seconds <= 0 ? "always" : fmt::format("{:.0f}", saved_bytes / extra_seconds / 1e6);
    }
    fmt::print("| {} | {} | {:.1f} | {:.2f} | {:.2f}x | {} |\n", loco::comm::to_string(variants[v].encoding),
               algorithm_name(variants[v].algorithm, variants[v].encoding, ranks), t * 1e3,
               static_cast<double>(bytes[v]) / 1e6, t / fp32_seconds, break_even);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loco-bench-comm: wire encodings and the encoded all-reduce against fp32"};
  int64_t values = 4 << 20;
  int64_t ranks = 4;
  int rounds = 5;
  int threads = 1;
  app.add_option("--values", values, "fp32 values per tensor")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--ranks", ranks, "ranks of the all-reduce (threads of this process)")->check(CLI::Range(2, 64));
  app.add_option("--rounds", rounds, "timed rounds (after one warm-up)")->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads, "torch intra-op threads")->check(CLI::Range(1, 256));
  CLI11_PARSE(app, argc, argv);
  try {
    torch::set_num_threads(threads);
    torch::manual_seed(0);
    bench_codecs(values, rounds);
    bench_all_reduce(values, ranks, rounds);
  } catch (const std::exception& e) {
    fmt::print(stderr, "loco-bench-comm: {}\n", e.what());
    return 1;
  }
  return 0;
}
