// The protocol's enums at the wire (names both ways, hostile names refused) and the run's phase
// transitions (RunStatus follows protocol::legal_transition).
#include <gtest/gtest.h>

#include "loco/core/error.h"
#include "loco/runtime/control/protocol.h"
#include "loco/runtime/control/run.h"
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
