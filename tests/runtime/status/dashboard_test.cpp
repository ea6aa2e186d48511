// The status page's model of a run (dashboard.h): worker states from reports and process ends,
// curves and their bound, malformed reports, and the Prometheus exposition checked by parsing it
// back with the Prometheus project's own Python parser.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "loco/runtime/status/dashboard.h"
#include "loco/runtime/coordinator/protocol.h"
#include "process_util.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

using testing_util::expect_error;

nlohmann::json report(int64_t rank, int64_t pid, const std::string& activity, int64_t step, nlohmann::json events = nlohmann::json::array()) {
  return {{"rank", rank}, {"name", "h:" + std::to_string(pid)}, {"host", "h"}, {"pid", pid}, {"activity", activity},
          {"step", step}, {"dropped", 0}, {"events", std::move(events)}};
}

nlohmann::json train_event(double time, int64_t step, double loss) {
  return {{"event", "train"}, {"time", time}, {"step", step}, {"loss", loss}, {"tokens", step * 100},
          {"tokens_per_s", 1000.0}, {"utilization", 0.9}};
}

std::string state_of(const nlohmann::json& status, int64_t pid) {
  for (const auto& w : status["workers"]) {
    if (w["pid"] == pid) return w["state"];
  }
  return "absent";
}

const nlohmann::json kFixedRun = {{"phase", "running"}, {"epoch", 0}, {"run_id", "r1"}, {"members", nlohmann::json::array()}};

TEST(Dashboard, AWorkersStateFollowsItsReportsAndItsProcess) {
  Dashboard board({.stalled_after_s = 10});
  board.process_started(0, "h", 100, 1000);
  board.process_started(1, "h", 101, 1000);
  EXPECT_EQ(state_of(board.status(kFixedRun, 1001), 100), "joining");
  board.report(report(0, 100, "training", 5, nlohmann::json::array({train_event(1001, 5, 7.5)})), 1001);
  board.report(report(1, 101, "syncing", 5), 1001);
  auto status = board.status(kFixedRun, 1002);
  EXPECT_EQ(state_of(status, 100), "training");
  EXPECT_EQ(state_of(status, 101), "syncing");
  EXPECT_EQ(status["workers"][0]["loss"], 7.5);
  EXPECT_EQ(status["workers"][0]["tokens"], 500);
  EXPECT_EQ(state_of(board.status(kFixedRun, 1011.5), 101), "stalled") << "no report for more than 10 s";

  board.process_exited("h", 101, 137, /*failed=*/true, 1012);
  EXPECT_EQ(state_of(board.status(kFixedRun, 1012), 101), "dead");
  board.process_started(1, "h", 102, 1013);
  status = board.status(kFixedRun, 1013);
  EXPECT_EQ(state_of(status, 101), "replaced") << "another process took its rank";
  EXPECT_EQ(state_of(status, 102), "joining");
  EXPECT_EQ(status["counts"]["replaced"], 1);

  board.report(report(0, 100, "finished", 40, {{{"event", "summary"}, {"time", 1020}, {"steps", 40}, {"interrupted", false}}}), 1020);
  board.process_exited("h", 100, 0, /*failed=*/false, 1021);
  EXPECT_EQ(state_of(board.status(kFixedRun, 1100), 100), "finished") << "not stalled: it ended";

  bool exit_on_timeline = false;
  status = board.status(kFixedRun, 1100);
  for (const auto& e : status["events"]) {
    if (e["text"] == "process 101 exited with status 137") exit_on_timeline = e["failure"].get<bool>();
  }
  EXPECT_TRUE(exit_on_timeline) << "a failed process is a failure on the timeline";
}

