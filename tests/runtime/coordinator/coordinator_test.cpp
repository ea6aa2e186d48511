// The coordinator in-process, driven through CoordinatorClient and through raw HTTP: joins and
// refusals, the rendezvous store, a missing worker, the resume plan, and hostile requests.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/run_folder.h"
#include "loco/runtime/net/auth.h"
#include "loco/runtime/coordinator/coordinator.h"
#include "loco/runtime/coordinator/outer_wire.h"
#include "loco/runtime/coordinator/coordinator_client.h"
#include "loco/runtime/status/status_routes.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

// A client of a coordinator without a token (these tests' own, on loopback): it believes unsigned
// answers, as `loco worker --insecure` does.
const ClientSecurity kInsecure{.insecure = true};

using namespace std::chrono_literals;
using testing_util::expect_error;

RunConfig run_config(int64_t workers) {
  RunConfig c;
  c.sync.algorithm = Algorithm::kDiLoCo;
  c.cluster.workers = workers;
  c.cluster.join_timeout_s = 30;
  resolve_defaults(c);
  return c;
}

protocol::DatasetIdentity dataset() {
  protocol::DatasetIdentity d;
  d.tokenizer_hash = 0x1234;
  d.vocab_size = 320;
  d.train_documents = 36;
  d.train_tokens = 38000;
  d.labels = {""};
  return d;
}

protocol::JoinRequest join_request(const RunConfig& config, int64_t rank = -1) {
  protocol::JoinRequest r;
  r.name = "test:" + std::to_string(rank);
  r.rank = rank;
  r.config_toml = to_toml(config);
  r.dataset = dataset();
  return r;
}

struct Running {
  explicit Running(CoordinatorOptions options) : coordinator((options.bind = "127.0.0.1", options.port = 0, options)) {
    coordinator.start();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(coordinator.port()); }
  Coordinator coordinator;
};

CoordinatorOptions options_for(const RunConfig& config) {
  CoordinatorOptions o;
  o.config = config;
  o.token = join_token(config.cluster);
  return o;
}

// A coordinator resuming a fixed run of `config`, its client, and each worker joining with the
// checkpoints it holds (step, global hash), in rank order.
struct Resuming {
  explicit Resuming(const RunConfig& config)
      : running((options = options_for(config), options.resume = true, options)), client(running.address(), 5s, kInsecure) {}
  void join(const RunConfig& config, const std::vector<std::vector<protocol::CheckpointInfo>>& held) {
    for (size_t rank = 0; rank < held.size(); ++rank) {
      auto request = join_request(config, static_cast<int64_t>(rank));
      request.resume = true;
      request.checkpoints = held[rank];
      client.join(request);
    }
  }
  CoordinatorOptions options;
  Running running;
  CoordinatorClient client;
};

// The headers of a request signed with `token` for the coordinator `instance`, as CoordinatorClient
// sends them.
httplib::Headers signed_headers(const std::string& token, const std::string& instance, const std::string& method,
                                const std::string& target, const std::string& body,
                                std::optional<int64_t> time = std::nullopt) {
  auto s = auth::sign(auth::Key(token), method, target, instance, body);
  if (time) {
    s.time = *time;
    s.mac = auth::mac(auth::Key(token), method, target, s.time, s.nonce, instance, body);
  }
  return {{auth::kTimeHeader, std::to_string(s.time)}, {auth::kNonceHeader, s.nonce}, {auth::kMacHeader, s.mac},
          {auth::kInstanceHeader, instance}};
}

// The coordinator's instance, as a worker learns it: from the refusal of its first request, signed
// for no instance.
std::string instance_of(httplib::Client& raw, const std::string& token) {
  auto headers = signed_headers(token, "", "GET", "/v1/kv/size", "");
  headers.erase(auth::kInstanceHeader);
  auto refusal = raw.Get("/v1/kv/size", headers);
  if (!refusal || refusal->status != 401) return "";
  return refusal->get_header_value(auth::kInstanceHeader);
}

TEST(Coordinator, WorkersJoinStartAndShareTheStore) {
  const auto config = run_config(2);
  Running running(options_for(config));
  CoordinatorClient a(running.address(), 5s, kInsecure), b(running.address(), 5s, kInsecure);
  auto joined_a = a.join(join_request(config));
  auto joined_b = b.join(join_request(config));
  EXPECT_EQ(joined_a.rank, 0);
  EXPECT_EQ(joined_b.rank, 1);
  EXPECT_EQ(joined_a.world_size, 2);
  EXPECT_EQ(joined_a.run_id, joined_b.run_id);
  auto start = a.wait_for_start(0, nullptr);
  EXPECT_EQ(start.phase, protocol::Phase::kRunning);
  EXPECT_EQ(start.epoch, 0);
  EXPECT_FALSE(start.resume_step.has_value());

  // The store, over HTTP: binary values, waits that time out, counters.
  auto store_a = a.key_value_store(), store_b = b.key_value_store();
  std::thread later([&] {
    std::this_thread::sleep_for(300ms);
    store_a->set("epoch/0/addr/0", std::string("\0\1\2 bytes", 9));
  });
  auto value = store_b->get("epoch/0/addr/0", 10s);
  later.join();
  ASSERT_TRUE(value.has_value());
  EXPECT_EQ(*value, std::string("\0\1\2 bytes", 9));
  const auto before = std::chrono::steady_clock::now();
  EXPECT_FALSE(store_b->get("never/set", 500ms).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - before, 450ms);
  EXPECT_EQ(store_a->add("counter", 5), 5);
  EXPECT_EQ(store_b->add("counter", -2), 3);
  EXPECT_TRUE(store_a->check({"epoch/0/addr/0", "counter"}));
  EXPECT_TRUE(store_a->remove("counter"));
  EXPECT_FALSE(store_a->check({"counter"}));

  // Stop, then both end: the run stopped.
  EXPECT_FALSE(a.run_stopping());
  b.report_stop(1, "worker 1 interrupted");
  EXPECT_TRUE(a.run_stopping());
  a.report_done({0, protocol::EndStatus::kStopped, "", {{"steps", 7}}});
  EXPECT_FALSE(running.coordinator.wait_for(0ms).has_value()) << "worker 1 has not reported its end";
  b.report_done({1, protocol::EndStatus::kStopped, "", {{"steps", 8}}});
  auto result = running.coordinator.wait_for(5s);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->outcome, RunOutcome::kStopped);
  ASSERT_EQ(result->summaries.size(), 2u);
  ASSERT_TRUE(result->summaries[1].has_value());
  EXPECT_EQ(result->summaries[1]->steps, 8);
}

TEST(Coordinator, RefusesWorkersThatDoNotFit) {
  const auto config = run_config(2);
  Running running(options_for(config));
  CoordinatorClient client(running.address(), 5s, kInsecure);
  auto other_shape = config;
  other_shape.model.layers = 7;
  expect_error<ConfigError>([&] { client.join(join_request(other_shape)); }, "model.layers: 4 -> 7");
  auto other_data = join_request(config);
  other_data.dataset.train_tokens = 1;
  client.join(join_request(config, 1));  // the first worker's dataset matches the reference
  expect_error<ConfigError>([&] { client.join(other_data); }, "train_tokens: 38000 (run) vs 1 (worker)");
  expect_error<ConfigError>([&] { client.join(join_request(config, 1)); }, "rank 1 is already taken by test:1");
  expect_error<ConfigError>([&] { client.join(join_request(config, 5)); }, "rank 5 is outside the run's 2 workers");
  auto resuming = join_request(config, 0);
  resuming.resume = true;
  expect_error<ConfigError>([&] { client.join(resuming); }, "asks to resume but the run starts fresh");
  // Paths, devices and one process's own settings may differ.
  auto elsewhere = config;
  elsewhere.run.dir = "/elsewhere";
  elsewhere.train.device = "cpu";
  elsewhere.cluster.connect_timeout_s = 5;
  EXPECT_EQ(client.join(join_request(elsewhere)).rank, 0);
  expect_error<ConfigError>([&] { client.join(join_request(config)); }, "the run is running");
}

TEST(Coordinator, MissingWorkerFailsTheRunByName) {
  auto config = run_config(3);
  config.cluster.join_timeout_s = 0.5;
  Running running(options_for(config));
  CoordinatorClient client(running.address(), 5s, kInsecure);
  client.join(join_request(config, 1));
  expect_error<Error>([&] { client.wait_for_start(1, nullptr); }, "worker rank(s) 0, 2 never joined within 0.5 s");
  auto result = running.coordinator.wait_for(1s);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->outcome, RunOutcome::kFailed);
  EXPECT_NE(result->message.find("joined: 1 (test:1)"), std::string::npos) << result->message;
}

TEST(Coordinator, ResumePicksTheNewestParametersEveryWorkerHas) {
  const auto config = run_config(2);
  Resuming resuming(config);
  // Worker 0 went on past the round that worker 1 lost.
  resuming.join(config, {{{30, 0xA}, {36, 0xA}, {20, 0x9}}, {{10, 0x8}, {20, 0x9}}});
  auto start0 = resuming.client.wait_for_start(0, nullptr), start1 = resuming.client.wait_for_start(1, nullptr);
  EXPECT_EQ(start0.resume_step, 20);
  EXPECT_EQ(start1.resume_step, 20);
  EXPECT_FALSE(start0.copy.has_value());
}

