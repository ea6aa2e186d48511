// The few cryptographic primitives loco's control plane (runtime/net/auth.h) and data plane
// (comm/sealed_group.cpp) share, from OpenSSL: HMAC-SHA256, random bytes, a constant-time compare.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace loco {

// HMAC-SHA256(key, message): 32 raw bytes.
std::string hmac_sha256(std::string_view key, std::string_view message);
// `size` bytes from OpenSSL's random generator (Error when it fails).
std::string random_bytes(size_t size);
// Whether two secrets are equal, in time that depends only on their length.
bool same_secret(std::string_view a, std::string_view b);

}  // namespace loco
