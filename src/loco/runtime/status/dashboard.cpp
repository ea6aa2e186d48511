#include "loco/runtime/status/dashboard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "loco/metrics/events.h"
#include "loco/runtime/net/wire.h"

namespace loco::runtime {
namespace {

using wire::ProtocolError;

constexpr size_t kMaxText = 256;

double number(const nlohmann::json& object, const char* key, double fallback) {
  auto it = object.find(key);
  return it != object.end() && it->is_number() ? it->get<double>() : fallback;
}

int64_t integer(const nlohmann::json& object, const char* key, int64_t fallback) {
  auto it = object.find(key);
  return it != object.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

// `text` as valid UTF-8: bytes that are not are replaced (U+FFFD), by nlohmann-json's own checker.
// Everything the dashboard keeps passes here, so that its JSON always serializes (a refused
// request's path is logged, and may hold any bytes).
std::string valid_utf8(const std::string& text) {
  return nlohmann::json::parse(wire::to_wire(text)).get<std::string>();
}

// A required field of a report, checked.
template <class T>
T field(const nlohmann::json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end()) throw ProtocolError(fmt::format("telemetry: field '{}' is missing", key));
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) throw ProtocolError(fmt::format("telemetry: field '{}' is not a string", key));
    auto text = it->get<std::string>();
    if (text.size() > kMaxText) throw ProtocolError(fmt::format("telemetry: field '{}' is longer than {} bytes", key, kMaxText));
    return valid_utf8(text);
  } else {
    if (!it->is_number_integer()) throw ProtocolError(fmt::format("telemetry: field '{}' is not an integer", key));
    return it->get<T>();
  }
}

const std::vector<std::string> kActivities = {"starting", "training", "syncing", "evaluating", "checkpointing", "waiting",
                                              "finished"};
const std::vector<std::string> kStates = {"joining", "training", "syncing", "evaluating", "checkpointing", "waiting",
                                          "stalled", "finished", "stopped", "dead", "replaced"};

// Keeps a curve within `limit` points: beyond it, every other point is dropped (the last is kept).
template <class Point>
void append_bounded(std::vector<Point>& points, Point point, size_t limit) {
  points.push_back(point);
  if (points.size() <= limit) return;
  std::vector<Point> thinned;
  thinned.reserve(points.size() / 2 + 1);
  for (size_t i = 0; i < points.size(); i += 2) thinned.push_back(points[i]);
  if ((points.size() - 1) % 2 != 0) thinned.push_back(points.back());  // (by index: a point may hold NaN)
  points = std::move(thinned);
}

nlohmann::json finite_or_null(double value) { return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(); }

// A label value in the exposition format: backslash, double quote and line feed escaped.
std::string escape_label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string sample_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

// Writes metric families of the Prometheus text format: each family's HELP and TYPE once, then its samples.
class Exposition {
 public:
  void family(const std::string& name, const char* type, const char* help) {
    name_ = name;
    text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(const std::vector<std::pair<std::string, std::string>>& labels, double value) {
    text_ += name_;
    if (!labels.empty()) {
      text_ += '{';
      for (size_t i = 0; i < labels.size(); ++i) {
        text_ += fmt::format("{}{}=\"{}\"", i ? "," : "", labels[i].first, escape_label(labels[i].second));
      }
      text_ += '}';
    }
    text_ += " " + sample_value(value) + "\n";
  }
  std::string take() { return std::move(text_); }

 private:
  std::string name_, text_;
};

// The run's member entry of `w` in the coordinator's state, if any: a fixed run lists its members by
// name, an elastic run its ended members by id.
const nlohmann::json* run_member(const nlohmann::json& run, const std::string& name, int64_t member) {
  auto members = run.find("members");
  if (members == run.end() || !members->is_array()) return nullptr;
  for (const auto& m : *members) {
    if (member >= 0 ? integer(m, "member", -2) == member : (m.contains("name") && m["name"] == name)) return &m;
  }
  return nullptr;
}

// Whether an elastic run's membership holds `member` as gone (declared failed, or it left).
bool member_gone(const nlohmann::json& run, int64_t member) {
  if (member < 0 || !run.contains("elastic") || !run["elastic"].contains("members")) return false;
  for (const auto& m : run["elastic"]["members"]) {
    if (integer(m, "member", -2) == member) return m.value("state", "") == "gone";
  }
  return false;
}

}  // namespace