// Telemetry is sent again when its answer is lost: a batch is applied once. What the dashboard
// keeps is valid UTF-8 whatever it was given, so that its JSON always serializes. A process that
// ended on a requested stop without its summary is stopped, not finished.
TEST(Dashboard, AppliesABatchOnceKeepsValidTextAndTellsAStopFromAnEnd) {
  Dashboard board;
  auto body = report(0, 7, "training", 1, {{{"event", "sync"}, {"time", 1}, {"round", 1}, {"bytes_sent", 100}}});
  body["seq"] = 1;
  board.report(body, 1);
  board.report(body, 2);  // its answer was lost: sent again
  auto status = board.status(kFixedRun, 2);
  EXPECT_EQ(status["workers"][0]["bytes_sent"], 100) << "counted once";
  EXPECT_EQ(status["workers"][0]["last_report_s"], 0.0) << "but a sign of life";
  body["seq"] = 2;
  board.report(body, 3);
  EXPECT_EQ(board.status(kFixedRun, 3)["workers"][0]["bytes_sent"], 200);
  body["seq"] = 1;
  body["session"] = 99;  // a new sender in the same process (it restarted from its checkpoint)
  board.report(body, 3.5);
  EXPECT_EQ(board.status(kFixedRun, 3.5)["workers"][0]["bytes_sent"], 300) << "its numbers start again";

  board.note("refused GET /\xff\xfe from 10.0.0.9", 4);
  EXPECT_NO_THROW(board.status(kFixedRun, 4).dump()) << "a refused request's raw bytes on the timeline";

  board.process_started(1, "h", 8, 5);
  board.process_exited("h", 8, 130, /*failed=*/false, 6);
  EXPECT_EQ(state_of(board.status(kFixedRun, 6), 8), "stopped");
}

// A sync whose screening left a worker's outer gradient out: every worker reports it, the timeline
// and the count show it once (docs/failure-model.md, "A worker that sends harm").
TEST(Dashboard, AnOuterGradientLeftOutIsCountedOnceAndOnTheTimeline) {
  Dashboard board;
  const nlohmann::json sync = {{"event", "sync"}, {"time", 1}, {"round", 3}, {"bytes_sent", 10}, {"rejected", 1},
                               {"screening", "rank 2: norm 2000 is 98x the others' median 20.4"}};
  board.report(report(0, 7, "training", 1, nlohmann::json::array({sync})), 1);
  board.report(report(1, 8, "training", 1, nlohmann::json::array({sync})), 1);
  const auto status = board.status(kFixedRun, 2);
  EXPECT_EQ(status["rejected"], 1);
  int shown = 0;
  for (const auto& e : status["events"]) {
    if (e["text"] == "sync 3: 1 outer gradient(s) left out (rank 2: norm 2000 is 98x the others' median 20.4)") {
      ++shown;
      EXPECT_TRUE(e["failure"].get<bool>());
    }
  }
  EXPECT_EQ(shown, 1);
  EXPECT_NE(board.prometheus(kFixedRun, 2).find("loco_outer_gradients_rejected_total 1"), std::string::npos);
}

// DiPaCo: a module's step that left a path's outer gradient out counts it, on the timeline too.
TEST(Dashboard, APathsOuterGradientLeftOutOfAModuleStepIsCounted) {
  Dashboard board;
  const nlohmann::json step = {{"event", "step_task"}, {"time", 1}, {"module", "L1.M0"}, {"version", 4}, {"paths", 3},
                               {"rejected", 1}, {"screening", "path 2: not finite"}};
  board.report(report(0, 7, "training", 1, nlohmann::json::array({step})), 1);
  const auto status = board.status(kFixedRun, 2);
  EXPECT_EQ(status["rejected"], 1);
  bool shown = false;
  for (const auto& e : status["events"]) {
    shown = shown || e["text"] == "module L1.M0 v4: 1 path outer gradient(s) left out (path 2: not finite)";
  }
  EXPECT_TRUE(shown) << status["events"].dump();
  EXPECT_NE(board.prometheus(kFixedRun, 2).find("loco_outer_gradients_rejected_total 1"), std::string::npos);
}