// Issue #48: a worker that holds no checkpoint (killed before its first, or its disk lost) resumes
// from a copy of the furthest checkpoint of the chosen parameters; every worker is told who sends
// it to whom. Independent replicas share no group, so there it is refused; so is a run in which no
// worker holds one.
TEST(Coordinator, AWorkerWithoutCheckpointsResumesFromACopyOfAnothers) {
  for (const auto algorithm : {Algorithm::kDiLoCo, Algorithm::kLocal}) {
    auto config = run_config(3);
    config.sync.algorithm = algorithm;
    Resuming resuming(config);
    // Worker 2 is furthest into the round of 0xA; worker 1 holds nothing.
    resuming.join(config, {{{20, 0x9}, {30, 0xA}}, {}, {{20, 0x9}, {34, 0xA}}});
    if (algorithm == Algorithm::kLocal) {
      expect_error<Error>([&] { resuming.client.wait_for_start(1, nullptr); }, "worker 1 holds no checkpoint to resume from");
      continue;
    }
    for (int64_t rank = 0; rank < 3; ++rank) {
      auto start = resuming.client.wait_for_start(rank, nullptr);
      EXPECT_EQ(start.resume_step, std::vector<int64_t>({30, 34, 34})[static_cast<size_t>(rank)]) << "rank " << rank;
      ASSERT_TRUE(start.copy.has_value());
      EXPECT_EQ(start.copy->from, 2);
      EXPECT_EQ(start.copy->to, std::vector<int64_t>{1});
    }
  }
  const auto config = run_config(2);
  Resuming resuming(config);
  resuming.join(config, {{}, {}});
  expect_error<Error>([&] { resuming.client.wait_for_start(0, nullptr); }, "no worker holds a checkpoint to resume from");
}

TEST(Coordinator, ResumeWithoutCommonParametersFails) {
  const auto config = run_config(2);
  Resuming resuming(config);
  resuming.join(config, {{{30, 0xA}}, {{10, 0x8}}});
  expect_error<Error>([&] { resuming.client.wait_for_start(0, nullptr); }, "share no global parameters");
}

// Garbage, truncated JSON, wrong types, huge keys: answered 400, and the coordinator serves on.
TEST(Coordinator, HostileRequestsGetAnErrorAndChangeNothing) {
  const auto config = run_config(1);
  Running running(options_for(config));
  httplib::Client raw("127.0.0.1", static_cast<int>(running.coordinator.port()));
  raw.set_read_timeout(5s);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"/v1/join", std::string("\x00\xff\x13garbage", 10)},
      {"/v1/join", R"({"version": 1, "name": "x", "rank": "zero")"},
      {"/v1/join", R"({"version": 1, "name": "x", "rank": "zero", "config": "", "dataset": {}, "resume": false})"},
      {"/v1/join", R"({"version": 99})"},
      {"/v1/done", R"({"rank": 0, "status": "exploded"})"},
      {"/v1/start", R"([1, 2])"},
      {"/v1/kv/set?key=" + std::string(600, 'k'), "v"},
      {"/v1/kv/add?key=n&delta=ten", ""},
      {"/v1/kv/check", R"({"not": "a list"})"},
      {"/v1/stop", std::string(100000, '[') + std::string(100000, ']')},  // copying it would overflow the stack
  };
  for (const auto& [path, body] : bad) {
    auto result = raw.Post(path, body, "application/json");
    ASSERT_TRUE(result) << path;
    EXPECT_EQ(result->status, 400) << path << ": " << result->body;
    EXPECT_NE(result->body.find("error"), std::string::npos);
  }
  auto too_big = raw.Post("/v1/kv/set?key=big", std::string(5 << 20, 'x'), "application/json");
  ASSERT_TRUE(too_big);
  EXPECT_EQ(too_big->status, 413);
  EXPECT_EQ(running.coordinator.state()["members"].size(), 0u) << "nothing joined";
  CoordinatorClient client(running.address(), 5s, kInsecure);
  EXPECT_EQ(client.join(join_request(config)).rank, 0) << "a good worker is still served";
}

// What a web page in a browser could send, to a coordinator without a join token (--insecure):
// a cross-site form or fetch that would stop the run, and reads through a DNS name rebound to
// this machine. Refused with 403; the coordinator serves its own clients on.
TEST(Coordinator, WithoutATokenWhatAWebPageSendsIsRefused) {
  const auto config = run_config(1);
  Running running(options_for(config));
  const int port = static_cast<int>(running.coordinator.port());
  httplib::Client raw("127.0.0.1", port);
  raw.set_read_timeout(5s);
  auto csrf = raw.Post("/v1/stop", httplib::Headers{{"Origin", "http://attacker.example"}}, "{}", "application/json");
  ASSERT_TRUE(csrf);
  EXPECT_EQ(csrf->status, 403) << csrf->body;
  auto form = raw.Post("/v1/stop", "{}", "text/plain");  // what a cross-site <form> may post without asking
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 403) << form->body;
  auto rebound = raw.Get("/v1/state", httplib::Headers{{"Host", "attacker.example"}});
  ASSERT_TRUE(rebound);
  EXPECT_EQ(rebound->status, 403) << rebound->body;
  auto own = raw.Get("/v1/state");
  ASSERT_TRUE(own);
  EXPECT_EQ(own->status, 200) << own->body;
  CoordinatorClient client(running.address(), 5s, kInsecure);
  EXPECT_EQ(client.join(join_request(config)).rank, 0) << "not stopped: a good worker is still served";

  auto post = [](std::string host, std::vector<std::pair<std::string, std::string>> headers) {
    HttpRequest r;
    r.method = "POST";
    r.path = r.target = "/v1/stop";
    r.headers["Host"] = std::move(host);
    for (auto& [k, v] : headers) r.headers[k] = v;
    return r;
  };
  const std::vector<std::pair<std::string, std::string>> json = {{"Content-Type", "application/json"}};
  EXPECT_FALSE(browser_refusal(post("node7:29500", json), true, "node7"));
  EXPECT_FALSE(browser_refusal(post("node7.:29500", json), true, "node7"));
  // The machine's name exactly: a rebinding site may be named node7.attacker.example (issue #49).
  EXPECT_TRUE(browser_refusal(post("node7.attacker.example:29500", json), true, "node7"));
  EXPECT_TRUE(browser_refusal(post("node7.cluster.example", json), true, "node7"));
  EXPECT_FALSE(browser_refusal(post("10.0.0.1:29500", json), true, "node7"));
  EXPECT_FALSE(browser_refusal(post("[fe80::1]:29500", json), true, "node7"));
  EXPECT_TRUE(browser_refusal(post("node77:29500", json), true, "node7"));
  EXPECT_TRUE(browser_refusal(post("attacker.example", json), true, "node7"));
  EXPECT_FALSE(browser_refusal(post("attacker.example", json), false, "node7")) << "with a token the MAC decides";
  EXPECT_TRUE(browser_refusal(post("node7", {{"Content-Type", "application/json"}, {"Sec-Fetch-Site", "cross-site"}}), false, "node7"));
  EXPECT_TRUE(browser_refusal(post("node7", {}), false, "node7")) << "no JSON body";
}

// A retried /v1/kv/add (its answer was lost) carries the same request id and is not applied
// twice; a new id, or none, is a new add. The client sends one id per call.
TEST(Coordinator, ARetriedStoreAddIsAppliedOnce) {
  const auto config = run_config(1);
  Running running(options_for(config));
  httplib::Client raw("127.0.0.1", static_cast<int>(running.coordinator.port()));
  raw.set_read_timeout(5s);
  auto add = [&](const std::string& query) {
    auto result = raw.Post("/v1/kv/add?key=n&delta=5" + query, "", "application/json");
    EXPECT_TRUE(result);
    EXPECT_EQ(result->status, 200) << result->body;
    return nlohmann::json::parse(result->body).at("value").get<int64_t>();
  };
  EXPECT_EQ(add("&request=0a1b"), 5);
  EXPECT_EQ(add("&request=0a1b"), 5) << "the same request again: answered, not applied";
  EXPECT_EQ(add("&request=0a1c"), 10);
  EXPECT_EQ(add(""), 15);
  auto hostile = raw.Post("/v1/kv/add?key=n&delta=1&request=" + std::string(65, 'r'), "", "application/json");
  ASSERT_TRUE(hostile);
  EXPECT_EQ(hostile->status, 400);
  CoordinatorClient client(running.address(), 5s, kInsecure);
  auto store = client.key_value_store();
  EXPECT_EQ(store->add("n", 1), 16);
  EXPECT_EQ(store->add("n", 1), 17) << "each call of the client is its own request";
}