Dashboard::Dashboard(DashboardOptions options) : options_(options) {
  created_ = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Dashboard::Worker* Dashboard::worker_for(const std::string& host, int64_t pid, double now) {
  for (auto& w : workers_) {
    if (w.host == host && w.pid == pid) return &w;
  }
  if (workers_.size() >= options_.max_workers) {
    // Full: the oldest process that ended makes room; with none, there is no room.
    auto ended = std::find_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.exit_status || w.ended; });
    if (ended == workers_.end()) return nullptr;
    workers_.erase(ended);
  }
  Worker w;
  w.host = host;
  w.pid = pid;
  w.started = now;
  workers_.push_back(std::move(w));
  return &workers_.back();
}

void Dashboard::report(const nlohmann::json& body, double now) {
  if (!body.is_object()) throw ProtocolError("telemetry: the body must be a JSON object");
  const auto rank = field<int64_t>(body, "rank");
  const auto name = field<std::string>(body, "name");
  const auto host = field<std::string>(body, "host");
  const auto pid = field<int64_t>(body, "pid");
  const auto activity = field<std::string>(body, "activity");
  const auto step = field<int64_t>(body, "step");
  if (std::find(kActivities.begin(), kActivities.end(), activity) == kActivities.end()) {
    throw ProtocolError(fmt::format("telemetry: unknown activity '{}'", activity));
  }
  auto events = body.find("events");
  if (events == body.end() || !events->is_array()) throw ProtocolError("telemetry: field 'events' is missing or not an array");
  std::vector<metrics::TimedEvent> parsed;  // read once, applied below unless the batch was seen
  for (const auto& e : *events) {
    auto event = metrics::parse_event(e);
    if (!event) throw ProtocolError("telemetry: every event must be an object with a string 'event'");
    parsed.push_back(std::move(*event));
  }
  const int64_t seq = integer(body, "seq", -1), session = integer(body, "session", 0);
  std::lock_guard lock(mutex_);
  auto* row = worker_for(host, pid, now);
  if (row == nullptr) throw ProtocolError(fmt::format("telemetry: more than {} worker processes are running", options_.max_workers));
  auto& w = *row;
  const bool first = w.last_seen == 0;
  // A batch sent again (its answer was lost) is applied once: its events are skipped. Numbers
  // start again with each sender (a worker restarting from its checkpoint makes a new one).
  if (session != w.session) w.session = session, w.last_seq = -1;
  const bool seen = seq >= 0 && seq <= w.last_seq;
  if (seq >= 0) w.last_seq = std::max(w.last_seq, seq);
  w.rank = rank;
  w.member = integer(body, "member", -1);
  w.name = name;
  w.activity = activity;
  w.step = std::max(w.step, step);
  w.last_seen = now;
  const int64_t dropped = seen ? 0 : std::max<int64_t>(0, integer(body, "dropped", 0));
  w.dropped += dropped;
  dropped_ += dropped;
  const std::string who = fmt::format("worker {}", rank);
  if (first) add_event(now, who, fmt::format("reports from {} as {}", host, name), false);
  if (dropped > 0) add_event(now, who, fmt::format("{} of its events were lost while the coordinator could not be reached", dropped), false);
  if (!seen) {
    for (const auto& e : parsed) apply(w, e);
  }
}

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

std::string clipped(const std::string& text, size_t most) { return text.substr(0, most); }

}  // namespace

