// Authentication of the control plane (docs/security.md). Every request a worker sends to the
// coordinator carries an HMAC-SHA256 over its method, target (path and query), body, a timestamp,
// a nonce and the coordinator's instance, keyed by a key derived from the run's join token; the
// token itself never crosses the wire. The coordinator refuses a missing or wrong MAC, a timestamp
// outside the window, a nonce it has seen, and a request signed for another instance (another
// coordinator, or this one before a restart), so a captured request cannot be replayed. OpenSSL
// provides HMAC, SHA-256 and the random nonces.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>

namespace loco::runtime::auth {

// The request headers that carry a signature.
inline constexpr const char* kTimeHeader = "X-Loco-Time";    // Unix time in seconds, decimal
inline constexpr const char* kNonceHeader = "X-Loco-Nonce";  // 32 lowercase hex digits, fresh per request
inline constexpr const char* kMacHeader = "X-Loco-Mac";      // 64 lowercase hex digits
// A second MAC over the request's head alone (head_mac), which the coordinator can check before it
// reads a byte of the body: only a request whose head is authentic may send a body larger than the
// server's default bound (the model-sized outer gradients of an asynchronous run).
inline constexpr const char* kHeadMacHeader = "X-Loco-Head-Mac";  // 64 lowercase hex digits
// The coordinator instance a request is signed for: 32 lowercase hex digits, random at each start of
// a coordinator. A coordinator tells its instance in this header of every refusal at its gate, so a
// worker learns it from its first request (and anew after a restart) and signs again.
inline constexpr const char* kInstanceHeader = "X-Loco-Instance";
// The coordinator's answer to a signed request carries its own MAC (answer_mac), so that a worker
// believes only answers from a holder of the key, given to its own request.
inline constexpr const char* kAnswerMacHeader = "X-Loco-Answer-Mac";  // 64 lowercase hex digits
// The largest answer a worker reads; a longer one is cut off and refused.
inline constexpr size_t kMaxAnswerBytes = 16 << 20;

// How far a request's timestamp may be from the coordinator's clock (either way). Nonces are
// remembered this long, so a replay is refused inside the window and stale outside it.
inline constexpr std::chrono::seconds kWindow{120};

// The MAC key: HMAC-SHA256(token, "loco control plane v1"), so that the token is never used
// directly and a MAC does not reveal it.
class Key {
 public:
  explicit Key(std::string_view token);
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// The data plane's secret (comm::GroupOptions::secret): HMAC-SHA256(key, "loco data plane v1"), so
// that the data plane's keys are not the control plane's.
std::string data_plane_secret(const Key& key);

struct Signature {
  int64_t time = 0;    // Unix seconds
  std::string nonce;   // 32 hex digits
  std::string mac;     // 64 hex digits
  std::string head_mac;  // 64 hex digits
};

// The signature headers of a request as the coordinator read them; null when absent.
struct SignatureHeaders {
  const std::string* time = nullptr;
  const std::string* nonce = nullptr;
  const std::string* mac = nullptr;
  const std::string* instance = nullptr;
  const std::string* head_mac = nullptr;
};

// The MAC of one request: HMAC-SHA256(key, "loco-v2\n" method "\n" target "\n" time "\n" nonce
// "\n" instance "\n" body), in lowercase hex.
std::string mac(const Key& key, std::string_view method, std::string_view target, int64_t time, std::string_view nonce,
                std::string_view instance, std::string_view body);

// The MAC of a request's head: HMAC-SHA256(key, "loco-head-v1\n" method "\n" target "\n" time "\n"
// nonce "\n" instance "\n" body_bytes), in lowercase hex. It binds the body's length, not its bytes
// (the request's MAC does that once the body is in).
std::string head_mac(const Key& key, std::string_view method, std::string_view target, int64_t time, std::string_view nonce,
                     std::string_view instance, uint64_t body_bytes);

// The MAC of an answer: HMAC-SHA256(key, "loco-answer-v1\n" nonce "\n" status "\n" body), nonce
// being the request's, in lowercase hex. Bound to the request, an answer cannot be replayed for
// another one.
std::string answer_mac(const Key& key, std::string_view nonce, int status, std::string_view body);
// The worker's check of an answer to its request signed with `nonce`: why `mac` (the header's
// value, or null when absent) is not the answer's MAC, or nullopt when it is.
std::optional<std::string> check_answer(const Key& key, std::string_view nonce, int status, std::string_view body,
                                        const std::string* mac);

// Signs a request now, for the coordinator `instance` ("" when not known yet: the coordinator then
// refuses it and tells its instance), with a fresh random nonce.
Signature sign(const Key& key, std::string_view method, std::string_view target, std::string_view instance,
               std::string_view body);

// Whether `text` is well formed as an instance (32 lowercase hex digits).
bool is_instance(std::string_view text);

// Seconds since the Unix epoch, from the system clock.
int64_t unix_now();

// The coordinator's side: checks signatures and remembers the nonces of accepted requests for the
// window. Thread-safe. Holds at most `max_nonces` (requests accepted within one window); beyond
// that a valid request is refused until old nonces expire, which only members (who hold the key)
// can cause. Each Verifier is an instance of its own (a random one), so the nonces it forgets when
// its process ends cannot be replayed at its successor, nor at another coordinator with the token.
class Verifier {
 public:
  explicit Verifier(std::string_view token, size_t max_nonces = 1'000'000);
  const Key& key() const { return key_; }
  const std::string& instance() const { return instance_; }

