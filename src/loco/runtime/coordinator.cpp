#include "loco/runtime/coordinator.h"

#include <fmt/ranges.h>
#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "loco/comm/key_value.h"
#include "loco/core/files.h"
#include "loco/core/hash.h"
#include "loco/metrics/metrics_log.h"
#include "loco/runtime/checkpoint.h"
#include "loco/runtime/membership.h"

namespace loco::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using protocol::ProtocolError;

constexpr auto kMaxWait = std::chrono::milliseconds(2000);  // longest a request is held
constexpr size_t kMaxKeyBytes = 512;
// A worker waiting for a slot asks at least this often (its backoff stops at 2 s); quieter, it is
// no longer counted as waiting.
constexpr auto kWaiterSilence = std::chrono::seconds(5);

// A refusal the worker can act on: answered with HTTP 409 and shown to the user as is.
class Refusal : public Error {
 public:
  explicit Refusal(std::string_view message) : Error("coordinator", message) {}
};

// A refusal for now (HTTP 503): every slot of an elastic run is held by a live member; the worker
// may ask again (a slot frees when a member fails or leaves).
class Full : public Refusal {
 public:
  using Refusal::Refusal;
};

struct Member {
  std::string name;
  protocol::JoinRequest request;
  std::string status;  // "" while training; then finished / stopped / failed
  std::string error;
  nlohmann::json summary;
};

std::string random_run_id() {
  std::random_device device;
  return hex64((static_cast<uint64_t>(device()) << 32) ^ device());
}

nlohmann::json body_json(const httplib::Request& request) {
  try {
    return nlohmann::json::parse(request.body);
  } catch (const nlohmann::json::exception&) {
    throw ProtocolError("the request body is not valid JSON");
  }
}

std::string key_param(const httplib::Request& request) {
  if (!request.has_param("key")) throw ProtocolError("parameter 'key' is missing");
  auto key = request.get_param_value("key");
  if (key.empty() || key.size() > kMaxKeyBytes) throw ProtocolError("parameter 'key' must have 1 to 512 bytes");
  return key;
}

int64_t int_param(const httplib::Request& request, const char* name) {
  if (!request.has_param(name)) throw ProtocolError(fmt::format("parameter '{}' is missing", name));
  try {
    size_t used = 0;
    const auto text = request.get_param_value(name);
    const int64_t value = std::stoll(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    return value;
  } catch (const std::exception&) {
    throw ProtocolError(fmt::format("parameter '{}' is not an integer", name));
  }
}

void reply_json(httplib::Response& response, const nlohmann::json& body, int status = 200) {
  response.status = status;
  response.set_content(body.dump(), "application/json");
}

// Compares secrets in time independent of where they differ.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

MembershipOptions membership_options(const RunConfig& config) {
  MembershipOptions o;
  o.slots = config.cluster.workers;
  o.min_workers = config.cluster.min_workers;
  o.dead_after = std::chrono::milliseconds(static_cast<int64_t>(config.cluster.dead_after_s * 1000));
  o.total_steps = config.train.steps;
  if (config.sync.round_seconds > 0) {
    o.round_grace = std::chrono::milliseconds(static_cast<int64_t>(config.sync.round_grace_s * 1000));
  }
  return o;
}

}  // namespace

struct Coordinator::Impl {
  explicit Impl(CoordinatorOptions o) : options(std::move(o)), members(static_cast<size_t>(options.config.cluster.workers)) {
    if (options.config.cluster.elastic) {
      table.emplace(membership_options(options.config));
      events = metrics::MetricsLog(fs::path(options.config.run.dir) / "metrics.jsonl");
      if (options.resume) {
        restore_from_checkpoint();
      } else if (fs::exists(state_file)) {
        restore_live_state();
      }
    }
  }

  // A coordinator started again on a run whose coordinator died (RUN/coordinator.json says it
  // was under way) takes its membership back; its workers kept training and retrying
  // (cluster.coordinator_timeout_s), and carry on with it.
  void restore_live_state() {
    nlohmann::json saved;
    try {
      saved = nlohmann::json::parse(read_file(state_file, "coordinator"));
      const auto was = saved.at("phase").get<std::string>();
      if (was == "finished" || was == "failed") {
        throw ConfigError("coordinator", fmt::format("{} holds a {} run ({}); pass --resume to continue it from its "
                                                     "checkpoints, or choose another run.dir", options.config.run.dir, was,
                                                     state_file.string()));
      }
      table->load(saved.at("table"), Clock::now());
      run_id = saved.at("run_id").get<std::string>();
      stopping = saved.at("stopping").get<bool>();
    } catch (const nlohmann::json::exception& e) {
      throw DataError("coordinator", fmt::format("{}: malformed ({}); delete it to start a new run there, or continue from "
                                                 "the checkpoints with --resume", state_file.string(), e.what()));
    } catch (const std::invalid_argument& e) {
      throw DataError("coordinator", fmt::format("{}: {}; delete it to start a new run there, or continue from the "
                                                 "checkpoints with --resume", state_file.string(), e.what()));
    }
    phase = table->started() ? "running" : "waiting";
    log(fmt::format("continuing run {} from {}: epoch {}, {} rounds completed, {} live members (each has "
                    "cluster.dead_after_s to be heard from)", run_id, state_file.string(), table->epoch(),
                    table->rounds_completed(), table->live_members()));
    events.write("coordinator_restored", {{"epoch", table->epoch()}, {"round", table->rounds_completed()},
                                          {"live_members", table->live_members()}});
    saved_state = saved.dump();
  }