TEST(Dashboard, ItsTableOfProcessesIsBounded) {
  Dashboard board({.max_workers = 3});
  for (int pid = 1; pid <= 3; ++pid) board.report(report(0, pid, "training", 1), 1);
  expect_error<protocol::ProtocolError>([&] { board.report(report(0, 4, "training", 1), 1); }, "more than 3 worker processes");
  board.process_exited("h", 1, 0, /*failed=*/false, 2);
  board.report(report(0, 4, "training", 1), 3);
  const auto status = board.status(kFixedRun, 3);
  ASSERT_EQ(status["workers"].size(), 3u);
  EXPECT_EQ(state_of(status, 1), "absent") << "the oldest that ended made room";
  EXPECT_EQ(state_of(status, 4), "training");
}

// The membership's word counts too: a member declared failed (its heartbeats stopped, on a machine
// with no launcher to see its process) is dead.
TEST(Dashboard, RefusedRequestsNeverPushTheRunsOwnEventsOffTheTimeline) {
  Dashboard board({.max_events = 50, .max_refusals = 5});
  board.note("member 0 (h:1) joined", 1);
  for (int i = 0; i < 1000; ++i) board.note_refusal(fmt::format("refused POST /v1/round from 10.0.0.9:{}: wrong MAC", i), 2 + i);
  board.note("epoch 1 for round 1: members 0", 2000);
  const auto events = board.status(kFixedRun, 2001)["events"];
  int refusals = 0;
  for (const auto& e : events) refusals += e.value("refusal", false) ? 1 : 0;
  EXPECT_EQ(refusals, 5) << "the newest refusals, no more";
  ASSERT_EQ(events.size(), 7u) << events.dump();
  EXPECT_EQ(events.front()["text"], "member 0 (h:1) joined") << "older than a thousand refusals, still there";
  EXPECT_EQ(events.back()["text"], "epoch 1 for round 1: members 0");
  EXPECT_NE(events[5]["text"].get<std::string>().find(":999:"), std::string::npos) << events.dump();
}

TEST(Dashboard, AMemberDeclaredFailedIsDead) {
  Dashboard board;
  auto body = report(2, 300, "training", 3);
  body["member"] = 7;
  board.report(body, 100);
  nlohmann::json run = {{"phase", "running"}, {"epoch", 1}, {"run_id", "r"}, {"members", nlohmann::json::array()},
                        {"elastic", {{"members", {{{"member", 7}, {"state", "active"}}}}}}};
  EXPECT_EQ(state_of(board.status(run, 101), 300), "training");
  run["elastic"]["members"][0]["state"] = "gone";
  EXPECT_EQ(state_of(board.status(run, 101), 300), "dead");
}

TEST(Dashboard, CurvesKeepTheirShapeWithinTheirBound) {
  Dashboard board({.max_points = 100});
  nlohmann::json events = nlohmann::json::array();
  for (int s = 1; s <= 1000; ++s) events.push_back(train_event(1000 + s, s, 10.0 - s / 200.0));
  for (int r = 1; r <= 300; ++r) {
    events.push_back({{"event", "sync"}, {"time", 1000 + r}, {"round", r}, {"bytes_sent", 1000}});
  }
  events.push_back({{"event", "eval"}, {"time", 2001}, {"step", 1000}, {"val_loss", 5.5}, {"tokens", 64}});
  board.report(report(0, 1, "training", 1000, events), 2001);
  const auto status = board.status(kFixedRun, 2001);
  const auto& points = status["loss"][0]["points"];
  EXPECT_LE(points.size(), 100u);
  EXPECT_GE(points.size(), 50u);
  EXPECT_EQ(points.front()[1], 1);
  EXPECT_EQ(points.back()[1], 1000) << "the latest point is kept";
  EXPECT_EQ(status["rounds"].size(), 100u) << "the latest rounds";
  EXPECT_EQ(status["rounds"].back()[0], 300);
  EXPECT_EQ(status["workers"][0]["bytes_sent"], 300000);
  ASSERT_EQ(status["val"].size(), 1u);
  EXPECT_EQ(status["val"][0][2], 100000) << "the evaluating worker's training tokens, not those scored";
  EXPECT_EQ(status["val"][0][4], 300000) << "bytes sent by all workers by then";
}