// An elastic coordinator writes its membership events to RUN/metrics.jsonl and its state to
// RUN/coordinator.json: each test has a run folder of its own.
RunConfig elastic_config(const testing_util::TempDir& run, int64_t workers, const std::string& token) {
  RunConfig c = run_config(workers);
  c.run.dir = run.path().string();
  c.cluster.elastic = true;
  c.cluster.join_token = token;
  return c;
}

TEST(Coordinator, JoinTokenIsRequiredAndNeverLogged) {
  testing_util::TempDir run;
  const std::string secret = "s3cret-token-value";
  auto options = options_for(elastic_config(run, 2, secret));
  std::vector<std::string> lines;
  std::mutex mutex;
  options.log = [&](const std::string& line) {
    std::lock_guard lock(mutex);
    lines.push_back(line);
  };
  Running running(options);
  auto request = join_request(elastic_config(run, 2, secret));
  CoordinatorClient unsigned_client(running.address(), 1s), wrong(running.address(), 1s, {"wrong"});
  expect_error<ConfigError>([&] { unsigned_client.join(request); }, "the request is not signed");
  // A worker with another token is refused unsigned, which it does not believe at once (a forged
  // refusal could end it): it gives up when its patience runs out, naming the token.
  expect_error<PeerError>([&] { wrong.join(request); }, "wrong MAC");
  expect_error<PeerError>([&] { wrong.join(request); }, "every worker needs the run's join token");
  CoordinatorClient client(running.address(), 5s, {secret});
  auto joined = client.join(request);
  EXPECT_GE(joined.member, 0);
  EXPECT_EQ(request.to_json().dump().find(secret), std::string::npos) << "the join request does not carry the token";
  // The worker's own config carries a different token: not a config difference (it is per worker),
  // and never shown.
  auto other = join_request(elastic_config(run, 2, "another"));
  other.name = "second";
  EXPECT_GE(client.join(other).member, 0);
  std::lock_guard lock(mutex);
  ASSERT_FALSE(lines.empty());
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const auto& l) {
    return l.find("refused POST /v1/join from 127.0.0.1") != std::string::npos && l.find("not signed") != std::string::npos;
  })) << "the coordinator logs who tried";
  for (const auto& line : lines) EXPECT_EQ(line.find(secret), std::string::npos) << line;
  EXPECT_EQ(to_toml(elastic_config(run, 2, secret)).find(secret), std::string::npos) << "config.toml never holds it";
  for (const char* file : {"coordinator.json", "metrics.jsonl"}) {
    EXPECT_EQ(read_file(run.path() / file, "test").find(secret), std::string::npos) << file;
  }
}

// Every request that changes the run needs a signature: a stranger's stop, store writes and
// removals, a wrong token, a captured request replayed, an altered one and a stale one are refused
// with 401 and change nothing; the status stays readable from this machine.
TEST(Coordinator, AStrangerCannotDriveTheRun) {
  testing_util::TempDir run;
  const auto config = elastic_config(run, 2, "tok");
  Running running(options_for(config));
  CoordinatorClient member(running.address(), 5s, {"tok"});
  auto store = member.key_value_store();
  store->set("epoch/0/addr", "10.0.0.1");
  httplib::Client raw("127.0.0.1", static_cast<int>(running.coordinator.port()));
  raw.set_read_timeout(5s);
  auto post = [&](const std::string& target, const std::string& body, const httplib::Headers& headers = {}) {
    auto result = raw.Post(target, headers, body, "application/json");
    return result ? result->status : -1;
  };
  EXPECT_EQ(post("/v1/stop", R"({"reason": "a stranger"})"), 401);
  EXPECT_EQ(post("/v1/kv/set?key=epoch/0/addr", "6.6.6.6"), 401);
  EXPECT_EQ(post("/v1/kv/remove?key=epoch/0/addr", ""), 401);
  EXPECT_EQ(post("/v1/kv/add?key=n&delta=1", ""), 401);
  EXPECT_EQ(post("/v1/join", join_request(config).to_json().dump()), 401);
  auto read = raw.Get("/v1/kv/get?key=epoch/0/addr&wait_ms=0");
  ASSERT_TRUE(read);
  EXPECT_EQ(read->status, 401) << "the store is not readable without the token either";
  EXPECT_NE(read->body.find("the request is not signed"), std::string::npos) << read->body;
  const auto instance = instance_of(raw, "tok");
  ASSERT_TRUE(auth::is_instance(instance)) << instance;
  EXPECT_EQ(post("/v1/stop", "{}", signed_headers("wrong", instance, "POST", "/v1/stop", "{}")), 401);

  const std::string add = "/v1/kv/add?key=n&delta=1";
  const auto captured = signed_headers("tok", instance, "POST", add, "");
  EXPECT_EQ(post(add, "", captured), 200) << "the member's own request";
  EXPECT_EQ(post(add, "", captured), 401) << "the same request replayed";
  EXPECT_EQ(post("/v1/kv/add?key=n&delta=100", "", signed_headers("tok", instance, "POST", add, "")), 401) << "another target";
  EXPECT_EQ(post("/v1/kv/set?key=epoch/0/addr", "6.6.6.6",
                 signed_headers("tok", instance, "POST", "/v1/kv/set?key=epoch/0/addr", "10.0.0.2")),
            401) << "another body";
  EXPECT_EQ(post(add, "", signed_headers("tok", instance, "POST", add, "", auth::unix_now() - 600)), 401)
      << "signed 10 minutes ago";

  EXPECT_EQ(store->get("epoch/0/addr", 1s), "10.0.0.1");
  EXPECT_EQ(store->add("n", 0), 1) << "only the member's add was applied";
  auto state = raw.Get("/v1/state");
  ASSERT_TRUE(state);
  EXPECT_EQ(state->status, 200) << "the status stays readable from this machine";
  EXPECT_FALSE(nlohmann::json::parse(state->body)["stopping"].get<bool>());
  auto page = raw.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
}

// A request captured at one coordinator is refused by the same run's coordinator restarted (which
// has forgotten the nonces it accepted) and by another run's coordinator with the same token: each
// start is an instance of its own, which the MAC binds. A member signs anew for the new instance,
// which the refusal tells it, and goes on.
TEST(Coordinator, ARequestCapturedBeforeARestartOrAtAnotherRunIsRefused) {
  testing_util::TempDir run, other_run;
  auto options = options_for(elastic_config(run, 2, "tok"));
  options.bind = "127.0.0.1";
  options.port = 0;
  auto first = std::make_unique<Coordinator>(options);
  first->start();
  options.port = first->port();
  const std::string address = "127.0.0.1:" + std::to_string(options.port);
  CoordinatorClient member(address, 5s, {"tok"});
  auto store = member.key_value_store();
  EXPECT_EQ(store->add("n", 1), 1);

  const std::string add = "/v1/kv/add?key=n&delta=1";
  httplib::Headers captured;
  {
    httplib::Client raw("127.0.0.1", static_cast<int>(options.port));
    captured = signed_headers("tok", instance_of(raw, "tok"), "POST", add, "");
    auto accepted = raw.Post(add, captured, "", "application/json");
    ASSERT_TRUE(accepted);
    EXPECT_EQ(accepted->status, 200) << accepted->body;
  }
  first.reset();
  auto replay = [&](int64_t port) {
    httplib::Client raw("127.0.0.1", static_cast<int>(port));
    raw.set_read_timeout(5s);
    auto result = raw.Post(add, captured, "", "application/json");
    return result ? std::pair{result->status, result->body} : std::pair{-1, std::string()};
  };

  Coordinator restarted(options);
  restarted.start();
  const auto refused = replay(options.port);
  EXPECT_EQ(refused.first, 401) << "replayed at the restarted coordinator: " << refused.second;
  EXPECT_NE(refused.second.find("another coordinator instance"), std::string::npos) << refused.second;
  EXPECT_EQ(store->add("n", 0), 0) << "the member goes on at the restarted coordinator; the replay added nothing";

  auto other_options = options_for(elastic_config(other_run, 2, "tok"));
  other_options.bind = "127.0.0.1";
  other_options.port = 0;
  Coordinator other(other_options);
  other.start();
  EXPECT_EQ(replay(other.port()).first, 401) << "replayed at another run's coordinator with the same token";
  CoordinatorClient other_member("127.0.0.1:" + std::to_string(other.port()), 5s, {"tok"});
  EXPECT_EQ(other_member.key_value_store()->add("n", 0), 0) << "nothing was added there either";
}

// A coordinator without a token listens only on loopback, unless told it is on a trusted network.
TEST(Coordinator, RefusesToListenBeyondLoopbackWithoutAToken) {
  auto o = options_for(run_config(1));
  o.bind = "0.0.0.0";
  o.port = 0;
  expect_error<ConfigError>([&] { Coordinator c(o); }, "refusing to listen on 0.0.0.0 without a join token");
  o.insecure = true;
  EXPECT_NO_THROW(Coordinator c(o));
  o.insecure = false;
  o.token = "tok";
  EXPECT_NO_THROW(Coordinator c(o));
  EXPECT_TRUE(auth::is_loopback("127.0.0.3"));
  EXPECT_TRUE(auth::is_loopback("::1"));
  EXPECT_FALSE(auth::is_loopback("10.0.0.1"));
  EXPECT_FALSE(auth::is_loopback("::"));
}

