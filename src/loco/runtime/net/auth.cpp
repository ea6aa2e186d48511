#include "loco/runtime/net/auth.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <vector>
#include <cstring>
#include <fstream>

#include "loco/core/crypto.h"
#include "loco/core/error.h"
#include "loco/core/run_folder.h"

namespace loco::runtime::auth {
namespace {

constexpr size_t kNonceHex = 32;
constexpr size_t kMacHex = 64;
constexpr size_t kMaxTokenBytes = 4096;

std::string hex(const unsigned char* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * size, '0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 15];
  }
  return out;
}

std::string random_hex(size_t bytes) {
  const auto raw = random_bytes(bytes);
  return hex(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
}

bool lower_hex(std::string_view text, size_t size) {
  if (text.size() != size) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::optional<int64_t> parse_time(const std::string& text) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

// A token file holds the token on its first line; surrounding whitespace is not part of it. It must
// be a regular file of this user's that no one else may read or write: in a shared run folder,
// another user could otherwise plant a token they know (or a link to one) for the coordinator to
// adopt.
std::string read_token_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    if (error == ELOOP) {
      throw ConfigError("auth", fmt::format("{} is a symbolic link: refused (the run's join token must be a file of its "
                                            "own); hint: remove it and start the coordinator again", path.string()));
    }
    throw ConfigError("auth", fmt::format("cannot read the run's join token {}: {}", path.string(), std::strerror(error)));
  }
  struct stat info {};
  const bool stated = ::fstat(fd, &info) == 0;
  std::string refused;
  if (!stated) {
    refused = fmt::format("cannot read it: {}", std::strerror(errno));
  } else if (!S_ISREG(info.st_mode)) {
    refused = "it is not a regular file";
  } else if (info.st_uid != ::geteuid()) {
    refused = fmt::format("it belongs to user {}, not to this process's user {}", info.st_uid, ::geteuid());
  } else if ((info.st_mode & 077) != 0) {
    refused = fmt::format("other users may read or write it (mode {:04o}); hint: chmod 600 {}", info.st_mode & 07777,
                          path.string());
  }
  std::string contents;
  if (refused.empty()) {
    char buffer[kMaxTokenBytes + 2];
    ssize_t got = 0;
    while (contents.size() <= kMaxTokenBytes && (got = ::read(fd, buffer, sizeof buffer)) > 0) contents.append(buffer, got);
    if (got < 0) refused = fmt::format("cannot read it: {}", std::strerror(errno));
  }
  ::close(fd);
  if (!refused.empty()) throw ConfigError("auth", fmt::format("the run's join token {}: refused, {}", path.string(), refused));
  std::string token = contents.substr(0, contents.find('\n'));
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty() || token.size() > kMaxTokenBytes) {
    throw ConfigError("auth", fmt::format("{} does not hold a join token (empty, or over {} bytes); hint: remove it and "
                                          "start the coordinator again to generate a new one", path.string(), kMaxTokenBytes));
  }
  return token;
}

}  // namespace

Key::Key(std::string_view token) : bytes_(hmac_sha256(token, "loco control plane v1")) {}

std::string data_plane_secret(const Key& key) { return hmac_sha256(key.bytes(), "loco data plane v1"); }

std::string mac(const Key& key, std::string_view method, std::string_view target, int64_t time, std::string_view nonce,
                std::string_view instance, std::string_view body) {
  std::string message = fmt::format("loco-v2\n{}\n{}\n{}\n{}\n{}\n", method, target, time, nonce, instance);
  message.append(body);
  const auto digest = hmac_sha256(key.bytes(), message);
  return hex(reinterpret_cast<const unsigned char*>(digest.data()), digest.size());
}

std::string head_mac(const Key& key, std::string_view method, std::string_view target, int64_t time, std::string_view nonce,
                     std::string_view instance, uint64_t body_bytes) {
  const auto message = fmt::format("loco-head-v1\n{}\n{}\n{}\n{}\n{}\n{}", method, target, time, nonce, instance, body_bytes);
  const auto digest = hmac_sha256(key.bytes(), message);
  return hex(reinterpret_cast<const unsigned char*>(digest.data()), digest.size());
}

std::string answer_mac(const Key& key, std::string_view nonce, int status, std::string_view body) {
  std::string message = fmt::format("loco-answer-v1\n{}\n{}\n", nonce, status);
  message.append(body);
  const auto digest = hmac_sha256(key.bytes(), message);
  return hex(reinterpret_cast<const unsigned char*>(digest.data()), digest.size());
}