TEST(Dashboard, RefusesMalformedReportsWhole) {
  Dashboard board;
  auto missing = report(0, 1, "training", 1);
  missing.erase("pid");
  expect_error<protocol::ProtocolError>([&] { board.report(missing, 1); }, "field 'pid' is missing");
  expect_error<protocol::ProtocolError>([&] { board.report(report(0, 1, "dancing", 1), 1); }, "unknown activity 'dancing'");
  auto long_name = report(0, 1, "training", 1);
  long_name["name"] = std::string(300, 'x');
  expect_error<protocol::ProtocolError>([&] { board.report(long_name, 1); }, "longer than 256 bytes");
  expect_error<protocol::ProtocolError>([&] { board.report(report(0, 1, "training", 1, {{{"time", 1}}}), 1); },
                                        "every event must be an object with a string 'event'");
  expect_error<protocol::ProtocolError>([&] { board.report(nlohmann::json::array(), 1); }, "must be a JSON object");
  // Wrong types inside an event are ignored, not trusted.
  board.report(report(0, 1, "training", 1, {{{"event", "train"}, {"time", "soon"}, {"loss", "low"}, {"step", {1}}}}), 1);
  EXPECT_TRUE(board.status(kFixedRun, 1)["workers"][0]["loss"].is_null());
}

// The exposition format, parsed back by prometheus_client's parser (python3-prometheus-client,
// which scripts/setup.sh installs): every family, its type, and label values with the characters the
// format escapes.
TEST(Dashboard, PrometheusTextParsesBackWithThePrometheusParser) {
  Dashboard board;
  auto body = report(0, 42, "training", 5, {train_event(10, 5, 6.25), {{"event", "sync"}, {"time", 10}, {"round", 1}, {"bytes_sent", 2048}}});
  body["name"] = "odd \"name\"\\with\nline";
  board.report(body, 10);
  board.report(report(1, 43, "syncing", 5), 10);
  const auto text = board.prometheus(kFixedRun, 11);
  testing_util::TempDir dir;
  const auto metrics = dir.path() / "metrics.txt";
  std::ofstream(metrics) << text;
  const auto script = dir.path() / "parse.py";
  std::ofstream(script) << R"(import json, sys
from prometheus_client.parser import text_string_to_metric_families
families = {}
for f in text_string_to_metric_families(open(sys.argv[1]).read()):
    families[f.name] = {"type": f.type, "samples": [[s.name, s.labels, s.value if s.value == s.value else None]
                                                    for s in f.samples]}
print(json.dumps(families))
)";
  const auto parsed = testing_util::run_command({"/usr/bin/python3", script.string(), metrics.string()}, (dir.path() / "out").string());
  ASSERT_EQ(parsed.status, 0) << "prometheus_client could not parse the exposition:\n" << parsed.output << "\n" << text;
  const auto families = nlohmann::json::parse(parsed.output);
  // prometheus_client names a counter's family without "_total", and its samples with it.
  EXPECT_EQ(families["loco_worker_tokens"]["type"], "counter");
  EXPECT_EQ(families["loco_worker_sent_bytes"]["type"], "counter");
  EXPECT_EQ(families["loco_worker_step"]["type"], "gauge");
  EXPECT_EQ(families["loco_run_info"]["samples"][0][1]["run_id"], "r1");
  bool found = false;
  for (const auto& s : families["loco_worker_loss"]["samples"]) {
    if (s[1]["worker"] == "0") {
      EXPECT_EQ(s[1]["name"], "odd \"name\"\\with\nline") << "the label value round-trips";
      EXPECT_EQ(s[2], 6.25);
      found = true;
    }
  }
  EXPECT_TRUE(found) << text;
  for (const auto& s : families["loco_worker_sent_bytes"]["samples"]) {
    if (s[1]["worker"] == "0") EXPECT_EQ(s[2], 2048);
  }
  int64_t states = 0;
  for (const auto& s : families["loco_workers"]["samples"]) states += s[2].get<int64_t>();
  EXPECT_EQ(states, 2) << "every process counted once, by state";
}

}  // namespace
}  // namespace loco::runtime