// Asynchronous DiLoCo's outer state is the coordinator's (POST /v1/outer, signed both ways): a
// worker's first exchange starts it, a malformed one is refused; the coordinator saves it as it
// ends, and a resumed coordinator continues from it.
TEST(Coordinator, AnAsynchronousRunsOuterStateIsServedSavedAndResumed) {
  testing_util::TempDir dir;
  auto config = run_config(2);
  config.sync.async = true;
  config.sync.inner_steps = 10;
  config.run.dir = dir.path().string();
  auto o = options_for(config);
  o.token = "tok";
  torch::Tensor theta;
  {
    Running running(o);
    CoordinatorClient client(running.address(), 5s, {"tok"});
    algorithms::AsyncPush hello{1, -1, 0, 0, torch::arange(10, torch::kFloat32)};
    auto [status, body] = client.request("POST", "/v1/outer", protocol::encode_outer_push(hello), 5s);
    ASSERT_EQ(status, 200) << body;
    auto reply = protocol::decode_outer_reply(body, 10);
    EXPECT_EQ(reply.steps_next, 10 / 5) << "a first cycle of H / 5 steps measures the worker's speed";
    EXPECT_TRUE(torch::equal(reply.theta, hello.values));
    algorithms::AsyncPush push{1, 0, 2, 1.0, torch::full({10}, 0.5f), 1};
    reply = protocol::decode_outer_reply(client.request("POST", "/v1/outer", protocol::encode_outer_push(push), 5s).second, 10);
    EXPECT_TRUE(reply.applied);
    EXPECT_EQ(reply.version, 1);
    theta = reply.theta;
    auto [bad, why] = client.request("POST", "/v1/outer", "{\"worker\": 0}\n123", 5s);
    EXPECT_EQ(bad, 400);
    EXPECT_NE(why.find("values"), std::string::npos) << why;
    algorithms::AsyncPush wrong{0, 0, 7, 1, torch::zeros({11})};
    EXPECT_EQ(client.request("POST", "/v1/outer", protocol::encode_outer_push(wrong), 5s).first, 400);
    CoordinatorClient stranger(running.address(), 5s, {"not the token"});
    EXPECT_THROW(stranger.request("POST", "/v1/outer", protocol::encode_outer_push(hello), 5s), std::exception);
  }
  ASSERT_TRUE(fs::exists(RunFolder(dir.path()).outer_state())) << "saved as the coordinator ended";
  const auto saved = read_file(RunFolder(dir.path()).outer_state(), "test");
  expect_error<ConfigError>([&] { Running again(o); }, "holds an asynchronous run's outer state; pass --resume");
  EXPECT_EQ(read_file(RunFolder(dir.path()).outer_state(), "test"), saved) << "not overwritten";
  o.resume = true;
  Running resumed(o);
  CoordinatorClient client(resumed.address(), 5s, {"tok"});
  algorithms::AsyncPush hello{0, -1, 0, 0, torch::zeros({10})};
  const auto reply = protocol::decode_outer_reply(client.request("POST", "/v1/outer", protocol::encode_outer_push(hello), 5s).second, 10);
  EXPECT_EQ(reply.version, 1);
  EXPECT_TRUE(torch::equal(reply.theta, theta)) << "the resumed run continues from the saved θ, not the worker's";
}

// A fixed asynchronous run whose worker died mid-cycle (started by hand: nobody sees its process
// exit): the outer state takes it as gone after sync.async_silence_s, its steps go to the other,
// and the run finishes without it rather than fail for its missing report.
TEST(Coordinator, AFixedAsynchronousRunFinishesWithoutAWorkerTakenAsGone) {
  testing_util::TempDir dir;
  auto config = run_config(2);
  config.sync.async = true;
  config.sync.inner_steps = 10;
  config.sync.async_silence_s = 1;
  config.train.steps = 2;  // 4 inner steps in all: a first cycle of 2 each
  config.run.dir = dir.path().string();
  auto o = options_for(config);
  o.token = "tok";
  Running running(o);
  CoordinatorClient client(running.address(), 5s, {"tok"});
  client.join(join_request(config, 0));
  client.join(join_request(config, 1));
  const auto outer = [&](algorithms::AsyncPush push) {
    auto [status, body] = client.request("POST", "/v1/outer", protocol::encode_outer_push(push), 5s);
    EXPECT_EQ(status, 200) << body;
    return protocol::decode_outer_reply(body, 10);
  };
  ASSERT_EQ(outer({0, -1, 0, 0, torch::zeros({10})}).steps_next, 2);
  ASSERT_EQ(outer({1, -1, 0, 0, torch::zeros({10})}).steps_next, 2);  // ... and worker 1 dies with them
  ASSERT_EQ(outer({0, 0, 2, 0.1, torch::full({10}, 0.1f), 1}).steps_next, 0) << "the rest is worker 1's";
  std::this_thread::sleep_for(1200ms);
  const auto taken = outer({0, 1, 0, 0, {}});
  ASSERT_EQ(taken.steps_next, 2) << "worker 1's cycle, after its silence";
  ASSERT_TRUE(outer({0, 1, 2, 0.1, torch::full({10}, 0.1f), 2}).finished);
  client.report_done({0, protocol::EndStatus::kFinished, "", nlohmann::json::object()});
  const auto result = running.coordinator.wait_for(5s);
  ASSERT_TRUE(result);
  EXPECT_EQ(result->outcome, RunOutcome::kFinished) << result->message;
}

// Asynchronous DiLoCo with elastic membership (async_elastic_run.h): slots that change hands. A
// worker whose process exited leaves its slot vacant; a new one takes it and continues from the
// current θ, its predecessor's exchanges refused; once the run's steps are done a late worker has
// nothing to train, and the run finishes as its members leave.
TEST(Coordinator, AnAsynchronousElasticRunsSlotsChangeHands) {
  testing_util::TempDir run;
  auto config = elastic_config(run, 2, "tok");
  config.sync.async = true;
  config.sync.inner_steps = 10;
  config.train.steps = 2;  // 4 inner steps in all
  Running running(options_for(config));
  CoordinatorClient client(running.address(), 5s, {"tok"});
  const auto outer = [&](algorithms::AsyncPush push) {
    auto [status, body] = client.request("POST", "/v1/outer", protocol::encode_outer_push(push), 5s);
    return std::pair{status, status == 200 ? protocol::decode_outer_reply(body, 10) : algorithms::AsyncReply{}};
  };
  const auto a = client.join(join_request(config, 0));
  const auto b = client.join(join_request(config, 1));
  EXPECT_FALSE(a.joiner || b.joiner);
  ASSERT_EQ(client.wait_for_start(b.rank, nullptr).phase, protocol::Phase::kRunning) << "every slot held";
  expect_error<ConfigError>([&] { client.join(join_request(config)); }, "all 2 slots are held by live members");
  ASSERT_EQ(outer({0, -1, 0, 0, torch::zeros({10}), 0, a.member}).first, 200);
  ASSERT_EQ(outer({1, -1, 0, 0, torch::zeros({10}), 0, b.member}).second.steps_next, 2);

  running.coordinator.process_exited("test", 1, 137);  // b is "test:1"
  const auto c = client.join(join_request(config, 1));
  EXPECT_EQ(c.rank, 1);
  EXPECT_TRUE(c.joiner);
  EXPECT_NE(c.member, b.member);
  EXPECT_EQ(outer({1, 0, 2, 1, torch::full({10}, 0.1f), 1, b.member}).first, 400) << "b's slot is c's";
  auto [status, joined] = outer({1, -1, 0, 0, torch::zeros({10}), 0, c.member});
  ASSERT_EQ(status, 200);
  EXPECT_EQ(joined.steps_next, 2) << "the steps b had under way went back to the pool";
  client.report_done({1, protocol::EndStatus::kFailed, "killed", nlohmann::json::object(), b.member});  // late, and harmless

  ASSERT_TRUE(outer({0, 0, 2, 1, torch::full({10}, 0.1f), 1, a.member}).second.applied);
  const auto last = outer({1, 1, 2, 1, torch::full({10}, 0.1f), 1, c.member}).second;
  EXPECT_TRUE(last.finished);
  expect_error<RunComplete>([&] { client.join(join_request(config)); }, "the run's steps are all done");
  client.report_done({0, protocol::EndStatus::kFinished, "", nlohmann::json::object(), a.member});
  client.report_done({1, protocol::EndStatus::kFinished, "", nlohmann::json::object(), c.member});
  const auto result = running.coordinator.wait_for(5s);
  ASSERT_TRUE(result);
  EXPECT_EQ(result->outcome, RunOutcome::kFinished) << result->message;
}

