// The control protocol's messages (runtime/coordinator/protocol.h): the bytes are a request or reply
// body as the coordinator or a worker receives it. Every message's from_json() must accept it or
// throw ProtocolError; what it accepts must survive to_json() and from_json() again unchanged.
#include <nlohmann/json.hpp>

#include "fuzz.h"
#include "loco/runtime/coordinator/protocol.h"

namespace {

using namespace loco::runtime::protocol;
using loco::fuzz::expect_refusal;
using loco::fuzz::finding;

// A message the parser accepted, written back, must parse again to the same JSON.
template <class Message>
void check(const char* name, const nlohmann::json& body) {
  expect_refusal(name, [&] {
    const Message message = Message::from_json(body);
    const nlohmann::json written = message.to_json();
    nlohmann::json again;
    try {
      again = Message::from_json(written).to_json();
    } catch (const std::exception& e) {
      finding(std::string(name) + ": its own to_json() is refused: " + e.what() + "\n" + written.dump());
    }
    if (again != written) finding(std::string(name) + ": to_json/from_json is not a round trip: " + written.dump());
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A body that is not JSON never reaches from_json (the HTTP layer answers 400 itself).
  const auto body = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return 0;
  check<JoinRequest>("JoinRequest", body);
  check<JoinReply>("JoinReply", body);
  check<StartReply>("StartReply", body);
  check<DoneRequest>("DoneRequest", body);
  check<HeartbeatRequest>("HeartbeatRequest", body);
  check<HeartbeatReply>("HeartbeatReply", body);
  check<RoundRequest>("RoundRequest", body);
  check<RoundReply>("RoundReply", body);
  check<RoundDone>("RoundDone", body);
  check<Task>("Task", body);
  check<DatasetIdentity>("DatasetIdentity", body);
  return 0;
}