  // Writes RUN/coordinator.json when the durable membership changed (atomically: a crash leaves
  // the previous one). Called under the lock after every change, before any answer that depends on it.
  void persist_locked() {
    if (!table) return;
    const nlohmann::json state = {{"format_version", 1}, {"run_id", run_id}, {"phase", phase}, {"stopping", stopping},
                                  {"table", table->save()}};
    auto text = state.dump();
    if (text == saved_state) return;
    try {
      write_file_atomic(state_file, text + "\n", "coordinator");
      saved_state = std::move(text);
      state_write_failed = false;
    } catch (const std::exception& e) {
      if (!state_write_failed) log(fmt::format("cannot save the membership ({}); a restarted coordinator would not find it", e.what()));
      state_write_failed = true;
    }
  }

  // A resumed elastic run continues from a global checkpoint (docs/failure-model.md): the newest
  // one of a round for which every slot's inner state was saved too (then the run continues as if
  // never stopped), else the newest. Its round and slot positions become the table's.
  void restore_from_checkpoint() {
    const fs::path run(options.config.run.dir);
    const auto global = CheckpointStore(run / "checkpoints", 1).steps();
    if (global.empty()) {
      throw DataError("coordinator", fmt::format("--resume: {} holds no global checkpoint", (run / "checkpoints").string()));
    }
    std::vector<std::vector<int64_t>> slot_steps;
    for (int64_t s = 0; s < world_size(); ++s) slot_steps.push_back(CheckpointStore(slot_state_dir(run, s), 1).steps());
    const auto complete = [&](int64_t step) {
      return std::all_of(slot_steps.begin(), slot_steps.end(),
                         [&](const auto& steps) { return std::find(steps.begin(), steps.end(), step) != steps.end(); });
    };
    auto chosen = std::find_if(global.rbegin(), global.rend(), complete);
    const int64_t step = chosen != global.rend() ? *chosen : global.back();
    const auto [round, positions] = read_global_checkpoint(step);
    table->restore(round, step, positions);
    resume_step = step;
    std::vector<int64_t> fresh;
    for (int64_t s = 0; s < world_size(); ++s) {
      if (!complete(step) && std::find(slot_steps[s].begin(), slot_steps[s].end(), step) == slot_steps[s].end()) fresh.push_back(s);
    }
    log(fmt::format("resuming from {} (round {}, step {}){}", CheckpointStore(run / "checkpoints", 1).at(step).string(), round, step,
                    fresh.empty() ? "" : fmt::format("; slot(s) {} have no inner state of that step: their AdamW moments "
                                                     "start from the leader's", fmt::join(fresh, ", "))));
    events.write("run_resumed", {{"step", step}, {"round", round}, {"slots_without_inner_state", fresh}});
  }

  // The round and the slots' data positions of the global checkpoint of `step`.
  std::pair<int64_t, std::vector<data::SamplerPosition>> read_global_checkpoint(int64_t step) const {
    const auto checkpoint = load_checkpoint(CheckpointStore(fs::path(options.config.run.dir) / "checkpoints", 1).at(step));
    int64_t round = -1;
    std::vector<data::SamplerPosition> positions;
    for (const auto& [name, tensor] : checkpoint.sync) {
      if (name == "diloco.round" || name == "streaming.rounds") round = tensor.item<int64_t>();
      if (name == "elastic.slots" && tensor.dim() == 2 && tensor.size(1) >= 2) {  // epoch, cursor[, owner]
        for (int64_t s = 0; s < tensor.size(0); ++s) {
          positions.push_back({static_cast<uint64_t>(tensor[s][0].item<int64_t>()), static_cast<uint64_t>(tensor[s][1].item<int64_t>())});
        }
      }
    }
    if (round < 0 || static_cast<int64_t>(positions.size()) != world_size()) {
      throw DataError("coordinator", fmt::format("{} is not the global checkpoint of an elastic run of {} slots (no "
                                                 "diloco.round / streaming.rounds, or no elastic.slots of that size)", checkpoint.dir.string(),
                                                 world_size()));
    }
    return {round, positions};
  }

  // Members wait for the run's state and no active member is left to send it (every one failed):
  // they continue from the newest global checkpoint instead (docs/failure-model.md).
  void restart_orphans_locked() {
    const auto steps = CheckpointStore(fs::path(options.config.run.dir) / "checkpoints", 1).steps();
    try {
      if (steps.empty()) {
        if (table->rounds_completed() > 0) {
          fail_locked(fmt::format("every worker that held the run's state failed, and {} has no global checkpoint to "
                                  "continue from", (fs::path(options.config.run.dir) / "checkpoints").string()));
          return;
        }
        table->restart_from(0, std::nullopt, std::vector<data::SamplerPosition>(static_cast<size_t>(world_size())), Clock::now());
        log("every worker that held the run's state failed before the first round: the waiting workers start it afresh");
      } else {
        const auto [round, positions] = read_global_checkpoint(steps.back());
        table->restart_from(round, steps.back(), positions, Clock::now());
        log(fmt::format("every worker that held the run's state failed: the waiting workers continue from the global "
                        "checkpoint of step {} (round {})", steps.back(), round));
      }
    } catch (const Error& e) {
      fail_locked(fmt::format("every worker that held the run's state failed, and the global checkpoint cannot be read: {}",
                              e.what()));
      return;
    }
    flush_events_locked();
  }

