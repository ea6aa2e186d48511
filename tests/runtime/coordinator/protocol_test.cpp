// The protocol's enums at the wire (names both ways, hostile names refused) and the run's phase
// transitions (RunStatus follows protocol::legal_transition).
#include <gtest/gtest.h>

#include <limits>

#include "loco/core/error.h"
#include "loco/runtime/coordinator/protocol.h"
#include "loco/runtime/coordinator/run.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

using protocol::EndStatus;
using protocol::Phase;
using protocol::RoundAction;
using testing_util::expect_error;

TEST(ProtocolEnums, EveryValueRoundTripsThroughItsWireName) {
  const std::vector<Phase> phases = {Phase::kWaiting, Phase::kRunning, Phase::kStopping, Phase::kFinished, Phase::kFailed};
  ASSERT_EQ(phases.size(), 5u);
  for (auto p : phases) EXPECT_EQ(protocol::parse_phase(protocol::to_string(p)), p) << protocol::to_string(p);
  const std::vector<RoundAction> actions = {RoundAction::kWait, RoundAction::kGo, RoundAction::kRejoin,
                                            RoundAction::kStop, RoundAction::kFinished, RoundAction::kRestore};
  for (auto a : actions) EXPECT_EQ(protocol::parse_round_action(protocol::to_string(a)), a) << protocol::to_string(a);
  for (auto s : {EndStatus::kFinished, EndStatus::kStopped, EndStatus::kFailed}) {
    EXPECT_EQ(protocol::parse_end_status(protocol::to_string(s)), s) << protocol::to_string(s);
  }
  EXPECT_EQ(protocol::to_string(RoundAction::kGo), "go");
  EXPECT_EQ(protocol::to_string(Phase::kRunning), "running");
}

TEST(ProtocolEnums, UnknownNamesAreRefusedNamingTheFieldAndTheChoices) {
  expect_error<protocol::ProtocolError>([] { protocol::parse_round_action("launch"); },
                                        "field 'action' must be one of wait, go, rejoin, stop, finished, restore, got 'launch'");
  expect_error<protocol::ProtocolError>([] { protocol::parse_end_status(""); }, "field 'status' must be one of");
  expect_error<protocol::ProtocolError>([] { protocol::parse_phase(std::string(10000, 'x')); },
                                        "got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'");
  // Off the network: a reply with an unknown action is a protocol error, not a crash.
  nlohmann::json reply = protocol::RoundReply{}.to_json();
  EXPECT_EQ(reply["action"], "wait");
  reply["action"] = "explode";
  expect_error<protocol::ProtocolError>([&] { protocol::RoundReply::from_json(reply); }, "field 'action'");
}

// The float-to-integer cast that fuzz/coordinator_state_fuzzer and safetensors_fuzzer found is in
// every message too (nlohmann's get<int>() of 1e300 is undefined behaviour; the protocol
// harness reproduces it), and a negative number read as uint64_t wrapped around.
TEST(ProtocolMessages, IntegerFieldsTakeOnlyIntegersOfTheirRange) {
  auto join = protocol::JoinRequest{}.to_json();
  join["version"] = 1e300;
  expect_error<protocol::ProtocolError>([&] { protocol::JoinRequest::from_json(join); }, "field 'version' is not an integer");
  join["version"] = int64_t{1} << 40;
  expect_error<protocol::ProtocolError>([&] { protocol::JoinRequest::from_json(join); }, "field 'version' is out of range");
  auto identity = protocol::DatasetIdentity{}.to_json();
  identity["train_tokens"] = -1;
  expect_error<protocol::ProtocolError>([&] { protocol::DatasetIdentity::from_json(identity); }, "field 'train_tokens' is out of range");
  auto heartbeat = protocol::HeartbeatRequest{}.to_json();
  heartbeat["member"] = 1.5;
  expect_error<protocol::ProtocolError>([&] { protocol::HeartbeatRequest::from_json(heartbeat); }, "field 'member' is not an integer");
  auto start = protocol::StartReply{}.to_json();
  start["missing"] = {1, 2.5e300};
  expect_error<protocol::ProtocolError>([&] { protocol::StartReply::from_json(start); }, "field 'missing' is not an integer");
  start = protocol::StartReply{}.to_json();
  start["host_workers"] = -2;
  expect_error<protocol::ProtocolError>([&] { protocol::StartReply::from_json(start); }, "field 'host_workers'");
  auto position = protocol::RoundRequest{}.to_json();
  position["position"]["cursor"] = -3;
  expect_error<protocol::ProtocolError>([&] { protocol::RoundRequest::from_json(position); }, "field 'cursor' is out of range");
  // Whole numbers as integers still pass, unsigned ones included.
  identity["train_tokens"] = uint64_t{18446744073709551615u};
  EXPECT_EQ(protocol::DatasetIdentity::from_json(identity).train_tokens, 18446744073709551615u);
}

// Found in review for fuzz/protocol_fuzzer's round-trip check: a task's budget of 1e400 seconds
// parsed as infinity, which its own to_json() then wrote as null.
TEST(ProtocolMessages, ATaskBudgetMustBeFinite) {
  auto task = protocol::Task{}.to_json();
  task["seconds"] = std::numeric_limits<double>::infinity();
  expect_error<protocol::ProtocolError>([&] { protocol::Task::from_json(task); }, "field 'seconds' must be finite");
}

// Found in review, reproduced with fuzz/protocol_fuzzer (inputs past its -max_len): copying a
// nested field recurses once per level, so a body of a few hundred kilobytes of '[' overflowed
// the stack. Deep nesting is refused before any copy.
TEST(ProtocolMessages, DeeplyNestedFieldsAreRefusedWithoutRecursion) {
  const std::string deep = R"({"rank": 0, "status": "failed", "summary": {"x": )" + std::string(200000, '[') +
                           std::string(200000, ']') + "}}";
  const auto body = nlohmann::json::parse(deep);
  expect_error<protocol::ProtocolError>([&] { protocol::DoneRequest::from_json(body); },
                                        "field 'summary' nests deeper than 32 levels");
  EXPECT_TRUE(protocol::nested_deeper_than(body, 32));
  EXPECT_FALSE(protocol::nested_deeper_than(protocol::DoneRequest{}.to_json(), 2));
}

TEST(RunStatus, MovesOnlyAlongTheLegalTransitions) {
  EXPECT_TRUE(protocol::legal_transition(Phase::kWaiting, Phase::kRunning));
  EXPECT_TRUE(protocol::legal_transition(Phase::kRunning, Phase::kFinished));
  EXPECT_FALSE(protocol::legal_transition(Phase::kRunning, Phase::kWaiting));
  EXPECT_FALSE(protocol::legal_transition(Phase::kFinished, Phase::kFailed));
  EXPECT_FALSE(protocol::legal_transition(Phase::kWaiting, Phase::kStopping)) << "kStopping is never the coordinator's";

  RunStatus status;
  EXPECT_EQ(status.run_id().size(), 16u);
  status.enter(Phase::kRunning);
  expect_error<InternalError>([&] { status.enter(Phase::kWaiting); }, "cannot go from running to waiting");
  status.stop("worker 1 was interrupted");
  EXPECT_TRUE(status.fail("worker 2 failed"));
  EXPECT_FALSE(status.fail("a later failure")) << "a run that ended stays as it ended";
  EXPECT_EQ(status.reason(), "worker 2 failed");
  EXPECT_TRUE(status.ended());
  EXPECT_TRUE(status.stopping());
}

}  // namespace
}  // namespace loco::runtime
