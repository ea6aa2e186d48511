// The task table (leases, deadlines, reissue, reports, its saved form) and the tasks an elastic
// run's plan issues (what each covers: H steps, the next fragment's sync, or a time budget).
#include <gtest/gtest.h>

#include "loco/core/error.h"
#include "loco/runtime/coordinator/membership.h"
#include "loco/runtime/coordinator/tasks.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

using namespace std::chrono_literals;
using Clock = TaskTable::Clock;
using testing_util::expect_error;

protocol::Task task_of(int64_t shard, int64_t version, uint64_t cursor = 0) {
  protocol::Task t;
  t.shard = shard;
  t.version = version;
  t.from = {0, cursor};
  t.steps = 50;
  return t;
}

TEST(TaskTable, ALeaseLastsUntilItsDeadlineAndAnExpiredTaskIsIssuedAgain) {
  TaskTable table;
  const auto t0 = Clock::time_point() + 100s;
  const int64_t a = table.issue(task_of(0, 0, 7));
  const int64_t b = table.issue(task_of(1, 0));
  ASSERT_EQ(table.size(), 2u);
  EXPECT_NE(a, b);
  table.lease(a, /*member=*/10, t0 + 5s);
  table.lease(b, /*member=*/11, t0 + 5s);
  table.renew(10, t0 + 20s);  // member 10 is heard from; 11 is not
  EXPECT_TRUE(table.expire(t0 + 4s).empty());
  const auto expired = table.expire(t0 + 6s);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0], b);
  EXPECT_EQ(table.find(b)->state, TaskState::kOpen);
  EXPECT_EQ(table.find(a)->state, TaskState::kLeased);
  // Shard 1's work is issued again, from the same position, to someone else: the open task is
  // superseded and the new lease counts as a reissue.
  const int64_t again = table.issue(task_of(1, 0));
  EXPECT_EQ(table.find(b)->state, TaskState::kCancelled);
  table.lease(again, 10, std::nullopt);
  EXPECT_EQ(table.find(again)->issued, 2);
  EXPECT_EQ(table.totals().reissued, 1);
  EXPECT_EQ(table.leased_to(10, 0).size(), 2u);
  EXPECT_NE(table.held(10, 1, 0), nullptr);
  EXPECT_EQ(table.held(10, 1, 1), nullptr) << "another version";
}

TEST(TaskTable, OnlyTheHolderReportsATaskAndFinalStatesStayFinal) {
  TaskTable table;
  const int64_t id = table.issue(task_of(3, 2));
  expect_error<protocol::ProtocolError>([&] { table.complete(id, 5, {0, 1}); }, "not leased to it");
  table.lease(id, 5, std::nullopt);
  expect_error<protocol::ProtocolError>([&] { table.complete(id, 6, {0, 1}); }, "member 6 reports task");
  expect_error<protocol::ProtocolError>([&] { table.complete(999, 5, {0, 1}); }, "task 999");
  table.complete(id, 5, {1, 4});
  EXPECT_EQ(table.find(id)->state, TaskState::kDone);
  EXPECT_EQ(table.find(id)->end, (data::SamplerPosition{1, 4}));
  EXPECT_EQ(table.totals().done, 1);
  expect_error<InternalError>([&] { table.lease(id, 5, std::nullopt); }, "cannot go from done to leased");
  EXPECT_FALSE(legal_transition(TaskState::kCancelled, TaskState::kOpen));
  EXPECT_TRUE(legal_transition(TaskState::kLeased, TaskState::kOpen));
  // A holder that fails loses its leases; what is done or cancelled is pruned.
  const int64_t other = table.issue(task_of(4, 2));
  table.lease(other, 5, std::nullopt);
  EXPECT_EQ(table.release(5), std::vector<int64_t>{other});
  table.cancel_before(3);
  EXPECT_EQ(table.find(other)->state, TaskState::kCancelled);
  table.prune();
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.totals().issued, 2) << "totals outlive pruning";
}

