#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <variant>

#include "loco/core/files.h"
#include "loco/metrics/metrics_log.h"
#include "loco/metrics/progress.h"
#include "test_util.h"

namespace loco::metrics {
namespace {

TEST(MetricsLog, OneObjectPerLineWithEventFirst) {
  testing_util::TempDir dir;
  const auto path = dir.path() / "metrics.jsonl";
  {
    MetricsLog log(path);
    TrainEvent train;
    train.step = 1;
    train.loss = 2.5;
    log.write(train);
    EvalEvent eval;
    eval.step = 1;
    eval.val_loss = 3.0;
    log.write(eval);
  }
  const std::string text = read_file(path, "test");
  ASSERT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  const auto first = text.substr(0, text.find('\n'));
  EXPECT_EQ(first.rfind("{\"event\":\"train\",\"time\":", 0), 0u) << first;
  auto j = nlohmann::json::parse(first);
  EXPECT_EQ(j["step"], 1);
  EXPECT_DOUBLE_EQ(j["loss"].get<double>(), 2.5);
  EXPECT_GT(j["time"].get<double>(), 1.7e9);
}

TEST(MetricsLog, DefaultConstructedDiscards) {
  MetricsLog log;
  EXPECT_NO_THROW(log.write(TrainEvent{}));
}

TEST(Progress, PlainLinesOnlyWhenAskedWithoutATerminal) {
  testing_util::TempDir dir;
  const auto path = dir.path() / "progress.txt";
  {
    std::FILE* out = std::fopen(path.c_str(), "w");
    Progress progress(0, 10, /*interactive=*/false, out);
    progress.update(1, 4.0, 100, false);
    progress.update(2, 3.5, 100, true);
    progress.message("hello");
    progress.finish();
    std::fclose(out);
  }
  const std::string text = read_file(path, "test");
  EXPECT_EQ(text.find("step 1/"), std::string::npos) << text;
  EXPECT_NE(text.find("step 2/10  loss 3.5000  100 tok/s"), std::string::npos) << text;
  EXPECT_NE(text.find("hello\n"), std::string::npos);
  EXPECT_EQ(text.find('\r'), std::string::npos) << "no terminal control codes in plain mode";
}

TEST(Progress, BarOnATerminal) {
  testing_util::TempDir dir;
  const auto path = dir.path() / "bar.txt";
  {
    std::FILE* out = std::fopen(path.c_str(), "w");
    Progress progress(0, 4, /*interactive=*/true, out);
    progress.update(2, 3.0, 50, false);
    progress.finish();
    std::fclose(out);
  }
  const std::string text = read_file(path, "test");
  EXPECT_NE(text.find("\r\033[K[############............]  50%  step 2/4"), std::string::npos) << text;
  EXPECT_NE(text.find("eta "), std::string::npos);
}

// One event of every kind, its fields set to values that are not their defaults.
std::vector<Event> one_of_each() {
  const WorkerId w{2, ""};
  const WorkerId named{-1, "host:42"};
  TrainSummary summary;
  summary.steps = 9;
  summary.val_loss = 3.5;
  summary.global_hash = 0xabcdef;
  return {StartEvent{w, true, 4, 10, 1000, "cpu", "diloco", 2},
          TrainEvent{w, 11, 4.5, 1e-3, 0.7, 640, 99.5, 123, 0.9, 12.5},
          SyncEvent{w, 3, 12, 4, 100, 200, 0.5, 0.25, "00ff", 1, "ring", 2, 0.5, 64, 0.1, 0, "", -1, 7},
          EvalEvent{w, 12, 4.25, 70.1, 512},
          SummaryEvent{w, 4, "diloco", summary},
          PathTaskEvent{named, 1, 2, 30, 4.1, 960, 3.5, 10, 20, {{"block.0", 10}}, {{"block.0", 20}}},
          StepTaskEvent{named, "block.1", 3, 2, 40, 50},
          RouteTaskEvent{named, 1, 77, "[3, 4]"},
          WorkerSummaryEvent{named, 2, 3, 1, 60, 1920, 70, 80, 9.5, 8.5, 1 << 20, true},
          JoinedEvent{w, 40},
          ShardsEvent{w, 41, {3, 5}},
          CheckpointEvent{w, 50, "/runs/a/checkpoints/step_50"},
          PeerFailureEvent{w, 51, "a peer closed the connection", true},
          MemberJoinEvent{{}, 7, "h:1", 2, true},
          SlotTakenEvent{{}, 7, "h:1", 2, 5},
          MemberFailureEvent{{}, 7, "h:1", 2, "silent for 12.0 s", 12.0, true, 3},
          MemberLeaveEvent{{}, 7, "h:1", 2, "finished"},
          RejoinEvent{{}, 7, "h:1", 2, 5, "its round completed without it", 4},
          CollectiveFailedEvent{{}, 6, "h:2", 3, 5, "a message failed its authenticated check"},
          LeftOutEvent{{}, 5, {7, 8}, 5.5},
          MembershipEvent{{}, 3, 5, {{0, 6, "h:2", 0, false}, {1, 7, "h:1", 2, true}}, 1, 1, {{1, 6}}},
          RoundRetriedEvent{{}, 5, 4, 3, 2},
          RoundCompleteEvent{{}, 5, 4, 60, 2, 2, 3, true, {1}, {{1, 6}}, "00ab", 7.5},
          RestoredFromCheckpointEvent{{}, 5, 60, {6, 7}, 2, 9},
          CoordinatorRestoredEvent{{}, 4, 5, 2},
          RunResumedEvent{{}, 60, 5, {2}},
          SlotsSummaryEvent{{}, 5, {0, 0, 2}}};
}

TEST(Events, EveryKindReadsBackAsItselfWithItsFields) {
  const auto events = one_of_each();
  EXPECT_EQ(events.size(), std::variant_size_v<Event> - 1) << "every kind but OtherEvent";
  std::set<std::string> kinds;
  for (const auto& event : events) {
    const auto json = to_json(event);
    ASSERT_EQ(json.at("event"), kind_of(event));
    EXPECT_TRUE(kinds.insert(kind_of(event)).second) << "two types named " << kind_of(event);
    const auto back = parse_event(json);
    ASSERT_TRUE(back.has_value()) << json;
    EXPECT_EQ(back->event.index(), event.index()) << json;
    EXPECT_EQ(to_json(back->event), json) << "one shape per kind";
  }
}

TEST(Events, EveryKindWrittenToAMetricsFileReadsBackWithItsFields) {
  testing_util::TempDir dir;
  const auto path = dir.path() / "metrics.jsonl";
  const auto events = one_of_each();
  {
    MetricsLog log(path);
    for (const auto& event : events) log.write(event);
  }
  const auto back = read_events(path);
  ASSERT_EQ(back.size(), events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_GT(back[i].time, 1.7e9);
    EXPECT_EQ(to_json(back[i].event), to_json(events[i]));
  }
}

TEST(Events, TheCoordinatorsOldJoinedReadsAsSlotTaken) {
  // Before slot_taken had its name, the coordinator wrote it as a second shape of "joined".
  const auto old = parse_event({{"event", "joined"}, {"time", 1.0}, {"member", 7}, {"name", "h:1"}, {"slot", 2}, {"round", 5}});
  ASSERT_TRUE(old.has_value());
  const auto* taken = std::get_if<SlotTakenEvent>(&old->event);
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(taken->slot, 2);
  EXPECT_EQ(taken->round, 5);
  const auto worker = parse_event({{"event", "joined"}, {"time", 1.0}, {"worker", 3}, {"step", 40}});
  ASSERT_TRUE(worker.has_value());
  ASSERT_NE(std::get_if<JoinedEvent>(&worker->event), nullptr);
  EXPECT_EQ(std::get<JoinedEvent>(worker->event).step, 40);
}

TEST(Events, AnUnknownKindIsKeptAsOtherAndMistypedFieldsReadAsDefaults) {
  const auto newer = parse_event({{"event", "from_the_future"}, {"worker", 1}, {"x", 2}});
  ASSERT_TRUE(newer.has_value());
  const auto* other = std::get_if<OtherEvent>(&newer->event);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->fields, nlohmann::json({{"x", 2}}));
  const auto hostile = parse_event({{"event", "membership"}, {"members", {1, "two", {{"member", "x"}}}}, {"epoch", "3"}});
  ASSERT_TRUE(hostile.has_value());
  const auto& m = std::get<MembershipEvent>(hostile->event);
  EXPECT_EQ(m.epoch, 0);
  ASSERT_EQ(m.members.size(), 1u) << "only objects are members";
  EXPECT_EQ(m.members[0].member, 0);
  EXPECT_FALSE(parse_event({{"no_event", 1}}).has_value());
}

TEST(ProgressLines, ReadBackAsWrittenAndOtherLinesAreNotProgress) {
  const ProgressLine line{ProgressReport{5, 10, 4.5, 300, 2, 4096}, std::nullopt};
  const auto back = parse_progress_line(progress_line_json(line));
  ASSERT_TRUE(back && back->progress);
  EXPECT_EQ(back->progress->step, 5);
  EXPECT_EQ(back->progress->steps, 10);
  EXPECT_DOUBLE_EQ(back->progress->loss, 4.5);
  EXPECT_EQ(back->progress->round, 2);
  EXPECT_EQ(back->progress->bytes_sent, 4096);
  const auto before_sync = parse_progress_line(progress_line_json({ProgressReport{1, 10, 5.0, 10, -1, 0}, std::nullopt}));
  ASSERT_TRUE(before_sync && before_sync->progress);
  EXPECT_EQ(before_sync->progress->round, -1);
  const auto message = parse_progress_line(progress_line_json({std::nullopt, "hello"}));
  ASSERT_TRUE(message && message->message);
  EXPECT_EQ(*message->message, "hello");
  EXPECT_FALSE(parse_progress_line("step 3/10 loss 4.0").has_value());
  EXPECT_FALSE(parse_progress_line("{not json").has_value());
  EXPECT_FALSE(parse_progress_line(R"({"other": 1})").has_value());
  const auto odd = parse_progress_line(R"({"progress": {"step": "five", "loss": null, "round": 2.5}})");
  ASSERT_TRUE(odd && odd->progress) << "a mistyped field reads as its default";
  EXPECT_EQ(odd->progress->step, 0);
  EXPECT_EQ(odd->progress->round, -1);
}

TEST(FormatDuration, HumanUnits) {
  EXPECT_EQ(format_duration(42), "42s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_duration(-1), "?");
}

}  // namespace
}  // namespace loco::metrics