  CoordinatorOptions options;
  httplib::Server server;
  std::thread thread;
  int port = 0;
  std::string run_id = random_run_id();
  comm::MemoryKeyValueStore store;

  mutable std::mutex mutex;
  std::condition_variable changed;
  std::string phase = "waiting";  // waiting, running, finished, failed
  bool stopping = false;
  std::string reason;             // of the stop or the failure
  int64_t epoch = 0;
  std::vector<std::optional<Member>> members;
  std::map<int64_t, int64_t> resume_steps;
  const Clock::time_point started = Clock::now();
  std::optional<Clock::time_point> first_end;  // when the first worker reported its end
  // Elastic: when a worker last found the run full and asks again (it waits for a slot, kWaiterSilence).
  std::map<std::string, Clock::time_point> slot_waiters;
  const std::string token = join_token(options.config.cluster);

  // Elastic runs (cluster.elastic): members come and go; ranks are per epoch, slots hold the data.
  std::optional<MembershipTable> table;
  metrics::MetricsLog events;                 // RUN/metrics.jsonl: membership, failures, rounds
  std::optional<uint64_t> shards_hash;        // the first worker's division of the data
  std::map<int64_t, Member> ended;            // members that reported their end, by member id
  std::optional<int64_t> resume_step;         // a resumed run: the global checkpoint's step
  const fs::path state_file = fs::path(options.config.run.dir) / "coordinator.json";
  std::string saved_state;                    // what state_file holds
  bool state_write_failed = false;

  // Writes the table's events to the log and metrics.jsonl, and wakes the waiting requests.
  void flush_events_locked() {
    for (auto& e : table->take_events()) {
      const std::string name = e["event"].get<std::string>();
      e.erase("event");
      log(describe_event(name, e));
      try {
        events.write(name, e);
      } catch (const std::exception& error) {
        log(fmt::format("cannot write metrics.jsonl: {}", error.what()));
      }
    }
    persist_locked();
    changed.notify_all();
  }

  static std::string describe_event(const std::string& name, const nlohmann::json& e) {
    if (name == "join") {
      return fmt::format("{} joined as member {} (slot {}){}", e["name"].get<std::string>(), e["member"].get<int64_t>(),
                         e["slot"].get<int64_t>(), e["joiner"].get<bool>() ? ", to receive the state at the next round" : "");
    }
    if (name == "joined") return fmt::format("member {} took part in round {}: it now trains slot {}", e["member"].get<int64_t>(), e["round"].get<int64_t>(), e["slot"].get<int64_t>());
    if (name == "failure") {
      return fmt::format("member {} ({}) failed: {}", e["member"].get<int64_t>(), e["name"].get<std::string>(), e["how"].get<std::string>());
    }
    if (name == "collective_failed") {
      return fmt::format("member {} reports that round {}'s collective failed in epoch {}: the round is convened again "
                         "with the members still alive", e["reported_by"].get<int64_t>(), e["round"].get<int64_t>(),
                         e["epoch"].get<int64_t>());
    }
    if (name == "round_retried") {
      return fmt::format("round {} is tried again in epoch {} with {} workers (its collective in epoch {} failed)",
                         e["round"].get<int64_t>(), e["epoch"].get<int64_t>(), e["participants"].get<size_t>(),
                         e["failed_epoch"].get<int64_t>());
    }
    if (name == "left_out") {
      return fmt::format("round {} goes on without member(s) {}: still training {:.1f} s after the first arrival "
                         "(sync.round_grace_s); they rejoin", e["round"].get<int64_t>(),
                         fmt::join(e["members"].get<std::vector<int64_t>>(), ", "), e["waited_s"].get<double>());
    }
    if (name == "restored_from_checkpoint") {
      return fmt::format("member(s) {} continue from the global checkpoint (round {})",
                         fmt::join(e["members"].get<std::vector<int64_t>>(), ", "), e["round"].get<int64_t>());
    }
    if (name == "leave") return fmt::format("member {} left: {}", e["member"].get<int64_t>(), e["status"].get<std::string>());
    if (name == "rejoin") {
      return fmt::format("member {} must rejoin: {}", e["member"].get<int64_t>(), e["reason"].get<std::string>());
    }
    if (name == "membership") {
      std::vector<std::string> who;
      for (const auto& m : e["members"]) {
        who.push_back(fmt::format("{}{}", m["member"].get<int64_t>(), m["joining"].get<bool>() ? " (joining)" : ""));
      }
      return fmt::format("epoch {} for round {}: members {}", e["epoch"].get<int64_t>(), e["round"].get<int64_t>(), fmt::join(who, ", "));
    }
    if (name == "round_complete") {
      return fmt::format("round {} complete at step {} with {} of {} workers{}", e["round"].get<int64_t>(), e["step"].get<int64_t>(),
                         e["contributors"].get<int64_t>(), e["slots"].get<int64_t>(),
                         e.contains("recovery_s") ? fmt::format(" (recovered {:.1f} s after the failure)", e["recovery_s"].get<double>()) : "");
    }
    return name + " " + e.dump();
  }