void Dashboard::apply(Worker& w, const metrics::TimedEvent& event) {
  const double time = std::isfinite(event.time) ? event.time : 0;
  const std::string who = fmt::format("worker {}", w.rank);
  auto add_loss_point = [&](int64_t step, int64_t tokens, double loss) {
    w.loss = loss;
    append_bounded(w.losses, std::array<double, 4>{time, static_cast<double>(step), static_cast<double>(tokens), loss},
                   options_.max_points);
  };
  auto add_round_bytes = [&](int64_t round, int64_t bytes) {
    const int64_t sent = std::max<int64_t>(0, bytes);
    w.bytes_sent += sent;
    ++w.rounds;
    auto& r = rounds_[round];
    r.time = std::max(r.time, time);
    r.bytes += sent;
    ++r.reports;
    while (rounds_.size() > options_.max_points) rounds_.erase(rounds_.begin());
  };
  std::visit(
      Overloaded{
          [&](const metrics::TrainEvent& e) {
            w.step = std::max(w.step, e.step);
            w.tokens = e.tokens;
            w.tokens_per_s = e.tokens_per_s;
            if (std::isfinite(e.utilization)) w.utilization = e.utilization;
            add_loss_point(e.step, e.tokens, e.loss);
          },
          [&](const metrics::SyncEvent& e) {
            add_round_bytes(e.round, e.bytes_sent);
            auto r = rounds_.find(e.round);  // every worker reports a sync's screening alike: counted once
            if (e.rejected > 0 && r != rounds_.end() && r->second.rejected == 0) {
              r->second.rejected = e.rejected;
              rejected_ += e.rejected;
              add_event(time, who, fmt::format("sync {}: {} outer gradient(s) left out ({})", e.round, e.rejected,
                                               clipped(e.screening, 256)), true);
            }
          },
          [&](const metrics::EvalEvent& e) {
            int64_t sent = 0;
            for (const auto& other : workers_) sent += other.bytes_sent;
            // (the event's "tokens" are those scored; the curve's are those the evaluating worker trained on)
            append_bounded(val_, std::array<double, 5>{time, static_cast<double>(e.step), static_cast<double>(w.tokens),
                                                       e.val_loss, static_cast<double>(sent)}, options_.max_points);
          },
          [&](const metrics::SummaryEvent& e) {
            w.ended = e.summary.interrupted ? "stopped" : "finished";
            w.end_time = time;
            add_event(time, who, fmt::format("{} at step {}", *w.ended, e.summary.steps), false);
          },
          [&](const metrics::StartEvent& e) {
            add_event(time, who, fmt::format("{} at step {}", e.resumed ? "resumed" : "started training", e.step), false);
          },
          // DiPaCo: a path task is a stretch of training (a loss point) and its phase's traffic (the bytes it wrote).
          [&](const metrics::PathTaskEvent& e) {
            w.step += std::max<int64_t>(0, e.steps);
            w.tokens += std::max<int64_t>(0, e.tokens);
            if (e.compute_s > 0) w.tokens_per_s = static_cast<double>(e.tokens) / e.compute_s;
            add_loss_point(w.step, w.tokens, e.loss);
            add_round_bytes(e.phase, e.bytes_written);
          },
          [&](const metrics::StepTaskEvent& e) {
            add_event(time, who, fmt::format("module {} took its outer step to version {}", clipped(e.module, 128), e.version),
                      false);
            if (e.rejected > 0) {  // one worker runs a module's step, and reports it once
              rejected_ += e.rejected;
              add_event(time, who, fmt::format("module {} v{}: {} path outer gradient(s) left out ({})", clipped(e.module, 128),
                                               e.version, e.rejected, clipped(e.screening, 256)), true);
            }
          },
          [&](const metrics::RouteTaskEvent& e) {
            add_event(time, who, fmt::format("routed the documents again before phase {}", e.phase), false);
          },
          [&](const metrics::WorkerSummaryEvent& e) {
            w.ended = e.interrupted ? "stopped" : "finished";
            w.end_time = time;
            add_event(time, who, fmt::format("{} after {} path task(s) and {} outer step(s)", *w.ended, e.path_tasks,
                                             e.step_tasks), false);
          },
          [&](const metrics::JoinedEvent& e) {
            add_event(time, who, fmt::format("joined the run at step {}", e.step), false);
          },
          [&](const metrics::PeerFailureEvent& e) {
            add_event(time, who, fmt::format("a collective failed at step {}: {}", e.step, clipped(e.error, 512)), true);
          },
          [](const auto&) {},  // the rest changes nothing on the page
      },
      event.event);
}

void Dashboard::process_started(int64_t rank, const std::string& host, int64_t pid, double now) {
  std::lock_guard lock(mutex_);
  auto* row = worker_for(host, pid, now);
  if (row == nullptr) return;  // (the table is full of live processes: this one goes unlisted)
  auto& w = *row;
  w.rank = rank;
  w.name = fmt::format("{}:{}", host, pid);
  add_event(now, fmt::format("worker {}", rank), fmt::format("process {} started on {}", pid, host), false);
}

void Dashboard::process_exited(const std::string& host, int64_t pid, int status, bool failed, double now) {
  std::lock_guard lock(mutex_);
  auto* row = worker_for(host, pid, now);
  if (row == nullptr) return;
  auto& w = *row;
  w.exit_status = status;
  w.failed = failed;
  if (!w.end_time) w.end_time = now;
  add_event(now, fmt::format("worker {}", w.rank), fmt::format("process {} exited with status {}", pid, status), failed);
}