// An asynchronous elastic member whose heartbeats stop (a killed worker that nobody saw exit) loses
// its slot after cluster.dead_after_s, long before its cycle's silence (sync.async_silence_s):
// a replacement takes the slot, and the lost member's next heartbeat is told it is no member.
TEST(Coordinator, AnAsynchronousElasticMemberWhoseHeartbeatsStopLosesItsSlot) {
  testing_util::TempDir run;
  auto config = elastic_config(run, 2, "tok");
  config.sync.async = true;
  config.sync.inner_steps = 10;
  config.train.steps = 100;
  config.cluster.heartbeat_s = 0.1;
  config.cluster.dead_after_s = 1;
  config.sync.async_silence_s = 600;
  Running running(options_for(config));
  CoordinatorClient client(running.address(), 5s, {"tok"});
  const auto a = client.join(join_request(config, 0));
  const auto b = client.join(join_request(config, 1));
  ASSERT_EQ(client.wait_for_start(b.rank, nullptr).phase, protocol::Phase::kRunning);
  for (const auto& m : {a, b}) {
    auto [status, body] = client.request("POST", "/v1/outer", protocol::encode_outer_push({m.rank, -1, 0, 0, torch::zeros({10}), 0, m.member}), 5s);
    ASSERT_EQ(status, 200) << body;
  }
  EXPECT_TRUE(client.heartbeat({a.member, -1}).member);
  EXPECT_TRUE(client.heartbeat({b.member, -1}).member);
  expect_error<ConfigError>([&] { client.join(join_request(config)); }, "all 2 slots are held by live members");
  // a's heartbeats go on, b's stopped: its slot falls vacant after 1 s (more on a loaded machine,
  // where a late look of the coordinator's counts as its own stall), well before 600 s.
  std::optional<protocol::JoinReply> c;
  for (const auto until = std::chrono::steady_clock::now() + 20s; !c && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(client.heartbeat({a.member, -1}).member);
    try {
      c = client.join(join_request(config));
    } catch (const ConfigError& e) {
      ASSERT_NE(std::string(e.what()).find("all 2 slots are held by live members"), std::string::npos) << e.what();
    }
  }
  ASSERT_TRUE(c) << "b's slot never fell vacant";
  EXPECT_EQ(c->rank, 1) << "b's slot";
  EXPECT_TRUE(c->joiner);
  EXPECT_FALSE(client.heartbeat({b.member, -1}).member);
  EXPECT_TRUE(client.heartbeat({c->member, -1}).member);
  EXPECT_NE(read_file(RunFolder(run.path()).metrics(), "test").find("no heartbeat for"), std::string::npos);
}

// Without every slot held by cluster.join_timeout_s, an asynchronous elastic run starts with its
// quorum; a worker that comes later takes a vacant slot as a joiner. With none, it fails by name.
TEST(Coordinator, AnAsynchronousElasticRunStartsWithItsQuorumAndTakesLateWorkers) {
  const auto quorum_of_two = [](const testing_util::TempDir& dir) {  // 3 slots, 2 to start with, after 1 s
    auto c = elastic_config(dir, 3, "tok");
    c.sync.async = true;
    c.cluster.min_workers = 2;
    c.cluster.join_timeout_s = 1;
    return c;
  };
  testing_util::TempDir run;
  const auto config = quorum_of_two(run);
  Running running(options_for(config));
  std::jthread owner([&](std::stop_token stop) {  // the coordinator's clock, as `loco coordinator` runs it
    while (!stop.stop_requested()) running.coordinator.wait_for(100ms);
  });
  CoordinatorClient client(running.address(), 5s, {"tok"});
  const auto a = client.join(join_request(config, 2));
  const auto b = client.join(join_request(config));
  EXPECT_EQ(a.rank, 2);
  EXPECT_EQ(b.rank, 0) << "the first vacant slot";
  EXPECT_EQ(client.wait_for_start(a.rank, nullptr).phase, protocol::Phase::kRunning) << "the quorum, after the join timeout";
  const auto late = client.join(join_request(config));
  EXPECT_EQ(late.rank, 1);
  EXPECT_TRUE(late.joiner);
  EXPECT_FALSE(a.joiner || b.joiner);

  testing_util::TempDir alone_run;
  const auto alone = quorum_of_two(alone_run);
  Running lonely(options_for(alone));
  CoordinatorClient lone(lonely.address(), 5s, {"tok"});
  lone.join(join_request(alone));
  const auto result = lonely.coordinator.wait_for(10s);
  ASSERT_TRUE(result);
  EXPECT_EQ(result->outcome, RunOutcome::kFailed);
  EXPECT_NE(result->message.find("only 1 of the 2 workers needed (cluster.min_workers) joined"), std::string::npos) << result->message;
}

// A member that joined but never made an exchange (a worker started by hand that died while it
// loaded its model) is taken as gone cluster.join_timeout_s after the start: its slot goes to a
// new worker, while the member that exchanged keeps its own.
TEST(Coordinator, AnAsynchronousElasticMemberThatNeverExchangesLosesItsSlot) {
  testing_util::TempDir run;
  auto config = elastic_config(run, 2, "tok");
  config.sync.async = true;
  config.cluster.join_timeout_s = 1;
  Running running(options_for(config));
  std::jthread owner([&](std::stop_token stop) {  // the coordinator's clock, as `loco coordinator` runs it
    while (!stop.stop_requested()) running.coordinator.wait_for(100ms);
  });
  CoordinatorClient client(running.address(), 5s, {"tok"});
  const auto a = client.join(join_request(config, 0));
  const auto b = client.join(join_request(config, 1));
  ASSERT_EQ(client.wait_for_start(a.rank, nullptr).phase, protocol::Phase::kRunning);
  const algorithms::AsyncPush hello{0, -1, 0, 0, torch::zeros({10}), 0, a.member};
  ASSERT_EQ(client.request("POST", "/v1/outer", protocol::encode_outer_push(hello), 5s).first, 200);
  expect_error<ConfigError>([&] { client.join(join_request(config)); }, "all 2 slots are held by live members");
  std::this_thread::sleep_for(1500ms);
  const auto c = client.join(join_request(config));
  EXPECT_EQ(c.rank, 1) << "member " << b.member << " made no exchange: its slot is vacant";
  EXPECT_TRUE(c.joiner);
  expect_error<ConfigError>([&] { client.join(join_request(config)); }, "all 2 slots are held by live members");
}

// A worker waiting for a slot of a full run whose coordinator then goes (its run ended) is told so,
// not that the coordinator was never there.
TEST(Coordinator, AJoinerWaitingForASlotIsToldWhenTheCoordinatorGoes) {
  testing_util::TempDir run;
  auto config = elastic_config(run, 1, "tok");
  config.sync.async = true;
  auto running = std::make_unique<Running>(options_for(config));
  CoordinatorClient client(running->address(), 2s, {"tok"});
  client.join(join_request(config, 0));
  std::jthread ends([&] {
    std::this_thread::sleep_for(1s);
    running.reset();
  });
  std::string told;
  expect_error<PeerError>([&] { client.join(join_request(config), 60s, [&](const std::string& text) { told = text; }); },
                          "stopped answering while this worker waited for a slot");
  EXPECT_NE(told.find("waiting up to 60 s"), std::string::npos) << told;
}

// The status page (docs/status-page.md): a browser gets the page, scripts the plain text; the page's
// JSON and Prometheus' metrics reflect the workers' telemetry, which must be signed like any request.
TEST(Coordinator, ServesTheStatusPageFedByTelemetry) {
  testing_util::TempDir run;
  auto config = run_config(2);
  config.run.dir = run.path().string();
  auto o = options_for(config);
  o.token = "tok";
  Running running(o);
  httplib::Client raw("127.0.0.1", static_cast<int>(running.coordinator.port()));
  raw.set_read_timeout(5s);
  auto page = raw.Get("/", {{"Accept", "text/html,application/xhtml+xml"}});
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("<!doctype html>"), std::string::npos);
  EXPECT_NE(page->get_header_value("Content-Security-Policy").find("default-src 'self'"), std::string::npos);
  EXPECT_NE(page->body.find("assets/uPlot.min.js"), std::string::npos);
  auto rebound = raw.Get("/v1/status", {{"Host", "attacker.example:80"}});
  ASSERT_TRUE(rebound);
  EXPECT_EQ(rebound->status, 401) << "a page of another site whose name was rebound to 127.0.0.1 reads nothing";
  auto text = raw.Get("/");
  ASSERT_TRUE(text);
  EXPECT_EQ(text->body.rfind("loco coordinator", 0), 0u) << "curl gets plain text: " << text->body;
  auto library = raw.Get("/assets/uPlot.min.js");
  ASSERT_TRUE(library);
  EXPECT_EQ(library->status, 200);
  EXPECT_EQ(library->get_header_value("Content-Type").rfind("text/javascript", 0), 0u);
  EXPECT_GT(library->body.size(), 20000u) << "uPlot itself, compiled in";
  EXPECT_NE(library->body.find("uPlot"), std::string::npos);

  const nlohmann::json telemetry = {{"rank", 1}, {"name", "w:9"}, {"host", "w"}, {"pid", 9}, {"activity", "training"},
                                    {"step", 3}, {"dropped", 0},
                                    {"events", {{{"event", "train"}, {"time", 1.0}, {"step", 3}, {"loss", 6.5}, {"tokens", 96}}}}};
  auto unsigned_post = raw.Post("/v1/telemetry", telemetry.dump(), "application/json");
  ASSERT_TRUE(unsigned_post);
  EXPECT_EQ(unsigned_post->status, 401) << "telemetry changes what the page shows: it is signed";
  CoordinatorClient worker(running.address(), 5s, {"tok"});
  EXPECT_EQ(worker.request("POST", "/v1/telemetry", telemetry.dump(), 5s).first, 200);
  auto bad = worker.request("POST", "/v1/telemetry", R"({"rank": 1})", 5s);
  EXPECT_EQ(bad.first, 400);
  EXPECT_NE(bad.second.find("field 'name' is missing"), std::string::npos) << bad.second;

  auto status = raw.Get("/v1/status");
  ASSERT_TRUE(status);
  ASSERT_EQ(status->status, 200);
  const auto s = nlohmann::json::parse(status->body);
  ASSERT_EQ(s["workers"].size(), 1u);
  EXPECT_EQ(s["workers"][0]["state"], "training");
  EXPECT_EQ(s["workers"][0]["loss"], 6.5);
  EXPECT_EQ(s["run"]["run_dir"], config.run.dir);
  EXPECT_EQ(s["run"]["algorithm"], "diloco");
  auto metrics = raw.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(metrics->body.find(R"(loco_worker_loss{worker="1",name="w:9",host="w"} 6.5)"), std::string::npos) << metrics->body;
  EXPECT_NE(running.coordinator.page_url().find(fmt::format("http://127.0.0.1:{}/", running.coordinator.port())), std::string::npos);
}

