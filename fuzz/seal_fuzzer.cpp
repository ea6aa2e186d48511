// The data plane's seal (comm/seal.h) as a receiver opens what the wire brings. The first byte
// chooses authenticated or encrypted and the message's count; the rest is a message: its payload,
// then GCM's 16-byte tag. Without the key nothing may open. The same payload sealed here must
// open as it was, and must not open with one bit flipped, in another place of the exchange (another
// count or tag), or under the other direction's key; authenticated must leave the payload as it is.
#include <string>

#include "fuzz.h"
#include "loco/comm/seal.h"
#include "loco/core/hash.h"

namespace sealing = loco::comm::sealing;

namespace {

bool opens(const std::string& key, const sealing::Iv& iv, bool encrypt, std::string message, std::string* payload = nullptr) {
  const auto n = static_cast<int64_t>(message.size()) - sealing::kTagBytes;
  auto* bytes = reinterpret_cast<unsigned char*>(message.data());
  const bool ok = sealing::open(key, iv, encrypt, bytes, n);
  if (ok && payload != nullptr) *payload = message.substr(0, static_cast<size_t>(n));
  return ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool encrypt = (data[0] & 1) != 0;
  const uint64_t count = data[0] >> 1;
  const std::string wire(reinterpret_cast<const char*>(data + 1), size - 1);
  static const std::string group = sealing::group_key(std::string(32, 's'), "epoch/1");
  static const std::string mine = sealing::direction_key(group, 0, 1, std::string(32, 'a'), std::string(32, 'b'));
  static const std::string theirs = sealing::direction_key(group, 1, 0, std::string(32, 'b'), std::string(32, 'a'));
  const auto iv = sealing::iv_of(7, count);

  // What a stranger sends, without the key: it never opens.
  if (wire.size() >= static_cast<size_t>(sealing::kTagBytes) && opens(mine, iv, encrypt, wire)) {
    loco::fuzz::finding("a message sealed without the key opened");
  }

  // The input as a payload, sealed here.
  std::string sealed = wire + std::string(static_cast<size_t>(sealing::kTagBytes), '\0');
  sealing::seal(mine, iv, encrypt, reinterpret_cast<unsigned char*>(sealed.data()), static_cast<int64_t>(wire.size()));
  if (!encrypt && sealed.compare(0, wire.size(), wire) != 0) loco::fuzz::finding("authenticated changed the payload");
  std::string opened;
  if (!opens(mine, iv, encrypt, sealed, &opened) || opened != wire) loco::fuzz::finding("a sealed message did not open as it was");
  if (opens(mine, sealing::iv_of(7, count + 1), encrypt, sealed)) loco::fuzz::finding("a message opened as the next one");
  if (opens(mine, sealing::iv_of(8, count), encrypt, sealed)) loco::fuzz::finding("a message opened under another tag");
  if (opens(theirs, iv, encrypt, sealed)) loco::fuzz::finding("a message opened under the other direction's key");
  if (opens(mine, iv, !encrypt, sealed) && !wire.empty()) loco::fuzz::finding("a message opened under the other data plane");
  std::string flipped = sealed;
  const uint64_t bit = loco::hash64(wire) % (flipped.size() * 8);
  flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
  if (opens(mine, iv, encrypt, flipped)) loco::fuzz::finding("a message with one bit flipped opened");
  return 0;
}