  void start_elastic_locked(const std::string& why) {
    table->start(Clock::now());
    phase = "running";
    log(fmt::format("training starts with {} of {} workers{}", table->live_members(), world_size(), why));
    flush_events_locked();
  }

  // The end of an elastic run: every member has left (finished, stopped, failed).
  void check_elastic_end_locked() {
    if (!table || phase != "running") return;
    table->expire(Clock::now());
    flush_events_locked();
    if (table->orphaned()) restart_orphans_locked();
    if (!table->all_left()) return;
    // A worker that found the run full (it asked before the last members were declared failed)
    // is about to take a slot: it continues the run (from the global checkpoint) rather than
    // finding it failed.
    std::erase_if(slot_waiters, [](const auto& w) { return Clock::now() - w.second > kWaiterSilence; });
    if (!table->training_complete() && !stopping && !slot_waiters.empty()) return;
    if (table->training_complete() || stopping) {
      // Not silent: a shard whose slot sat idle for rounds was trained on less than the others.
      const auto& missed = table->rounds_missed();
      for (size_t s = 0; s < missed.size(); ++s) {
        if (missed[s] > 0) {
          log(fmt::format("slot {} was idle (vacant, or its worker left out) in {} of {} rounds: its shard was trained on "
                          "that much less than the others", s, missed[s], table->rounds_completed()));
        }
      }
      events.write("slots_summary", {{"rounds", table->rounds_completed()}, {"rounds_missed", missed}});
      phase = "finished";
      persist_locked();
      changed.notify_all();
    } else {
      fail_locked(fmt::format("every worker left before training completed ({} rounds done); resume with --resume",
                              table->rounds_completed()));
    }
  }

  void log(const std::string& line) const {
    if (options.log) options.log(line);
  }
  int64_t world_size() const { return static_cast<int64_t>(members.size()); }

  std::vector<int64_t> missing_locked() const {
    std::vector<int64_t> out;
    for (size_t r = 0; r < members.size(); ++r) {
      if (!members[r]) out.push_back(static_cast<int64_t>(r));
    }
    return out;
  }

  void fail_locked(const std::string& why) {
    if (phase == "finished" || phase == "failed") return;
    phase = "failed";
    reason = why;
    persist_locked();
    log("run failed: " + why);
    changed.notify_all();
  }

  // Once one worker has ended, the others' collectives end within cluster.timeout_s; a worker that
  // still has not reported its end a grace period after that is gone (killed): the run fails.
  void check_end_deadline_locked() {
    if (phase != "running" || !first_end) return;
    const auto grace = std::chrono::duration<double>(options.config.cluster.timeout_s + 30);
    if (Clock::now() - *first_end < grace) return;
    std::vector<int64_t> silent;
    for (size_t r = 0; r < members.size(); ++r) {
      if (members[r] && members[r]->status.empty()) silent.push_back(static_cast<int64_t>(r));
    }
    fail_locked(fmt::format("worker rank(s) {} never reported their end (killed?)", fmt::join(silent, ", ")));
  }

  // A worker that never joins fails the run, named, after cluster.join_timeout_s.
  void check_join_deadline_locked() {
    if (phase != "waiting") return;
    const auto limit = std::chrono::duration<double>(options.config.cluster.join_timeout_s);
    if (Clock::now() - started < limit) return;
    if (table && table->live_members() >= options.config.cluster.min_workers) {
      start_elastic_locked(fmt::format(" (cluster.join_timeout_s = {:g} s passed; the others may join later)",
                                       options.config.cluster.join_timeout_s));
      return;
    }
    std::vector<std::string> joined;
    for (size_t r = 0; r < members.size(); ++r) {
      if (members[r]) joined.push_back(fmt::format("{} ({})", r, members[r]->name));
    }
    fail_locked(fmt::format("worker rank(s) {} never joined within {:g} s (cluster.join_timeout_s); joined: {}",
                            fmt::join(missing_locked(), ", "), options.config.cluster.join_timeout_s,
                            joined.empty() ? "none" : fmt::format("{}", fmt::join(joined, ", "))));
  }