std::optional<std::string> check_answer(const Key& key, std::string_view nonce, int status, std::string_view body,
                                        const std::string* mac) {
  if (mac == nullptr) return "the answer is not signed";
  if (!lower_hex(*mac, kMacHex)) return "the answer's signature is malformed";
  const auto expected = answer_mac(key, nonce, status, body);
  if (!same_secret(expected, *mac)) return "the answer's signature is wrong";
  return std::nullopt;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Signature sign(const Key& key, std::string_view method, std::string_view target, std::string_view instance,
               std::string_view body) {
  Signature s;
  s.time = unix_now();
  s.nonce = random_hex(kNonceHex / 2);
  s.mac = mac(key, method, target, s.time, s.nonce, instance, body);
  s.head_mac = head_mac(key, method, target, s.time, s.nonce, instance, body.size());
  return s;
}

bool is_instance(std::string_view text) { return lower_hex(text, kNonceHex); }

Verifier::Verifier(std::string_view token, size_t max_nonces)
    : key_(token), instance_(random_hex(kNonceHex / 2)), max_nonces_(max_nonces) {}

std::optional<std::string> Verifier::precheck(const SignatureHeaders& headers, int64_t now) const {
  if (headers.time == nullptr || headers.nonce == nullptr || headers.mac == nullptr) {
    return "the request is not signed (the run has a join token: set LOCO_JOIN_TOKEN or cluster.join_token to it)";
  }
  const auto t = parse_time(*headers.time);
  if (!t || !lower_hex(*headers.nonce, kNonceHex) || !lower_hex(*headers.mac, kMacHex)) {
    return "the request's signature headers are malformed";
  }
  if (headers.instance == nullptr) return "the request is signed for no coordinator instance (a client's first request)";
  if (*headers.instance != instance_) {
    return "the request is signed for another coordinator instance (one before a restart, or another run's)";
  }
  const int64_t skew = *t - now;
  if (skew > kWindow.count() || skew < -kWindow.count()) {
    return fmt::format("the request's timestamp is {} s {} the coordinator's clock (at most {} s either way: a stale or "
                       "replayed request, or clocks out of sync; hint: run NTP on both hosts)",
                       skew < 0 ? -skew : skew, skew < 0 ? "behind" : "ahead of", kWindow.count());
  }
  return std::nullopt;
}

std::optional<std::string> Verifier::verify(std::string_view method, std::string_view target, std::string_view body,
                                            const SignatureHeaders& headers, int64_t now) {
  if (auto why = precheck(headers, now)) return why;
  const std::string& nonce = *headers.nonce;
  const auto expected = mac(key_, method, target, *parse_time(*headers.time), nonce, instance_, body);
  if (!same_secret(expected, *headers.mac)) {
    return "wrong MAC (a different join token, or the request was altered)";
  }
  std::lock_guard lock(mutex_);
  while (!order_.empty() && order_.front().first < now - 2 * kWindow.count()) {
    seen_.erase(order_.front().second);
    order_.pop_front();
  }
  if (seen_.count(nonce) != 0) return "a replayed request (its nonce was seen already)";
  if (seen_.size() >= max_nonces_) return "too many requests within the window; ask again";
  seen_.insert(nonce);
  order_.emplace_back(now, nonce);
  return std::nullopt;
}

std::optional<std::string> Verifier::verify_head(std::string_view method, std::string_view target, uint64_t body_bytes,
                                                 const SignatureHeaders& headers, int64_t now) {
  if (auto why = precheck(headers, now)) return why;
  if (headers.head_mac == nullptr || !lower_hex(*headers.head_mac, kMacHex)) {
    return fmt::format("a body this large needs the request's head signed ({})", kHeadMacHeader);
  }
  const auto expected = head_mac(key_, method, target, *parse_time(*headers.time), *headers.nonce, instance_, body_bytes);
  if (!same_secret(expected, *headers.head_mac)) return "wrong head MAC (a different join token, or the request was altered)";
  std::lock_guard lock(mutex_);
  if (seen_.count(*headers.nonce) != 0) return "a replayed request (its nonce was seen already)";
  return std::nullopt;
}

std::string resolve_token(const std::string& configured, const std::filesystem::path& run_dir) {
  if (!configured.empty()) return configured;
  const auto path = RunFolder(run_dir).join_token();
  std::error_code error;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, error))) return "";
  return read_token_file(path);
}

