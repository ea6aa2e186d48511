#include "loco/comm/seal.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <algorithm>
#include <climits>

#include "loco/core/crypto.h"
#include "loco/core/error.h"

namespace loco::comm::sealing {
namespace {

// One EVP context, freed on every path.
class Gcm {
 public:
  Gcm() : ctx_(EVP_CIPHER_CTX_new()) {
    if (ctx_ == nullptr) throw InternalError("comm", "OpenSSL could not make a cipher context");
  }
  ~Gcm() { EVP_CIPHER_CTX_free(ctx_); }
  Gcm(const Gcm&) = delete;
  Gcm& operator=(const Gcm&) = delete;
  EVP_CIPHER_CTX* get() const { return ctx_; }

  static const unsigned char* key_bytes(const std::string& key) {
    LOCO_CHECK(key.size() == 32, "an AES-256 key of {} bytes", key.size());
    return reinterpret_cast<const unsigned char*>(key.data());
  }
  static void check(int ok, const char* what) {
    if (ok != 1) throw InternalError("comm", fmt::format("OpenSSL's AES-256-GCM failed ({})", what));
  }
  // In place, in slices that an int counts; as additional data (no output) unless `encrypt`.
  template <class Update>
  void update(unsigned char* data, int64_t size, bool encrypt, Update&& step) {
    for (int64_t done = 0; done < size;) {
      const int slice = static_cast<int>(std::min<int64_t>(size - done, INT_MAX / 2));
      int n = 0;
      check(step(ctx_, encrypt ? data + done : nullptr, &n, data + done, slice), "Update");
      done += slice;
    }
  }

 private:
  EVP_CIPHER_CTX* ctx_;
};

}  // namespace

Iv iv_of(int64_t tag, uint64_t count) {
  Iv iv{};
  for (size_t i = 0; i < 4; ++i) iv[i] = static_cast<unsigned char>(static_cast<uint64_t>(tag) >> (8 * i));
  for (size_t i = 0; i < 8; ++i) iv[4 + i] = static_cast<unsigned char>(count >> (8 * i));
  return iv;
}

void seal(const std::string& key, const Iv& iv, bool encrypt, unsigned char* data, int64_t size) {
  Gcm gcm;
  Gcm::check(EVP_EncryptInit_ex(gcm.get(), EVP_aes_256_gcm(), nullptr, Gcm::key_bytes(key), iv.data()), "EncryptInit");
  gcm.update(data, size, encrypt, EVP_EncryptUpdate);
  int n = 0;
  Gcm::check(EVP_EncryptFinal_ex(gcm.get(), data + size, &n), "EncryptFinal");
  Gcm::check(EVP_CIPHER_CTX_ctrl(gcm.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(kTagBytes), data + size), "GET_TAG");
}

bool open(const std::string& key, const Iv& iv, bool encrypt, unsigned char* data, int64_t size) {
  Gcm gcm;
  Gcm::check(EVP_DecryptInit_ex(gcm.get(), EVP_aes_256_gcm(), nullptr, Gcm::key_bytes(key), iv.data()), "DecryptInit");
  gcm.update(data, size, encrypt, EVP_DecryptUpdate);
  Gcm::check(EVP_CIPHER_CTX_ctrl(gcm.get(), EVP_CTRL_GCM_SET_TAG, static_cast<int>(kTagBytes), data + size), "SET_TAG");
  int n = 0;
  return EVP_DecryptFinal_ex(gcm.get(), data + size, &n) > 0;
}

std::string group_key(std::string_view secret, std::string_view group) {
  return hmac_sha256(secret, fmt::format("loco data plane v1\n{}", group));
}

std::string proof(const std::string& group_key, int64_t from, int64_t to, std::string_view plane,
                  std::string_view from_nonce, std::string_view to_nonce) {
  return hmac_sha256(group_key, fmt::format("proof\n{}\n{}\n{}\n{}{}", from, to, plane, from_nonce, to_nonce));
}

std::string direction_key(const std::string& group_key, int64_t from, int64_t to, std::string_view from_nonce,
                          std::string_view to_nonce) {
  return hmac_sha256(group_key, fmt::format("send\n{}\n{}\n{}{}", from, to, from_nonce, to_nonce));
}

}  // namespace loco::comm::sealing