void Dashboard::note(const std::string& text, double now) {
  std::lock_guard lock(mutex_);
  const bool failure = text.find(" failed") != std::string::npos || text.find("stopping") != std::string::npos ||
                       text.find("exited with") != std::string::npos;
  add_event(now, "coordinator", text, failure);
}

void Dashboard::note_refusal(const std::string& text, double now) {
  std::lock_guard lock(mutex_);
  const auto is_refusal = [](const nlohmann::json& e) { return e.value("refusal", false); };
  if (static_cast<size_t>(std::count_if(events_.begin(), events_.end(), is_refusal)) >= options_.max_refusals) {
    auto oldest = std::find_if(events_.begin(), events_.end(), is_refusal);
    if (oldest == events_.end()) return;  // max_refusals = 0: none kept
    events_.erase(oldest);
  }
  add_event(now, "coordinator", text, false);
  events_.back()["refusal"] = true;
}

void Dashboard::add_event(double time, std::string who, std::string text, bool failure) {
  events_.push_back({{"time", time}, {"who", valid_utf8(who)}, {"text", valid_utf8(text)}, {"failure", failure}});
  while (events_.size() > options_.max_events) events_.pop_front();
}

std::string Dashboard::state_of(const Worker& w, size_t index, const nlohmann::json& run, double now) const {
  if (w.ended) return *w.ended;
  const auto* member = run_member(run, w.name, w.member);
  const std::string ended = member != nullptr ? member->value("status", "") : "";
  const bool failed = w.failed || ended == "failed" || member_gone(run, w.member);
  if (failed) {
    for (size_t j = index + 1; j < workers_.size(); ++j) {
      if (workers_[j].rank == w.rank) return "replaced";  // a process seen after it, on its rank
    }
    return "dead";
  }
  if (ended == "finished" || ended == "stopped") return ended;
  if (w.exit_status) return *w.exit_status == 0 ? "finished" : "stopped";  // a clean end, or a stop asked for
  if (w.last_seen == 0) return "joining";
  if (now - w.last_seen > options_.stalled_after_s) return "stalled";
  if (w.activity == "starting") return "joining";
  return w.activity;
}

nlohmann::json Dashboard::worker_json(const Worker& w, size_t index, const nlohmann::json& run, double now) const {
  nlohmann::json out = {{"id", index}, {"rank", w.rank}, {"name", w.name}, {"host", w.host}, {"pid", w.pid},
                        {"state", state_of(w, index, run, now)}, {"activity", w.activity}, {"step", w.step},
                        {"tokens", w.tokens}, {"tokens_per_s", w.tokens_per_s}, {"loss", finite_or_null(w.loss)},
                        {"utilization", finite_or_null(w.utilization)}, {"bytes_sent", w.bytes_sent}, {"rounds", w.rounds},
                        {"started", w.started}, {"last_report_s", w.last_seen > 0 ? nlohmann::json(now - w.last_seen) : nlohmann::json()},
                        {"dropped", w.dropped}};
  if (w.member >= 0) out["member"] = w.member;
  if (w.exit_status) out["exit_status"] = *w.exit_status;
  return out;
}

nlohmann::json Dashboard::rows_locked(const nlohmann::json& run, double now) const {
  nlohmann::json workers = nlohmann::json::array(), counts = nlohmann::json::object();
  for (const auto& s : kStates) counts[s] = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    auto row = worker_json(workers_[i], i, run, now);
    auto& count = counts[row["state"].get<std::string>()];
    count = count.get<int64_t>() + 1;
    workers.push_back(std::move(row));
  }
  return {{"workers", std::move(workers)}, {"counts", std::move(counts)}, {"telemetry_dropped", dropped_}};
}

nlohmann::json Dashboard::status(const nlohmann::json& run, double now) const {
  std::lock_guard lock(mutex_);
  nlohmann::json status = rows_locked(run, now), losses = nlohmann::json::array();
  for (size_t i = 0; i < workers_.size(); ++i) {
    nlohmann::json points = nlohmann::json::array();
    for (const auto& p : workers_[i].losses) points.push_back({p[0], p[1], p[2], finite_or_null(p[3])});
    losses.push_back({{"worker", i}, {"rank", workers_[i].rank}, {"points", std::move(points)}});
  }
  nlohmann::json val = nlohmann::json::array(), rounds = nlohmann::json::array();
  for (const auto& p : val_) val.push_back({p[0], p[1], p[2], finite_or_null(p[3]), p[4]});
  for (const auto& [round, r] : rounds_) rounds.push_back({round, r.time, r.bytes});
  status.update({{"run", run}, {"time", now}, {"started", created_}, {"loss", std::move(losses)}, {"val", std::move(val)},
                 {"rounds", std::move(rounds)}, {"events", nlohmann::json(events_)}, {"rejected", rejected_}});
  return status;
}