  // Cheap checks before the body is read: the headers are present, well formed, signed for this
  // instance, and the time is within the window. Returns why not, or nullopt.
  std::optional<std::string> precheck(const SignatureHeaders& headers, int64_t now) const;
  // The full check once the body is in: precheck, the MAC, and that the nonce is new (then it is
  // remembered). Returns why the request is refused, or nullopt when it is authentic.
  std::optional<std::string> verify(std::string_view method, std::string_view target, std::string_view body,
                                    const SignatureHeaders& headers, int64_t now);
  // Before the body is read, for a request that would send a large one: precheck, the head's MAC
  // over `body_bytes` (its Content-Length), and that its nonce was not accepted already (nothing is
  // remembered: verify does that with the body). Returns why not, or nullopt.
  std::optional<std::string> verify_head(std::string_view method, std::string_view target, uint64_t body_bytes,
                                         const SignatureHeaders& headers, int64_t now);

 private:
  Key key_;
  std::string instance_;
  size_t max_nonces_;
  std::mutex mutex_;
  std::unordered_set<std::string> seen_;
  std::deque<std::pair<int64_t, std::string>> order_;  // (time accepted, nonce), oldest first
};

// The join token in effect for a process of the run in `run_dir`: cluster.join_token, else
// $LOCO_JOIN_TOKEN (the `configured` one), else the run's generated token in RUN_DIR/join_token,
// else "". Throws ConfigError when the file exists but cannot be read or is malformed, or is not a
// private regular file of this user's (a symbolic link, another user's, or open to other users).
std::string resolve_token(const std::string& configured, const std::filesystem::path& run_dir);

// The run's generated token: RUN_DIR/join_token if it exists, else a new random one written there
// (mode 0600, created exclusively so that two coordinators starting at once agree). Throws
// ConfigError when the file cannot be written.
std::string generated_token(const std::filesystem::path& run_dir);

// At most how many bits of entropy a token chosen by the user has: its length (or, for a token
// that repeats a shorter piece at least twice, as `abcdefgh` four times does, that piece's length) times log2 of
// the alphabet its characters come from (16 when they are all hex digits; else 10 for digits, 26
// for lowercase, 26 for uppercase, 33 for anything else, for each kind present); 0 for a token of
// fewer than kMinTokenDistinct different characters. An upper bound: a made-up phrase scores far
// more than it is worth, so generate tokens (`openssl rand -hex 32`: 256 bits).
double token_bits(std::string_view token);
inline constexpr double kMinTokenBits = 128;
inline constexpr size_t kMinTokenDistinct = 8;
// Throws ConfigError, naming the bound and how to make a token, when token_bits(token) is under
// kMinTokenBits.
void check_token_strength(std::string_view token);

// The token a coordinator listening on `bind` serves with: `configured` (the user's) if set, which
// must pass check_token_strength unless `insecure`; else, on a loopback address and unless
// `insecure`, the run's generated token (generated_token); else "" (no authentication, which the
// coordinator refuses on other addresses unless `insecure`).
std::string coordinator_token(const std::string& configured, const std::filesystem::path& run_dir, std::string_view bind,
                              bool insecure);

// The status page's read-only key (docs/security.md): HMAC-SHA256(token, "loco status page v1"),
// 32 lowercase hex digits. It lets a browser or Prometheus read a run's status without holding the
// token: it signs nothing, and the token cannot be recovered from it.
std::string view_key(std::string_view token);
// Whether `offered` is `key`, compared in constant time.
bool same_key(std::string_view offered, std::string_view key);

// Whether `address` (an IPv4 or IPv6 literal, or "localhost") is a loopback address.
bool is_loopback(std::string_view address);

}  // namespace loco::runtime::auth