// Who may read the status without a signature, decided on the request alone (the test below checks
// it over a real non-loopback address where the machine has one).
TEST(Coordinator, StatusReadsOpenOnlyFromThisMachineOrWithTheViewKey) {
  const auto key = auth::view_key("tok");
  auto request = [](std::string method, std::string path, std::string from, std::string host) {
    HttpRequest r;
    r.method = std::move(method);
    r.path = r.target = std::move(path);
    r.remote_addr = std::move(from);
    if (!host.empty()) r.headers["Host"] = host;
    return r;
  };
  EXPECT_TRUE(status_read_open(request("GET", "/v1/status", "127.0.0.1", "127.0.0.1:8080"), key));
  EXPECT_TRUE(status_read_open(request("GET", "/metrics", "::1", "[::1]:8080"), key));
  EXPECT_TRUE(status_read_open(request("GET", "/", "127.0.0.1", "localhost:8080"), key));
  EXPECT_FALSE(status_read_open(request("GET", "/v1/status", "127.0.0.1", "attacker.example"), key)) << "DNS rebinding";
  EXPECT_FALSE(status_read_open(request("GET", "/v1/status", "127.0.0.1", ""), key)) << "no Host header";
  EXPECT_FALSE(status_read_open(request("GET", "/v1/status", "10.0.0.5", "10.0.0.1:8080"), key));
  EXPECT_TRUE(status_read_open(request("GET", "/assets/uPlot.min.js", "10.0.0.5", "10.0.0.1:8080"), key));
  auto with_key = request("GET", "/v1/status", "10.0.0.5", "10.0.0.1:8080");
  with_key.params.emplace("key", key);
  EXPECT_TRUE(status_read_open(with_key, key));
  EXPECT_FALSE(status_read_open(with_key, "")) << "a run without a token has no view key";
  auto bearer = request("GET", "/metrics", "10.0.0.5", "10.0.0.1:8080");
  bearer.headers["Authorization"] = "Bearer " + key;
  EXPECT_TRUE(status_read_open(bearer, key));
  bearer.headers["Authorization"] = "Bearer " + std::string(32, '0');
  EXPECT_FALSE(status_read_open(bearer, key));
  auto stop = request("POST", "/v1/stop", "127.0.0.1", "127.0.0.1:8080");
  stop.params.emplace("key", key);
  EXPECT_FALSE(status_read_open(stop, key)) << "only reads of the status";
  EXPECT_FALSE(status_read_open(request("GET", "/v1/kv/get", "127.0.0.1", "127.0.0.1:8080"), key));
}

// An IPv4 address of this machine other than loopback, or "".
std::string non_loopback_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (auto* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || (a->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    found = text;
  }
  ::freeifaddrs(list);
  return found;
}

// Beyond loopback, reading the status needs the view key (derived from the token, printed in the
// page's address); the key reads and signs nothing else.
TEST(Coordinator, StatusReadsFromElsewhereNeedTheViewKey) {
  const auto address = non_loopback_address();
  if (address.empty()) GTEST_SKIP() << "this machine has no IPv4 address but loopback to reach the coordinator from";
  auto o = options_for(run_config(1));
  o.token = "tok";
  o.bind = "0.0.0.0";
  o.port = 0;
  Coordinator coordinator(o);
  coordinator.start();
  const auto key = auth::view_key("tok");
  EXPECT_EQ(key.size(), 32u);
  EXPECT_NE(coordinator.page_url().find("/?key=" + key), std::string::npos) << coordinator.page_url();
  httplib::Client raw(address, static_cast<int>(coordinator.port()));
  raw.set_read_timeout(5s);
  auto status_of = [&](const std::string& target, const httplib::Headers& headers = {}) {
    auto r = raw.Get(target, headers);
    return r ? r->status : -1;
  };
  EXPECT_EQ(status_of("/v1/status"), 401);
  EXPECT_EQ(status_of("/metrics"), 401);
  EXPECT_EQ(status_of("/", {{"Accept", "text/html"}}), 401);
  EXPECT_EQ(status_of("/v1/status?key=" + key), 200);
  EXPECT_EQ(status_of("/?key=" + key, {{"Accept", "text/html"}}), 200);
  EXPECT_EQ(status_of("/metrics", {{"Authorization", "Bearer " + key}}), 200) << "as Prometheus sends it";
  EXPECT_EQ(status_of("/v1/status?key=" + std::string(32, '0')), 401);
  EXPECT_EQ(status_of("/v1/status?key=tok"), 401) << "the token itself is not the view key";
  EXPECT_EQ(status_of("/assets/uPlot.min.js"), 200) << "the page's static scripts hold nothing of the run";
  EXPECT_EQ(status_of("/v1/kv/get?key=x&wait_ms=0&key=" + key), 401) << "the store is not a status read";
  auto stop = raw.Post("/v1/stop?key=" + key, R"({"reason": "viewer"})", "application/json");
  ASSERT_TRUE(stop);
  EXPECT_EQ(stop->status, 401) << "the view key changes nothing";
  EXPECT_FALSE(coordinator.state()["stopping"].get<bool>());
  // The timeline, readable by any local user over loopback, names the page but not its key.
  auto status = raw.Get("/v1/status?key=" + key);
  ASSERT_TRUE(status);
  EXPECT_NE(status->body.find("status page: http://"), std::string::npos) << status->body.substr(0, 2000);
  EXPECT_EQ(status->body.find(key), std::string::npos) << "the view key is not in the timeline";
}

// A throwaway self-signed certificate for `host` (an IP address), made with the openssl tool.
std::pair<std::string, std::string> make_certificate(const testing_util::TempDir& dir, const std::string& name,
                                                     const std::string& host) {
  const auto cert = (dir.path() / (name + ".pem")).string(), key = (dir.path() / (name + ".key")).string();
  const auto command = fmt::format("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
                                   "-subj /CN={0} -addext subjectAltName=IP:{0} -keyout {1} -out {2} 2>/dev/null",
                                   host, key, cert);
  if (std::system(command.c_str()) != 0) throw std::runtime_error("openssl could not make a certificate (scripts/setup.sh installs it)");
  return {cert, key};
}

// With a certificate, the coordinator speaks HTTPS only; workers verify it against their CA.
TEST(Coordinator, ServesTlsThatWorkersVerify) {
  testing_util::TempDir dir;
  const auto [cert, key] = make_certificate(dir, "coordinator", "127.0.0.1");
  const auto [other_cert, other_key] = make_certificate(dir, "other", "127.0.0.1");
  const auto config = run_config(1);
  auto o = options_for(config);
  o.token = "tok";
  o.tls_cert = cert;
  o.tls_key = key;
  Running running(o);
  CoordinatorClient client(running.address(), 5s, {"tok", true, cert});
  EXPECT_EQ(client.join(join_request(config)).rank, 0);
  auto store = client.key_value_store();
  store->set("k", "over TLS");
  EXPECT_EQ(store->get("k", 1s), "over TLS");

  CoordinatorClient untrusting(running.address(), 5s, {"tok", true, other_cert});
  untrusting.set_patience(300ms);
  expect_error<CoordinatorUnreachable>([&] { untrusting.request("GET", "/v1/state", "", 2s); }, "certificate is not signed by");
  CoordinatorClient plain(running.address(), 5s, {"tok"});
  plain.set_patience(300ms);
  expect_error<CoordinatorUnreachable>([&] { plain.request("GET", "/v1/state", "", 2s); }, "did not answer");

  o.tls_key = other_key;  // not the certificate's key
  expect_error<ConfigError>([&] { Coordinator c(o); }, "cannot load the TLS certificate");
}

