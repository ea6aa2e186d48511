#include "loco/core/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "loco/core/error.h"

namespace loco {

std::string hmac_sha256(std::string_view key, std::string_view message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
           message.size(), out, &size) == nullptr) {
    throw InternalError("crypto", "HMAC-SHA256 failed in OpenSSL");
  }
  return std::string(reinterpret_cast<const char*>(out), size);
}

std::string random_bytes(size_t size) {
  std::string raw(size, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(size)) != 1) {
    throw Error("crypto", "OpenSSL's random generator failed (RAND_bytes)");
  }
  return raw;
}

bool same_secret(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace loco
