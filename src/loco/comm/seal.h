// The data plane's seal (comm/sealed_group.cpp; docs/security.md, "The data plane"): AES-256-GCM
// over one message in place, with the IV of its place in the exchange, and the keys and proofs of a
// sealed group's membership handshake. No torch, so that the fuzzer takes it alone
// (fuzz/seal_fuzzer.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loco::comm::sealing {

inline constexpr int64_t kTagBytes = 16;   // GCM's tag, after each message's payload
inline constexpr size_t kNonceBytes = 32;  // each rank's nonce in the handshake
using Iv = std::array<unsigned char, 12>;

// The IV of the count-th message with `tag` from one rank to another: the tag's low 4 bytes, then
// the count's 8, little-endian. Unique per message under one key (a key is one direction's).
Iv iv_of(int64_t tag, uint64_t count);

// Seals the `size` bytes at `data` in place under a 32-byte key: writes GCM's tag at data + size
// (the buffer holds kTagBytes more), and encrypts the bytes when `encrypt` (else they are GCM's
// additional data, left as they are). InternalError when OpenSSL fails.
void seal(const std::string& key, const Iv& iv, bool encrypt, unsigned char* data, int64_t size);
// Checks the tag at data + size (and decrypts in place when `encrypt`): false unless these bytes
// are what was sealed under this key and IV. The bytes are not to be used when it is false.
bool open(const std::string& key, const Iv& iv, bool encrypt, unsigned char* data, int64_t size);

// The handshake (sealed_group.cpp). The group's key: HMAC(secret, "loco data plane v1\n" group).
std::string group_key(std::string_view secret, std::string_view group);
// What rank `from` sends rank `to` to prove it holds the group's key, bound to both ranks, the data
// plane and both nonces (a reflected or replayed proof does not pass).
std::string proof(const std::string& group_key, int64_t from, int64_t to, std::string_view plane,
                  std::string_view from_nonce, std::string_view to_nonce);
// The key of the messages from rank `from` to rank `to` in this group (32 bytes).
std::string direction_key(const std::string& group_key, int64_t from, int64_t to, std::string_view from_nonce,
                          std::string_view to_nonce);

}  // namespace loco::comm::sealing