// The rows and the latest validation loss only: a scrape serializes no curves.
std::string Dashboard::prometheus(const nlohmann::json& run, double now) const {
  nlohmann::json status;
  double val_loss = NAN;
  bool evaluated = false;
  int64_t rejected = 0;
  {
    std::lock_guard lock(mutex_);
    status = rows_locked(run, now);
    rejected = rejected_;
    if (!val_.empty()) evaluated = true, val_loss = val_.back()[3];
  }
  Exposition out;
  out.family("loco_run_info", "gauge", "The run: its id and phase (always 1).");
  out.sample({{"run_id", run.value("run_id", "")}, {"phase", run.value("phase", "")}}, 1);
  out.family("loco_run_epoch", "gauge", "The membership epoch (a new one whenever the members taking part change).");
  out.sample({}, number(run, "epoch", 0));
  out.family("loco_run_stopping", "gauge", "1 when the run is stopping.");
  out.sample({}, run.value("stopping", false) ? 1 : 0);
  out.family("loco_workers", "gauge", "Worker processes seen by the coordinator, by state.");
  for (const auto& s : kStates) out.sample({{"state", s}}, status["counts"][s].get<double>());
  out.family("loco_sync_rounds_total", "counter", "Synchronizations reported by the workers (each worker counts its own).");
  double rounds = 0;
  for (const auto& w : status["workers"]) rounds += w["rounds"].get<double>();
  out.sample({}, rounds);
  out.family("loco_outer_gradients_rejected_total", "counter", "Outer gradients that screening left out of a sync or of a DiPaCo module's step (docs/failure-model.md).");
  out.sample({}, static_cast<double>(rejected));
  out.family("loco_telemetry_dropped_events_total", "counter", "Worker events lost while the coordinator could not be reached.");
  out.sample({}, status["telemetry_dropped"].get<double>());
  if (evaluated) {
    out.family("loco_val_loss", "gauge", "The latest validation loss of the global parameters.");
    out.sample({}, val_loss);
  }
  struct PerWorker {
    const char* name;
    const char* type;
    const char* help;
    const char* key;
  };
  const std::vector<PerWorker> per_worker = {
      {"loco_worker_up", "gauge", "1 while the worker process is alive and reporting (not stalled, dead or ended).", nullptr},
      {"loco_worker_step", "gauge", "Inner steps the worker has completed.", "step"},
      {"loco_worker_tokens_total", "counter", "Training tokens the worker has processed.", "tokens"},
      {"loco_worker_tokens_per_second", "gauge", "The worker's training throughput over its last logging interval.", "tokens_per_s"},
      {"loco_worker_loss", "gauge", "The worker's latest training loss.", "loss"},
      {"loco_worker_compute_utilization", "gauge", "Share of the worker's inner-step time spent computing (not in sync hooks).", "utilization"},
      {"loco_worker_sent_bytes_total", "counter", "Payload bytes the worker has sent in synchronizations.", "bytes_sent"},
      {"loco_worker_last_report_age_seconds", "gauge", "Seconds since the worker's last report.", "last_report_s"}};
  for (const auto& metric : per_worker) {
    out.family(metric.name, metric.type, metric.help);
    for (const auto& w : status["workers"]) {
      const std::vector<std::pair<std::string, std::string>> labels = {
          {"worker", std::to_string(w["rank"].get<int64_t>())}, {"name", w["name"].get<std::string>()},
          {"host", w["host"].get<std::string>()}};
      double value = NAN;
      if (metric.key == nullptr) {
        const auto state = w["state"].get<std::string>();
        value = state == "training" || state == "syncing" || state == "evaluating" || state == "checkpointing" ||
                state == "waiting" || state == "joining";
      } else if (!w[metric.key].is_null()) {
        value = w[metric.key].get<double>();
      }
      out.sample(labels, value);
    }
  }
  return out.take();
}

}  // namespace loco::runtime