  // Each worker resumes from its newest checkpoint whose global parameters all workers have a
  // checkpoint of; among such parameters, the newest set (the one losing least work) wins.
  void plan_resume_locked() {
    std::map<uint64_t, std::vector<int64_t>> newest;  // global hash -> newest step per rank
    for (size_t r = 0; r < members.size(); ++r) {
      const auto& checkpoints = members[r]->request.checkpoints;
      if (checkpoints.empty()) {
        fail_locked(fmt::format("--resume: worker {} ({}) has no checkpoint to resume from", r, members[r]->name));
        return;
      }
      for (const auto& c : checkpoints) {
        auto& steps = newest.try_emplace(c.global_hash, std::vector<int64_t>(members.size(), -1)).first->second;
        steps[r] = std::max(steps[r], c.step);
      }
    }
    std::optional<std::pair<int64_t, uint64_t>> best;  // (least step among ranks, hash)
    for (const auto& [hash, steps] : newest) {
      const int64_t least = *std::min_element(steps.begin(), steps.end());
      if (least >= 0 && (!best || least > best->first)) best = {least, hash};
    }
    if (!best) {
      std::vector<std::string> listing;
      for (size_t r = 0; r < members.size(); ++r) {
        std::vector<std::string> entries;
        for (const auto& c : members[r]->request.checkpoints) entries.push_back(fmt::format("{} ({})", c.step, hex64(c.global_hash)));
        listing.push_back(fmt::format("worker {}: {}", r, fmt::join(entries, ", ")));
      }
      fail_locked(fmt::format("--resume: the workers' checkpoints share no global parameters (step (hash)): {}",
                              fmt::join(listing, "; ")));
      return;
    }
    const auto& steps = newest.at(best->second);
    for (size_t r = 0; r < members.size(); ++r) resume_steps[static_cast<int64_t>(r)] = steps[r];
    log(fmt::format("resuming: worker steps {} (global parameters {})", fmt::join(steps, ", "), hex64(best->second)));
  }

  protocol::JoinReply join(const protocol::JoinRequest& request) {
    RunConfig theirs;
    try {
      theirs = parse_config(request.config_toml, "the worker's config");
    } catch (const ConfigError& e) {
      throw Refusal(fmt::format("{}'s config is invalid: {}", request.name, e.what()));
    }
    if (!token.empty() && !same_secret(request.token, token)) {
      throw Refusal(fmt::format("{} presented {} join token (cluster.join_token or LOCO_JOIN_TOKEN must be the run's)",
                                request.name, request.token.empty() ? "no" : "a wrong"));
    }
    std::lock_guard lock(mutex);
    check_join_deadline_locked();
    if (table) return join_elastic_locked(request, theirs);
    if (phase != "waiting") {
      throw Refusal(fmt::format("the run is {} ({}); this version does not take workers after the start",
                                phase, phase == "failed" ? reason : fmt::format("{} workers", world_size())));
    }
    auto changed_keys = differences_except(options.config, theirs, kPerWorkerKeys);
    if (!changed_keys.empty()) {
      throw Refusal(fmt::format("{}'s config differs from the run's (run -> worker): {}", request.name,
                                fmt::join(changed_keys, "; ")));
    }
    if (!options.dataset) {
      options.dataset = request.dataset;  // the first worker's dataset is the run's
    } else if (auto diff = options.dataset->differences(request.dataset); !diff.empty()) {
      throw Refusal(fmt::format("{}'s dataset differs from the run's: {}; every worker needs the same prepared "
                                "dataset", request.name, fmt::join(diff, "; ")));
    }
    if (request.resume != options.resume) {
      throw Refusal(options.resume ? fmt::format("the run is resuming but {} was started without --resume", request.name)
                                   : fmt::format("{} asks to resume but the run starts fresh (start the coordinator "
                                                 "with --resume)", request.name));
    }
    int64_t rank = request.rank;
    if (rank >= world_size()) {
      throw Refusal(fmt::format("rank {} is outside the run's {} workers (0..{})", rank, world_size(), world_size() - 1));
    }
    if (rank >= 0 && members[static_cast<size_t>(rank)]) {
      const auto& holder = *members[static_cast<size_t>(rank)];
      throw Refusal(fmt::format("rank {} is already taken by {}{}", rank, holder.name,
                                holder.request.rank < 0 ? " (which asked for any rank: give every worker a --rank, or none)" : ""));
    }
    if (rank < 0) {
      auto missing = missing_locked();
      if (missing.empty()) throw Refusal(fmt::format("the run already has its {} workers", world_size()));
      rank = missing.front();
    }
    if (request.resume && request.rank < 0) throw Refusal("a resuming worker must say its rank (--rank)");
    members[static_cast<size_t>(rank)] = Member{request.name, request, "", "", nlohmann::json::object()};
    const auto still_missing = missing_locked();
    log(fmt::format("worker {} joined from {} ({}/{})", rank, request.name, world_size() - static_cast<int64_t>(still_missing.size()),
                    world_size()));
    if (still_missing.empty()) {
      if (options.resume) plan_resume_locked();
      if (phase == "waiting") {
        phase = "running";
        log(fmt::format("all {} workers joined: training starts (epoch {})", world_size(), epoch));
      }
      changed.notify_all();
    }
    return {rank, world_size(), run_id};
  }

