#include "loco/runtime/config/links.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "loco/core/error.h"

namespace loco::runtime {
namespace {

// A number with a unit suffix from `units` (suffix -> multiplier); the suffix is required.
double parse_with_unit(const std::string& text, const std::vector<std::pair<std::string, double>>& units,
                       const std::string& what, const std::string& example) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  const std::string suffix(end, text.data() + text.size());
  if (ec == std::errc() && std::isfinite(value) && value >= 0) {
    for (const auto& [unit, multiplier] : units) {
      if (suffix == unit) return value * multiplier;
    }
  }
  throw ConfigError("link", fmt::format("{} '{}' is not a number with a unit (e.g. {})", what, text, example));
}

std::string format_rate(double bps) {
  if (bps >= 1e9) return fmt::format("{:g} Gbit/s", bps / 1e9);
  if (bps >= 1e6) return fmt::format("{:g} Mbit/s", bps / 1e6);
  if (bps >= 1e3) return fmt::format("{:g} kbit/s", bps / 1e3);
  return fmt::format("{:g} bit/s", bps);
}

}  // namespace

std::string format_bandwidth(double bps) {
  if (bps >= 1e9) return fmt::format("{:.3g} Gbit/s", bps / 1e9);
  if (bps >= 1e6) return fmt::format("{:.3g} Mbit/s", bps / 1e6);
  if (bps >= 1e3) return fmt::format("{:.3g} kbit/s", bps / 1e3);
  return fmt::format("{:.3g} bit/s", bps);
}

double parse_rate_bps(const std::string& text, const std::string& what) {
  return parse_with_unit(text, {{"bit", 1}, {"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}, {"bps", 8}, {"kbps", 8e3},
                                {"mbps", 8e6}, {"gbps", 8e9}},
                         what, "100mbit, 1gbit or 12.5mbps");
}

double parse_delay_s(const std::string& text, const std::string& what) {
  return parse_with_unit(text, {{"us", 1e-6}, {"ms", 1e-3}, {"s", 1}}, what, "50ms");
}

LinkSpec LinkSpec::parse(const std::string& text) {
  LinkSpec spec;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "rate") {
      spec.rate_bps = parse_rate_bps(value, "link rate");
      if (spec.rate_bps < 8000) throw ConfigError("link", fmt::format("link rate '{}' is below 8 kbit/s", value));
      if (spec.rate_bps > 100e9) throw ConfigError("link", fmt::format("link rate '{}' is over 100 Gbit/s", value));
    } else if (key == "delay") {
      spec.delay_s = parse_delay_s(value, "link delay");
      if (spec.delay_s > 10) throw ConfigError("link", fmt::format("link delay '{}' is over 10 s", value));
    } else if (key == "cpu") {
      double cores = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), cores);
      if (ec != std::errc() || end != value.data() + value.size() || !(cores >= 0.01 && cores <= 1024)) {
        throw ConfigError("link", fmt::format("link cpu '{}' is not a number of cores from 0.01 to 1024 (e.g. cpu=0.45)", value));
      }
      spec.cpu = cores;
    } else if (key == "tamper") {
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), spec.tamper);
      if (ec != std::errc() || end != value.data() + value.size() || spec.tamper < 1) {
        throw ConfigError("link", fmt::format("link tamper '{}' is not a count of segments from 1 (e.g. tamper=3)", value));
      }
    } else {
      throw ConfigError("link", fmt::format("'{}' in link '{}' is not rate=RATE, delay=DELAY, cpu=CORES or tamper=N (e.g. "
                                            "rate=100mbit,delay=50ms)", item, text));
    }
    start = end + 1;
  }
  return spec;
}

std::string LinkSpec::describe() const {
  return fmt::format("{}, {} one-way{}", rate_bps > 0 ? format_rate(rate_bps) : "rate not shaped",
                     delay_s > 0 ? fmt::format("{:g} ms", delay_s * 1e3) : "no added delay",
                     cpu > 0 ? fmt::format(", {:g} of a core", cpu) : "") +
         (tamper > 0 ? fmt::format(", one bit of its data segment {} altered on the way", tamper) : "");
}

namespace {

// `base` with the keys that `text` gives replaced.
LinkSpec merged(LinkSpec base, const std::string& text) {
  const LinkSpec given = LinkSpec::parse(text);
  if (text.find("rate=") != std::string::npos) base.rate_bps = given.rate_bps;
  if (text.find("delay=") != std::string::npos) base.delay_s = given.delay_s;
  if (text.find("cpu=") != std::string::npos) base.cpu = given.cpu;
  if (text.find("tamper=") != std::string::npos) base.tamper = given.tamper;
  return base;
}

}  // namespace

LinkPlan LinkPlan::parse(const std::vector<std::string>& arguments, int64_t world) {
  LinkPlan plan;
  std::vector<std::pair<int64_t, std::string>> per_worker;
  for (const auto& argument : arguments) {
    plan.enabled = true;
    if (argument.rfind("worker=", 0) != 0) {
      plan.all = merged(plan.all, argument);
      continue;
    }
    const size_t comma = argument.find(',');
    const std::string rank_text = argument.substr(7, comma == std::string::npos ? std::string::npos : comma - 7);
    int64_t rank = -1;
    const auto [end, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || end != rank_text.data() + rank_text.size() || rank < 0 || rank >= world) {
      throw ConfigError("link", fmt::format("'{}': worker must be a rank in [0, {})", argument, world));
    }
    per_worker.emplace_back(rank, comma == std::string::npos ? "" : argument.substr(comma + 1));
  }
  // A worker's own keys override the default link, whichever order they were given in; later
  // arguments for the same worker override earlier ones.
  for (const auto& [worker, text] : per_worker) {
    const int64_t rank = worker;  // (a structured binding cannot be captured in C++20 by clang 14)
    auto found = std::find_if(plan.workers.begin(), plan.workers.end(), [&](const auto& w) { return w.first == rank; });
    if (found == plan.workers.end()) plan.workers.emplace_back(rank, merged(plan.all, text));
    else found->second = merged(found->second, text);
  }
  return plan;
}

LinkPlan LinkPlan::from_config(const LinkSection& section, const std::vector<std::string>& more, int64_t world) {
  std::vector<std::string> arguments;
  std::string all;
  if (!section.rate.empty()) all = "rate=" + section.rate;
  if (!section.delay.empty()) all += (all.empty() ? "delay=" : ",delay=") + section.delay;
  if (section.cpu > 0) all += fmt::format("{}cpu={:g}", all.empty() ? "" : ",", section.cpu);
  if (!all.empty()) arguments.push_back(all);
  for (size_t start = 0; start < section.workers.size();) {
    const size_t end = std::min(section.workers.find(';', start), section.workers.size());
    const std::string item = section.workers.substr(start, end - start);
    const size_t colon = item.find(':');
    if (colon == std::string::npos) {
      throw ConfigError("link", fmt::format("link.workers item '{}' is not RANK:rate=...,delay=...", item));
    }
    arguments.push_back(fmt::format("worker={},{}", item.substr(0, colon), item.substr(colon + 1)));
    start = end + 1;
  }
  arguments.insert(arguments.end(), more.begin(), more.end());
  return parse(arguments, world);
}

LinkSpec LinkPlan::for_worker(int64_t rank) const {
  for (const auto& [r, spec] : workers) {
    if (r == rank) return spec;
  }
  return all;
}

}  // namespace loco::runtime