std::string generated_token(const std::filesystem::path& run_dir) {
  const auto path = RunFolder(run_dir).join_token();
  std::error_code error;
  std::filesystem::create_directories(run_dir, error);
  if (error) throw ConfigError("auth", fmt::format("cannot create the run folder {}: {}", run_dir.string(), error.message()));
  if (std::filesystem::exists(std::filesystem::symlink_status(path, error))) return read_token_file(path);
  // Written whole to a private temporary file, then linked into place: a reader never sees a
  // partial token, and of two coordinators starting at once the second reads the first's.
  const std::string token = random_hex(32);
  // A name no one can have planted (random), created only if it does not exist, never through a
  // link: another user of a shared run folder cannot have the token written where they can read it.
  const auto temporary = run_dir / fmt::format(".join_token.{}.{}", ::getpid(), random_hex(8));
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  const std::string line = token + "\n";
  const bool written = fd >= 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
  const int saved = errno;
  if (fd >= 0) ::close(fd);
  const bool linked = written && ::link(temporary.c_str(), path.c_str()) == 0;
  const int link_error = errno;
  std::filesystem::remove(temporary, error);
  if (linked) return token;
  if (written && link_error == EEXIST) return read_token_file(path);
  throw ConfigError("auth", fmt::format("cannot write the run's join token {}: {}", path.string(),
                                        std::strerror(written ? link_error : saved)));
}

double token_bits(std::string_view token) {
  bool digit = false, lower = false, upper = false, other = false, hex_only = true;
  std::array<bool, 256> seen{};
  size_t distinct = 0;
  for (char ch : token) {
    const auto c = static_cast<unsigned char>(ch);
    digit = digit || std::isdigit(c);
    lower = lower || std::islower(c);
    upper = upper || std::isupper(c);
    other = other || !std::isalnum(c);
    hex_only = hex_only && std::isxdigit(c);
    if (!seen[c]) ++distinct;
    seen[c] = true;
  }
  if (distinct < kMinTokenDistinct) return 0;
  const double alphabet = hex_only ? 16 : (digit ? 10 : 0) + (lower ? 26 : 0) + (upper ? 26 : 0) + (other ? 33 : 0);
  // A token that repeats a shorter piece at least twice is worth that piece: its smallest period,
  // by the prefix function (the longest proper prefix that is also a suffix, for each prefix), when
  // that border is at least half the token. A shorter border is chance (a random token's first
  // character equals its last one time in 16 with hex), not a repetition.
  std::vector<size_t> border(token.size(), 0);
  for (size_t i = 1; i < token.size(); ++i) {
    size_t k = border[i - 1];
    while (k > 0 && token[i] != token[k]) k = border[k - 1];
    border[i] = token[i] == token[k] ? k + 1 : k;
  }
  const size_t repeated = token.empty() ? 0 : border.back();
  const size_t period = 2 * repeated >= token.size() ? token.size() - repeated : token.size();
  return static_cast<double>(period) * std::log2(alphabet);
}

void check_token_strength(std::string_view token) {
  const double bits = token_bits(token);
  if (bits >= kMinTokenBits) return;
  throw ConfigError("auth", fmt::format("the join token is too weak to guard a coordinator: at most {:.0f} bits of entropy "
                                        "by its length and alphabet, {} needed (whoever sees one signed request or the "
                                        "status page's key can test guesses offline); hint: export "
                                        "LOCO_JOIN_TOKEN=$(openssl rand -hex 32) on every host, or pass --insecure on a "
                                        "network you trust", bits, kMinTokenBits));
}

std::string coordinator_token(const std::string& configured, const std::filesystem::path& run_dir, std::string_view bind,
                              bool insecure) {
  if (!configured.empty()) {
    if (!insecure) check_token_strength(configured);
    return configured;
  }
  if (insecure || !is_loopback(bind)) return "";
  return generated_token(run_dir);
}

bool is_loopback(std::string_view address) {
  if (address == "localhost") return true;
  const std::string text(address);
  in_addr v4{};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

std::string view_key(std::string_view token) {
  const auto digest = hmac_sha256(token, "loco status page v1");
  return hex(reinterpret_cast<const unsigned char*>(digest.data()), 16);
}

bool same_key(std::string_view offered, std::string_view key) {
  return !key.empty() && same_secret(offered, key);
}

}  // namespace loco::runtime::auth