  protocol::JoinReply join_elastic_locked(const protocol::JoinRequest& request, const RunConfig& theirs) {
    if (phase == "finished" || phase == "failed") {
      throw Refusal(fmt::format("the run is {}{}", phase, phase == "failed" ? ": " + reason : ""));
    }
    if (stopping) throw Refusal("the run is stopping");
    auto changed_keys = differences_except(options.config, theirs, kPerWorkerKeys);
    if (!changed_keys.empty()) {
      throw Refusal(fmt::format("{}'s config differs from the run's (run -> worker): {}", request.name,
                                fmt::join(changed_keys, "; ")));
    }
    if (!options.dataset) {
      options.dataset = request.dataset;
    } else if (auto diff = options.dataset->differences(request.dataset); !diff.empty()) {
      throw Refusal(fmt::format("{}'s dataset differs from the run's: {}; every worker needs the same prepared "
                                "dataset", request.name, fmt::join(diff, "; ")));
    }
    if (!shards_hash) {
      shards_hash = request.shards_hash;
    } else if (*shards_hash != request.shards_hash) {
      throw Refusal(fmt::format("{} divided the data into shards differently ({} vs the run's {}); k-means on different "
                                "hardware can do this: use data.shard = \"iid\" or \"label\"", request.name,
                                hex64(request.shards_hash), hex64(*shards_hash)));
    }
    std::string why;
    table->expire(Clock::now());  // a silent member's slot is vacant now, whoever else is asking
    auto joined = table->join(request.name, request.rank, Clock::now(), why);
    if (!joined && table->full()) {
      slot_waiters[request.name] = Clock::now();
      throw Full(fmt::format("{} cannot join yet: {}", request.name, why));
    }
    slot_waiters.erase(request.name);
    if (!joined) throw Refusal(fmt::format("{} cannot join: {}", request.name, why));
    flush_events_locked();
    if (phase == "waiting" && table->live_members() == world_size()) start_elastic_locked("");
    protocol::JoinReply reply{joined->slot, world_size(), run_id};
    reply.member = joined->member;
    reply.joiner = joined->joiner;
    reply.position = joined->position;
    if (!joined->joiner) reply.resume_step = resume_step;  // the initial members load the checkpoint
    return reply;
  }

  MembershipTable& elastic_table() {
    if (!table) throw ProtocolError("this run is not elastic (cluster.elastic = false)");
    return *table;
  }

  protocol::StartReply start_reply_locked(int64_t rank) const {
    protocol::StartReply reply;
    reply.phase = phase;
    reply.missing = missing_locked();
    reply.epoch = epoch;
    reply.error = phase == "failed" ? reason : "";
    if (auto it = resume_steps.find(rank); it != resume_steps.end()) reply.resume_step = it->second;
    return reply;
  }

  void done(const protocol::DoneRequest& request) {
    std::lock_guard lock(mutex);
    if (table) {
      if (request.member < 0 || !table->known(request.member)) {
        throw ProtocolError(fmt::format("member {} is not a member of this run", request.member));
      }
      table->leave(request.member, request.status, Clock::now());
      ended[request.member] = Member{fmt::format("slot {}", request.rank), {}, request.status, request.error, request.summary};
      log(fmt::format("member {} {}{}", request.member, request.status, request.error.empty() ? "" : ": " + request.error));
      flush_events_locked();
      check_elastic_end_locked();
      return;
    }
    if (request.rank < 0 || request.rank >= world_size() || !members[static_cast<size_t>(request.rank)]) {
      throw ProtocolError(fmt::format("rank {} is not a member of this run", request.rank));
    }
    auto& member = *members[static_cast<size_t>(request.rank)];
    member.status = request.status;
    member.error = request.error;
    member.summary = request.summary;
    log(fmt::format("worker {} {}{}", request.rank, request.status, request.error.empty() ? "" : ": " + request.error));
    if (!first_end) first_end = Clock::now();
    const bool all_done = std::all_of(members.begin(), members.end(), [](const auto& m) { return m && !m->status.empty(); });
    if (all_done && phase != "failed") {
      phase = "finished";
      changed.notify_all();
    }
  }

  nlohmann::json state_locked() const {
    nlohmann::json list = nlohmann::json::array();
    for (size_t r = 0; r < members.size(); ++r) {
      if (!members[r]) continue;
      list.push_back({{"rank", r}, {"name", members[r]->name}, {"status", members[r]->status.empty() ? "training" : members[r]->status}});
    }
    nlohmann::json state = {{"phase", phase}, {"stopping", stopping}, {"reason", reason}, {"epoch", epoch},
                            {"workers", world_size()}, {"run_id", run_id}, {"members", list}, {"missing", missing_locked()}};
    if (table) state["elastic"] = table->describe();
    return state;
  }

  // Wraps a handler: protocol errors are the peer's (400), refusals are answers (409); any other
  // exception is logged and answered 500. The coordinator keeps serving the others either way.
  template <class F>
  httplib::Server::Handler guard(F&& handler) {
    return [this, handler](const httplib::Request& request, httplib::Response& response) {
      try {
        handler(request, response);
      } catch (const Full& e) {
        reply_json(response, {{"error", e.what()}}, 503);  // asked again until a slot frees: not logged each time
      } catch (const Refusal& e) {
        log(fmt::format("refused {} from {}: {}", request.path, request.remote_addr, e.what()));
        reply_json(response, {{"error", e.what()}}, 409);
      } catch (const ProtocolError& e) {
        log(fmt::format("bad request {} from {}: {}", request.path, request.remote_addr, e.what()));
        reply_json(response, {{"error", e.what()}}, 400);
      } catch (const std::exception& e) {
        log(fmt::format("request {} from {} failed: {}", request.path, request.remote_addr, e.what()));
        reply_json(response, {{"error", e.what()}}, 500);
      }
    };
  }