// A coordinator killed and started again on the same run folder takes the membership back from
// RUN/coordinator.json: the same members, epoch and run id, and the round under way, which the
// workers then complete with it.
// Two members a and b of an elastic run of two join, start, and arrive at round 1's end: it goes.
struct FirstRound {
  protocol::JoinReply a, b;
  protocol::RoundReply go;
};
void convene_the_first_round(CoordinatorClient& client, protocol::JoinRequest request, FirstRound& out) {
  out.a = client.join(request);
  request.name = "b";
  out.b = client.join(request);
  ASSERT_EQ(client.wait_for_start(out.a.rank, nullptr).phase, protocol::Phase::kRunning);
  EXPECT_EQ(client.round({out.a.member, 1, -1, 5, {0, 7}}).action, protocol::RoundAction::kWait);
  out.go = client.round({out.b.member, 1, -1, 5, {0, 8}});
  ASSERT_EQ(out.go.action, protocol::RoundAction::kGo);
}

TEST(Coordinator, ARestartedCoordinatorContinuesTheRunFromItsStateFile) {
  testing_util::TempDir run;
  const auto config = elastic_config(run, 2, "tok");
  FirstRound first_round;
  std::string run_id;
  {
    Running first(options_for(config));
    CoordinatorClient client(first.address(), 5s, {"tok"});
    ASSERT_NO_FATAL_FAILURE(convene_the_first_round(client, join_request(config), first_round));
    run_id = first.coordinator.state()["run_id"];
  }  // the coordinator is gone; the round is under way on the workers
  const auto& [a, b, go] = first_round;

  Running second(options_for(config));
  const auto state = second.coordinator.state();
  EXPECT_EQ(state["run_id"], run_id);
  EXPECT_EQ(state["phase"], "running");
  EXPECT_EQ(state["elastic"]["epoch"], go.epoch);
  EXPECT_EQ(state["elastic"]["convened"]["round"], 1);
  CoordinatorClient client(second.address(), 5s, {"tok"});
  EXPECT_TRUE(client.heartbeat({a.member, 5}).member) << "its members are still members";
  // A worker that asks again gets the same answer; the round completes with the new coordinator.
  const auto again = client.round({a.member, 1, -1, 5, {0, 7}});
  EXPECT_EQ(again.action, protocol::RoundAction::kGo);
  EXPECT_EQ(again.epoch, go.epoch);
  EXPECT_EQ(again.rank, 0);
  client.round_done({a.member, 1, go.epoch, 5, 0x1234});
  client.round_done({b.member, 1, go.epoch, 5, 0x1234});
  EXPECT_EQ(second.coordinator.state()["elastic"]["rounds_completed"], 1);
  EXPECT_EQ(second.coordinator.state()["elastic"]["slots"][1]["cursor"], 8);
}

// A coordinator killed after it wrote a round's completion to metrics.jsonl and before it saved the
// table: its successor finds the round still under way, the workers report it done again, and it
// completes once more in the table, but metrics.jsonl records it once (the chaos soak saw "round
// 60 recorded 2 times", seed 1318186611).
TEST(Coordinator, ARoundCompletedAgainAfterARestartIsRecordedOnce) {
  testing_util::TempDir run;
  const auto config = elastic_config(run, 2, "tok");
  FirstRound first_round;
  const auto& [a, b, go] = first_round;
  std::string before_the_end;
  {
    Running first(options_for(config));
    CoordinatorClient client(first.address(), 5s, {"tok"});
    ASSERT_NO_FATAL_FAILURE(convene_the_first_round(client, join_request(config), first_round));
    before_the_end = read_file(run.path() / "coordinator.json", "test");
    client.round_done({a.member, 1, go.epoch, 5, 0x1234});
    client.round_done({b.member, 1, go.epoch, 5, 0x1234});
    ASSERT_EQ(first.coordinator.state()["elastic"]["rounds_completed"], 1);
  }
  // As if it had died between the event and the table's save.
  write_file_atomic(run.path() / "coordinator.json", before_the_end, "test", Readers::kOwner);
  auto completions = [&] {
    int n = 0;
    std::ifstream in(run.path() / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto e = nlohmann::json::parse(line);
      n += e.value("event", "") == "round_complete" && e.value("round", 0) == 1 ? 1 : 0;
    }
    return n;
  };
  ASSERT_EQ(completions(), 1);
  Running second(options_for(config));
  EXPECT_EQ(second.coordinator.state()["elastic"]["rounds_completed"], 0);
  CoordinatorClient client(second.address(), 5s, {"tok"});
  client.round_done({a.member, 1, go.epoch, 5, 0x1234});
  client.round_done({b.member, 1, go.epoch, 5, 0x1234});
  EXPECT_EQ(second.coordinator.state()["elastic"]["rounds_completed"], 1);
  EXPECT_EQ(completions(), 1) << read_file(run.path() / "metrics.jsonl", "test");
}

// What a command run again takes for a finished elastic run (issue #68): RUN/coordinator.json in
// phase "finished", not stopped (a stopped run ends "finished" once its members left), and, with
// real compute, the global checkpoint of the last step; nothing for a file it cannot read.
TEST(Coordinator, OnlyACompletedElasticRunIsTakenAsFinished) {
  testing_util::TempDir run;
  auto config = elastic_config(run, 2, "tok");
  const auto state = run.path() / "coordinator.json";
  write_file_atomic(state, R"({"phase": "finished", "stopping": true, "table": {}})", "test");
  EXPECT_FALSE(finished_run(config)) << "a stopped run";
  write_file_atomic(state, R"({"phase": "finished", "stopping": false, "table": {}})", "test");
  EXPECT_FALSE(finished_run(config)) << "no checkpoint of its last step";
  config.train.emulated_step_s = 0.01;  // an emulated run saves none
  const auto finished = finished_run(config);
  ASSERT_TRUE(finished);
  EXPECT_NE(describe(*finished, config).find("finished already (" + state.string() + " records it finished)"), std::string::npos)
      << describe(*finished, config);
  write_file_atomic(state, R"({"phase": "running", "stopping": false, "table": {}})", "test");
  EXPECT_FALSE(finished_run(config));
  write_file_atomic(state, "[not json", "test");
  EXPECT_FALSE(finished_run(config));
}

// A worker that joins an elastic run whose every slot has a live member (a replacement started
// before its predecessor was declared failed) waits for the slot, and is told so once; without
// patience it is refused at once.
TEST(Coordinator, AJoinToAFullElasticRunWaitsForAVacantSlot) {
  testing_util::TempDir run;
  auto config = elastic_config(run, 2, "tok");
  config.cluster.heartbeat_s = 0.2;
  config.cluster.dead_after_s = 1;
  Running running(options_for(config));
  CoordinatorClient client(running.address(), 5s, {"tok"});
  auto request = join_request(config);
  const auto silent = client.join(request);
  request.name = "alive";
  const auto alive = client.join(request);
  ASSERT_EQ(client.wait_for_start(alive.rank, nullptr).phase, protocol::Phase::kRunning);
  request.name = "replacement";
  expect_error<ConfigError>([&] { client.join(request); }, "replacement cannot join yet: the run already has its 2 workers");

  // One member keeps sending heartbeats, the other falls silent; the owner's loop (as `loco
  // coordinator` runs it) keeps the coordinator's clock going.
  std::jthread owner([&](std::stop_token stop) {
    CoordinatorClient beats(running.address(), 5s, {"tok"});
    while (!stop.stop_requested()) {
      running.coordinator.wait_for(100ms);
      beats.heartbeat({alive.member, 0});
    }
  });
  std::vector<std::string> told;
  const auto replacement = client.join(request, 30s, [&](const std::string& message) { told.push_back(message); });
  EXPECT_EQ(replacement.rank, silent.rank) << "it takes the silent member's slot once that one is declared failed";
  EXPECT_TRUE(replacement.joiner);
  ASSERT_EQ(told.size(), 1u);
  EXPECT_NE(told[0].find("waiting up to 30 s for a member to fail or leave"), std::string::npos) << told[0];
  EXPECT_FALSE(client.heartbeat({silent.member, 0}).member) << "the silent member is gone";
  EXPECT_TRUE(client.heartbeat({alive.member, 0}).member);
}