TEST(TaskTable, SavedAndLoadedItKeepsItsLeasesAndRefusesMalformedState) {
  TaskTable table;
  const int64_t id = table.issue(task_of(2, 1, 9));
  table.lease(id, 3, Clock::time_point() + 1s);
  TaskTable loaded;
  loaded.load(table.save());
  ASSERT_NE(loaded.held(3, 2, 1), nullptr);
  EXPECT_EQ(loaded.held(3, 2, 1)->task.from.cursor, 9u);
  EXPECT_TRUE(loaded.expire(Clock::time_point() + 1000s).empty()) << "a loaded lease waits for its holder's next contact";
  EXPECT_GT(loaded.issue(task_of(0, 1)), id) << "ids keep counting";
  auto saved = table.save();
  saved["tasks"][0]["state"] = "lost";
  EXPECT_THROW(loaded.load(saved), std::invalid_argument);
  saved = table.save();
  saved["tasks"][0]["task"]["report"] = "everything";
  EXPECT_THROW(loaded.load(saved), std::invalid_argument);
}

TEST(TaskTable, ATaskCrossesTheWireAsItIs) {
  protocol::Task t = task_of(5, 3, 11);
  t.id = 42;
  t.scope = protocol::TaskScope::kFragment;
  t.seconds = 0.5;
  const auto back = protocol::Task::from_json(t.to_json());
  EXPECT_EQ(back.id, 42);
  EXPECT_EQ(back.scope, protocol::TaskScope::kFragment);
  EXPECT_EQ(back.shard, 5);
  EXPECT_EQ(back.version, 3);
  EXPECT_EQ(back.from.cursor, 11u);
  EXPECT_EQ(back.steps, 50);
  EXPECT_EQ(back.seconds, 0.5);
  EXPECT_EQ(back.report, protocol::TaskReport::kRound);
  auto hostile = t.to_json();
  hostile["shard"] = -3;
  EXPECT_THROW(protocol::Task::from_json(hostile), protocol::ProtocolError);
  hostile = t.to_json();
  hostile["seconds"] = -1;
  EXPECT_THROW(protocol::Task::from_json(hostile), protocol::ProtocolError);
}

// The first tasks of a run (at its start) cover the steps to the first synchronization.
std::vector<protocol::Task> first_tasks(MembershipOptions options) {
  MembershipTable table(options);
  const auto now = Clock::time_point() + 10s;
  std::string why;
  const auto joined = table.join("a", -1, now, why);
  table.start(now);
  std::vector<protocol::Task> out;
  for (const auto& [shard, record] : table.tasks().leased_to(joined->member, 0)) out.push_back(record->task);
  return out;
}

TEST(ElasticTasks, ATaskCoversTheStepsToTheNextSynchronization) {
  MembershipOptions diloco{1, 1, 10s, 100};
  diloco.inner_steps = 30;
  auto tasks = first_tasks(diloco);
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].steps, 30);
  EXPECT_EQ(tasks[0].scope, protocol::TaskScope::kModel);
  EXPECT_EQ(tasks[0].report, protocol::TaskReport::kRound);
  diloco.total_steps = 20;
  EXPECT_EQ(first_tasks(diloco)[0].steps, 20) << "the run's last step ends the last round";

  MembershipOptions streaming{1, 1, 10s, 100};
  streaming.inner_steps = 10;
  streaming.fragments = 2;  // fragment 0 syncs at steps 10, 20...; fragment 1 at 5, 15...
  tasks = first_tasks(streaming);
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].steps, 5);
  EXPECT_EQ(tasks[0].scope, protocol::TaskScope::kFragment);

  MembershipOptions timed{1, 1, 10s, 100};
  timed.round_seconds = 2.5;
  tasks = first_tasks(timed);
  EXPECT_EQ(tasks[0].steps, 0);
  EXPECT_EQ(tasks[0].seconds, 2.5);
}

}  // namespace
}  // namespace loco::runtime