  void install_routes() {
    server.Post("/v1/join", guard([this](const auto& request, auto& response) {
      reply_json(response, join(protocol::JoinRequest::from_json(body_json(request))).to_json());
    }));
    server.Post("/v1/start", guard([this](const auto& request, auto& response) {
      const auto body = body_json(request);
      if (!body.is_object() || !body.contains("rank") || !body["rank"].is_number_integer()) {
        throw ProtocolError("field 'rank' is missing or not an integer");
      }
      const int64_t rank = body["rank"].template get<int64_t>();
      std::unique_lock lock(mutex);
      check_join_deadline_locked();
      changed.wait_for(lock, kMaxWait, [&] { return phase != "waiting"; });
      check_join_deadline_locked();
      reply_json(response, start_reply_locked(rank).to_json());
    }));
    server.Post("/v1/stop", guard([this](const auto& request, auto& response) {
      const auto body = body_json(request);
      const std::string why = body.is_object() && body.contains("reason") && body["reason"].is_string()
                                  ? body["reason"].template get<std::string>().substr(0, 1024)
                                  : "a worker asked";
      std::lock_guard lock(mutex);
      if (!stopping) log("stopping: " + why);
      stopping = true;
      if (reason.empty()) reason = why;
      reply_json(response, {{"stopping", true}});
    }));
    server.Get("/v1/state", guard([this](const auto&, auto& response) {
      std::lock_guard lock(mutex);
      reply_json(response, state_locked());
    }));
    server.Post("/v1/done", guard([this](const auto& request, auto& response) {
      done(protocol::DoneRequest::from_json(body_json(request)));
      reply_json(response, {{"ok", true}});
    }));
    server.Post("/v1/heartbeat", guard([this](const auto& request, auto& response) {
      const auto body = protocol::HeartbeatRequest::from_json(body_json(request));
      std::lock_guard lock(mutex);
      auto& t = elastic_table();
      t.expire(Clock::now());
      const auto reply = t.heartbeat(body.member, stopping, Clock::now(), body.step);
      flush_events_locked();
      reply_json(response, reply.to_json());
    }));
    server.Post("/v1/round", guard([this](const auto& request, auto& response) {
      const auto body = protocol::RoundRequest::from_json(body_json(request));
      std::unique_lock lock(mutex);
      auto& t = elastic_table();
      const auto deadline = Clock::now() + kMaxWait;
      for (;;) {
        t.expire(Clock::now());
        auto reply = t.arrive(body, stopping, Clock::now());
        flush_events_locked();
        if (phase == "failed") {
          reply.action = "stop";
          reply.reason = "the run failed: " + reason;
        }
        if (reply.action != "wait" || Clock::now() >= deadline) {
          reply_json(response, reply.to_json());
          return;
        }
        changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
      }
    }));
    server.Post("/v1/round_done", guard([this](const auto& request, auto& response) {
      const auto body = protocol::RoundDone::from_json(body_json(request));
      std::lock_guard lock(mutex);
      auto error = elastic_table().round_done(body, Clock::now());
      flush_events_locked();
      if (error) fail_locked(*error);
      reply_json(response, {{"ok", !error}});
    }));
    server.Post("/v1/kv/set", guard([this](const auto& request, auto& response) {
      try {
        store.set(key_param(request), request.body);
      } catch (const Error& e) {
        throw ProtocolError(e.what());  // over a limit
      }
      reply_json(response, {{"ok", true}});
    }));
    server.Get("/v1/kv/get", guard([this](const auto& request, auto& response) {
      const auto key = key_param(request);
      const auto wait = std::clamp<int64_t>(int_param(request, "wait_ms"), 0, kMaxWait.count());
      auto value = store.get(key, std::chrono::milliseconds(wait));
      if (!value) {
        reply_json(response, {{"error", "not set"}}, 404);
        return;
      }
      response.set_content(*value, "application/octet-stream");
    }));
    server.Post("/v1/kv/add", guard([this](const auto& request, auto& response) {
      int64_t value = 0;
      try {
        value = store.add(key_param(request), int_param(request, "delta"));
      } catch (const ProtocolError&) {
        throw;
      } catch (const Error& e) {
        throw ProtocolError(e.what());
      }
      reply_json(response, {{"value", value}});
    }));
    server.Post("/v1/kv/check", guard([this](const auto& request, auto& response) {
      const auto body = body_json(request);
      std::vector<std::string> keys;
      try {
        keys = body.template get<std::vector<std::string>>();
      } catch (const nlohmann::json::exception&) {
        throw ProtocolError("the body must be a JSON array of keys");
      }
      reply_json(response, {{"ok", store.check(keys)}});
    }));
    server.Post("/v1/kv/remove", guard([this](const auto& request, auto& response) {
      reply_json(response, {{"removed", store.remove(key_param(request))}});
    }));
    server.Get("/v1/kv/size", guard([this](const auto&, auto& response) { reply_json(response, {{"size", store.size()}}); }));
    server.Get("/", guard([this](const auto&, auto& response) {
      std::lock_guard lock(mutex);
      std::string text = fmt::format("loco coordinator, run {} ({})\nphase: {}{}\nepoch {}, {} workers\n", options.config.run.dir,
                                     run_id, phase, stopping ? " (stopping: " + reason + ")" : "", epoch, world_size());
      for (size_t r = 0; r < members.size(); ++r) {
        text += members[r] ? fmt::format("  worker {}: {} {}\n", r, members[r]->name,
                                         members[r]->status.empty() ? (phase == "waiting" ? "joined" : "training") : members[r]->status)
                           : fmt::format("  worker {}: not joined\n", r);
      }
      response.set_content(text, "text/plain");
    }));
  }
};