// The last member dies while a replacement waits for its slot: the run does not fail for lack of
// workers; the replacement takes the slot and continues it.
TEST(Coordinator, AWaitingWorkerContinuesARunWhoseLastMemberDied) {
  testing_util::TempDir run;
  auto config = elastic_config(run, 1, "tok");
  config.cluster.heartbeat_s = 0.2;
  config.cluster.dead_after_s = 1;
  Running running(options_for(config));
  CoordinatorClient client(running.address(), 5s, {"tok"});
  auto request = join_request(config);
  const auto first = client.join(request);
  ASSERT_EQ(client.wait_for_start(first.rank, nullptr).phase, protocol::Phase::kRunning);
  std::jthread owner([&](std::stop_token stop) {
    while (!stop.stop_requested()) running.coordinator.wait_for(100ms);
  });
  request.name = "replacement";
  const auto replacement = client.join(request, 30s);
  EXPECT_EQ(replacement.rank, 0);
  EXPECT_NE(replacement.member, first.member);
  std::this_thread::sleep_for(300ms);  // a few turns of the owner's loop
  const auto state = running.coordinator.state();
  EXPECT_EQ(state["phase"], "running") << state.dump();
  EXPECT_FALSE(client.heartbeat({first.member, 0}).member);
  EXPECT_TRUE(client.heartbeat({replacement.member, 0}).member);
}

// A member that ends "stopped" after the last round was done (a replacement that joined in the run's
// last round, with nothing left to train) does not make a completed run a stopped one: the chaos
// soak saw `loco coordinator` exit 130 on a run it had completed. A worker asking to join then is
// told the training is complete.
TEST(Coordinator, ACompletedRunIsFinishedThoughALateMemberStopped) {
  testing_util::TempDir run;
  auto config = elastic_config(run, 2, "tok");
  config.train.steps = 5;
  Running running(options_for(config));
  CoordinatorClient client(running.address(), 5s, {"tok"});
  auto request = join_request(config);
  const auto a = client.join(request);
  request.name = "b";
  const auto b = client.join(request);
  ASSERT_EQ(client.wait_for_start(a.rank, nullptr).phase, protocol::Phase::kRunning);
  // The one round, at step 5 of 5: both arrive, it goes, both report it done.
  EXPECT_EQ(client.round({a.member, 1, -1, 5, {0, 7}}).action, protocol::RoundAction::kWait);
  const auto go = client.round({b.member, 1, -1, 5, {0, 8}});
  ASSERT_EQ(go.action, protocol::RoundAction::kGo);
  client.round_done({a.member, 1, go.epoch, 5, 0x1234});
  client.round_done({b.member, 1, go.epoch, 5, 0x1234});
  // A worker started now (a replacement too late) is told the training is complete, and not
  // refused as an error: it ends finished (the soak saw one exit 1).
  request.name = "late";
  expect_error<RunComplete>([&] { client.join(request); }, "cannot join: training is complete");
  client.report_done({a.rank, protocol::EndStatus::kFinished, "", {{"steps", 5}}, a.member});
  client.report_done({b.rank, protocol::EndStatus::kStopped, "", {{"steps", 5}}, b.member});
  auto result = running.coordinator.wait_for(5s);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->outcome, RunOutcome::kFinished);
  // One that comes back once the run is finished (its link cut through the last round) is told so
  // too, not refused (the soak saw one exit 1 with "the run is finished").
  request.name = "back";
  expect_error<RunComplete>([&] { client.join(request); }, "the run is finished");
}

// A state file that is not one is named, and nothing is overwritten.
TEST(Coordinator, AMalformedStateFileIsNamed) {
  testing_util::TempDir run;
  const auto config = elastic_config(run, 2, "tok");
  write_file_atomic(run.path() / "coordinator.json", "{\"phase\": \"running\", \"table\": 12}", "test");
  auto options = options_for(config);
  options.port = 0;
  expect_error<DataError>([&] { Coordinator coordinator(options); }, "coordinator.json: malformed");
  EXPECT_EQ(read_file(run.path() / "coordinator.json", "test"), "{\"phase\": \"running\", \"table\": 12}");
}

// Random bytes, truncated and mutated messages, huge numbers and lengths at the elastic endpoints:
// each gets a 4xx answer, nothing changes, and a good worker is still served.
TEST(Coordinator, ElasticEndpointsSurviveFuzzing) {
  testing_util::TempDir run;
  const auto config = elastic_config(run, 2, "tok");
  Running running(options_for(config));
  httplib::Client raw("127.0.0.1", static_cast<int>(running.coordinator.port()));
  raw.set_read_timeout(5s);
  const auto instance = instance_of(raw, "tok");
  auto refused = config;  // its join is refused (the model differs), so that the run stays empty
  refused.model.layers += 1;
  const std::vector<std::string> paths = {"/v1/join", "/v1/heartbeat", "/v1/round", "/v1/round_done", "/v1/done"};
  const std::vector<std::string> seeds = {
      protocol::RoundRequest{3, 1, -1, 5, {0, 9}}.to_json().dump(),
      protocol::RoundRequest{3, 1, -1, 5, {0, 9}, {{1, {0, 4}}}}.to_json().dump(),
      protocol::RoundDone{3, 1, 1, 5, 0xabc}.to_json().dump(),
      protocol::HeartbeatRequest{3}.to_json().dump(),
      join_request(refused).to_json().dump(),
      R"({"member": 99999999999999999999, "round": -5, "step": 1e300})",
      R"({"member": 0, "round": 1, "failed_epoch": -1, "step": 0, "position": {"epoch": -1, "cursor": "x"}})",
  };
  std::mt19937 random(20261122);
  int answered = 0;
  for (int i = 0; i < 300; ++i) {
    std::string body = seeds[random() % seeds.size()];
    switch (random() % 4) {
      case 0: body = body.substr(0, random() % (body.size() + 1)); break;  // truncated
      case 1:
        for (int k = 0; k < 4; ++k) body[random() % body.size()] = static_cast<char>(random() % 256);  // mutated
        break;
      case 2: {  // garbage
        body.assign(random() % 64, '\0');
        for (auto& c : body) c = static_cast<char>(random() % 256);
        break;
      }
      default: break;  // as is (a member that does not exist)
    }
    const auto& path = paths[random() % paths.size()];
    auto result = raw.Post(path, signed_headers("tok", instance, "POST", path, body), body, "application/json");
    ASSERT_TRUE(result) << "the coordinator stopped answering after " << i << " requests";
    EXPECT_TRUE(result->status == 400 || result->status == 409 || result->status == 200) << result->status << " " << body;
    if (result->status == 200) {
      // Only the well-formed requests of a member that does not exist may succeed, and they change nothing.
      auto json = nlohmann::json::parse(result->body);
      if (json.contains("action")) EXPECT_EQ(json["action"], "rejoin");
      if (json.contains("member") && json["member"].is_boolean()) EXPECT_FALSE(json["member"].get<bool>());
    }
    ++answered;
  }
  EXPECT_EQ(answered, 300);
  // Claims to read other slots' shards that no parser may take: a slot twice, a list that is no
  // list, more slots than any run has.
  const std::string position = R"("position": {"epoch": 0, "cursor": 0})";
  const std::string twice = fmt::format(R"({{"slot": 1, {0}}}, {{"slot": 1, {0}}})", position);
  std::string many;
  for (int i = 0; i <= 65536; ++i) many += fmt::format(R"({}{{"slot": {}, {}}})", i ? ", " : "", i, position);
  for (const auto& adopted : {fmt::format("[{}]", twice), std::string("7"), fmt::format("[{}]", many)}) {
    const auto body = fmt::format(R"({{"member": 0, "round": 1, "failed_epoch": -1, "step": 0, {}, "adopted": {}}})", position,
                                  adopted);
    auto result = raw.Post("/v1/round", signed_headers("tok", instance, "POST", "/v1/round", body), body, "application/json");
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, 400) << adopted.substr(0, 80) << ": " << result->body;
    EXPECT_NE(result->body.find("'adopted'"), std::string::npos) << result->body;
  }
  const std::string braces(5 << 20, '{');
  auto huge = raw.Post("/v1/round", signed_headers("tok", instance, "POST", "/v1/round", braces), braces, "application/json");
  ASSERT_TRUE(huge);
  EXPECT_EQ(huge->status, 413);
  EXPECT_EQ(running.coordinator.state()["elastic"]["members"].size(), 0u) << "nothing joined";
  CoordinatorClient client(running.address(), 5s, {"tok"});
  EXPECT_GE(client.join(join_request(config)).member, 0) << "a good worker is still served";
}

TEST(CoordinatorClient, BadAddressesAndUnreachableCoordinators) {
  expect_error<ConfigError>([] { CoordinatorClient("no-port", 1s); }, "'no-port' is not HOST:PORT");
  expect_error<ConfigError>([] { CoordinatorClient("host:99999", 1s); }, "the port must be a number in 1..65535");
  Coordinator taken([] {
    CoordinatorOptions o = options_for(run_config(1));
    o.bind = "127.0.0.1";
    o.port = 0;
    return o;
  }());
  const int port = static_cast<int>(taken.port());
  // A second coordinator on the same port is an error (cpp-httplib's SO_REUSEPORT is off).
  expect_error<ConfigError>([&] {
    CoordinatorOptions o = options_for(run_config(1));
    o.bind = "127.0.0.1";
    o.port = port;
    Coordinator second(o);
  }, fmt::format("cannot listen on 127.0.0.1:{}", port));
}

}  // namespace
}  // namespace loco::runtime