Coordinator::Coordinator(CoordinatorOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  auto& server = impl_->server;
  // httplib sets SO_REUSEPORT by default, which would let a second coordinator share the port
  // silently. Plain SO_REUSEADDR makes "already in use" an error, as it should be.
  server.set_socket_options([](socket_t socket) {
    int yes = 1;
    ::setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  server.set_read_timeout(std::chrono::seconds(10));
  server.set_write_timeout(std::chrono::seconds(10));
  server.set_payload_max_length(4 << 20);
  const size_t threads = static_cast<size_t>(std::max<int64_t>(8, 2 * impl_->world_size() + 4));
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  impl_->install_routes();
  const auto& bind = impl_->options.bind;
  const int64_t port = impl_->options.port;
  errno = 0;
  if (port == 0) {
    impl_->port = server.bind_to_any_port(bind);
  } else {
    impl_->port = server.bind_to_port(bind, static_cast<int>(port)) ? static_cast<int>(port) : -1;
  }
  if (impl_->port <= 0) {
    const int error = errno;
    throw ConfigError("coordinator", fmt::format("cannot listen on {}:{}: {}; hint: choose another --port (cluster.port) or "
                                                 "stop what holds it", bind, port,
                                                 error != 0 ? std::strerror(error) : "the address is in use or not this machine's"));
  }
}

Coordinator::~Coordinator() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int64_t Coordinator::port() const { return impl_->port; }

void Coordinator::start() {
  impl_->thread = std::thread([this] { impl_->server.listen_after_bind(); });
  impl_->log(fmt::format("listening on {}:{} for {} worker(s) of {}", impl_->options.bind, impl_->port,
                         impl_->world_size(), impl_->options.config.run.dir));
}

std::optional<CoordinatorResult> Coordinator::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mutex);
  const auto deadline = Clock::now() + timeout;
  while (impl_->phase != "finished" && impl_->phase != "failed") {
    impl_->check_join_deadline_locked();
    if (impl_->table) {
      impl_->check_elastic_end_locked();
    } else {
      impl_->check_end_deadline_locked();
    }
    if (Clock::now() >= deadline) return std::nullopt;
    impl_->changed.wait_for(lock, std::min<Clock::duration>(std::chrono::milliseconds(200), deadline - Clock::now()));
  }
  CoordinatorResult result;
  result.message = impl_->reason;
  bool any_failed = impl_->phase == "failed", any_stopped = false;
  if (impl_->table) {
    // An elastic run fails only as a whole: members that failed were replaced or done without.
    for (const auto& [id, m] : impl_->ended) {
      result.summaries.push_back(m.summary);
      if (m.status == "stopped") any_stopped = true;
    }
    result.outcome = any_failed ? RunOutcome::kFailed : any_stopped || impl_->stopping ? RunOutcome::kStopped : RunOutcome::kFinished;
    return result;
  }
  for (const auto& m : impl_->members) {
    result.summaries.push_back(m ? m->summary : nlohmann::json::object());
    if (m && m->status == "failed") {
      any_failed = true;
      if (result.message.empty()) result.message = m->error;
    }
    if (m && m->status == "stopped") any_stopped = true;
  }
  result.outcome = any_failed ? RunOutcome::kFailed : any_stopped || impl_->stopping ? RunOutcome::kStopped : RunOutcome::kFinished;
  return result;
}

void Coordinator::request_stop(const std::string& reason) {
  std::lock_guard lock(impl_->mutex);
  if (!impl_->stopping) impl_->log("stopping: " + reason);
  impl_->stopping = true;
  if (impl_->reason.empty()) impl_->reason = reason;
}

void Coordinator::process_exited(const std::string& host, int64_t pid, int status) {
  std::lock_guard lock(impl_->mutex);
  if (!impl_->table) return;
  if (auto member = impl_->table->member_of_process(host, pid)) {
    impl_->table->declare_failed(*member, fmt::format("its process exited with status {}", status), Clock::now());
    impl_->flush_events_locked();
  }
}

void Coordinator::fail(const std::string& reason) {
  std::lock_guard lock(impl_->mutex);
  impl_->fail_locked(reason);
}

nlohmann::json Coordinator::state() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->state_locked();
}

}  // namespace loco::runtime
