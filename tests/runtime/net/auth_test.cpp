// Request signatures and the run's join token (auth.h): what a MAC covers, the window, replays,
// and where a token comes from.
#include "loco/runtime/net/auth.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sys/stat.h>
#include <unistd.h>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "test_util.h"

namespace loco::runtime::auth {
namespace {

using testing_util::expect_error;

// A token as `openssl rand -hex 32` makes one.
constexpr const char* kStrong = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

TEST(Auth, TheMacCoversEveryPartOfTheRequest) {
  const Key key("token");
  const std::string nonce(32, 'a'), instance(32, 'c');
  const auto base = mac(key, "POST", "/v1/kv/set?key=a", 1000, nonce, instance, "body");
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(base, mac(Key("token"), "POST", "/v1/kv/set?key=a", 1000, nonce, instance, "body")) << "deterministic";
  EXPECT_NE(base, mac(Key("token2"), "POST", "/v1/kv/set?key=a", 1000, nonce, instance, "body"));
  EXPECT_NE(base, mac(key, "GET", "/v1/kv/set?key=a", 1000, nonce, instance, "body"));
  EXPECT_NE(base, mac(key, "POST", "/v1/kv/set?key=b", 1000, nonce, instance, "body"));
  EXPECT_NE(base, mac(key, "POST", "/v1/kv/set?key=a", 1001, nonce, instance, "body"));
  EXPECT_NE(base, mac(key, "POST", "/v1/kv/set?key=a", 1000, std::string(32, 'b'), instance, "body"));
  EXPECT_NE(base, mac(key, "POST", "/v1/kv/set?key=a", 1000, nonce, std::string(32, 'd'), "body")) << "another instance";
  EXPECT_NE(base, mac(key, "POST", "/v1/kv/set?key=a", 1000, nonce, instance, "bodY"));
  EXPECT_EQ(base.find("token"), std::string::npos);
  const std::string key_hex = Key("token").bytes();
  EXPECT_EQ(key_hex.size(), 32u) << "the key is HMAC-SHA256 of the token, not the token";
  EXPECT_NE(key_hex, "token");
}

// A request's signature headers, as a worker sends them.
struct Signed {
  std::string time, nonce, mac, instance;
  Signed(const Signature& s, std::string instance_)
      : time(std::to_string(s.time)), nonce(s.nonce), mac(s.mac), instance(std::move(instance_)) {}
  SignatureHeaders headers() const { return {&time, &nonce, &mac, &instance}; }
};

Signed sign_for(const Verifier& verifier, const std::string& token, const std::string& method, const std::string& target,
                const std::string& body) {
  return Signed(sign(Key(token), method, target, verifier.instance(), body), verifier.instance());
}

TEST(Auth, TheVerifierRefusesWrongStaleAndReplayedRequests) {
  Verifier verifier("token");
  const int64_t now = unix_now();
  const auto s = sign_for(verifier, "token", "POST", "/v1/stop", "{}");
  EXPECT_EQ(verifier.verify("POST", "/v1/stop", "{}", s.headers(), now), std::nullopt);
  auto replay = verifier.verify("POST", "/v1/stop", "{}", s.headers(), now + 5);
  ASSERT_TRUE(replay);
  EXPECT_NE(replay->find("replayed"), std::string::npos) << *replay;
  // Still refused just inside the window's far edge, and stale beyond it.
  const int64_t signed_at = std::stoll(s.time);
  EXPECT_TRUE(verifier.verify("POST", "/v1/stop", "{}", s.headers(), signed_at + kWindow.count()));
  auto stale = verifier.verify("POST", "/v1/stop", "{}", s.headers(), signed_at + kWindow.count() + 1);
  ASSERT_TRUE(stale);
  EXPECT_NE(stale->find("behind the coordinator's clock"), std::string::npos) << *stale;

  const auto other = sign_for(verifier, "other", "POST", "/v1/stop", "{}");
  auto wrong = verifier.verify("POST", "/v1/stop", "{}", other.headers(), now);
  ASSERT_TRUE(wrong);
  EXPECT_NE(wrong->find("wrong MAC"), std::string::npos) << *wrong;
  EXPECT_NE(verifier.precheck({nullptr, &s.nonce, &s.mac, &s.instance}, now)->find("not signed"), std::string::npos);
  const std::string bad_time = "12x", short_nonce = "abc";
  EXPECT_NE(verifier.precheck({&bad_time, &s.nonce, &s.mac, &s.instance}, now)->find("malformed"), std::string::npos);
  EXPECT_NE(verifier.precheck({&s.time, &short_nonce, &s.mac, &s.instance}, now)->find("malformed"), std::string::npos);

  Verifier small("token", 2);  // holds two nonces: a third valid request waits for the window to pass
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(small.verify("GET", "/v1/state", "", sign_for(small, "token", "GET", "/v1/state", "").headers(), now),
              std::nullopt);
  }
  EXPECT_TRUE(small.verify("GET", "/v1/state", "", sign_for(small, "token", "GET", "/v1/state", "").headers(), now));
}

// Each verifier is an instance of its own: a request signed for one (a coordinator before its
// restart, or another run's with the same token) is refused by another, on its headers alone.
// The head's MAC (checked before the body is read) binds the method, target, time, nonce,
// instance and the body's length; a nonce already accepted is refused there too.
TEST(Auth, TheHeadMacBindsTheRequestAndItsLength) {
  auth::Verifier verifier("tok");
  const auth::Key key("tok");
  const auto& instance = verifier.instance();
  const std::string body(5000, 'b');
  const auto s = auth::sign(key, "POST", "/v1/outer", instance, body);
  const std::string t = std::to_string(s.time);
  auth::SignatureHeaders headers{&t, &s.nonce, &s.mac, &instance, &s.head_mac};
  const auto now = auth::unix_now();
  EXPECT_FALSE(verifier.verify_head("POST", "/v1/outer", body.size(), headers, now));
  EXPECT_EQ(verifier.verify_head("POST", "/v1/outer", body.size() + 1, headers, now), "wrong head MAC (a different join token, or the request was altered)");
  EXPECT_TRUE(verifier.verify_head("POST", "/v1/heartbeat", body.size(), headers, now)) << "another route";
  EXPECT_TRUE(verifier.verify_head("GET", "/v1/outer", body.size(), headers, now)) << "another method";
  auth::SignatureHeaders unsigned_head = headers;
  unsigned_head.head_mac = nullptr;
  EXPECT_NE(verifier.verify_head("POST", "/v1/outer", body.size(), unsigned_head, now)->find("X-Loco-Head-Mac"), std::string::npos);
  auth::Verifier other("other");
  EXPECT_TRUE(other.verify_head("POST", "/v1/outer", body.size(), headers, now)) << "another run's coordinator";
  EXPECT_FALSE(verifier.verify("POST", "/v1/outer", body, headers, now)) << "the whole request, once";
  EXPECT_EQ(verifier.verify_head("POST", "/v1/outer", body.size(), headers, now), "a replayed request (its nonce was seen already)");
}

TEST(Auth, ARequestIsSignedForOneCoordinatorInstance) {
  Verifier before("token"), after("token");
  EXPECT_TRUE(is_instance(before.instance()));
  EXPECT_NE(before.instance(), after.instance());
  const int64_t now = unix_now();
  const auto s = sign_for(before, "token", "POST", "/v1/stop", "{}");
  auto elsewhere = after.precheck(s.headers(), now);
  ASSERT_TRUE(elsewhere);
  EXPECT_NE(elsewhere->find("another coordinator instance"), std::string::npos) << *elsewhere;
  EXPECT_TRUE(after.verify("POST", "/v1/stop", "{}", s.headers(), now));
  // Claiming the other instance in the header does not help: the MAC binds the one signed for.
  const Signed claimed(sign(Key("token"), "POST", "/v1/stop", before.instance(), "{}"), after.instance());
  auto wrong = after.verify("POST", "/v1/stop", "{}", claimed.headers(), now);
  ASSERT_TRUE(wrong);
  EXPECT_NE(wrong->find("wrong MAC"), std::string::npos) << *wrong;
  // A first request names no instance.
  auto first = after.precheck({&s.time, &s.nonce, &s.mac, nullptr}, now);
  ASSERT_TRUE(first);
  EXPECT_NE(first->find("no coordinator instance"), std::string::npos) << *first;
  EXPECT_EQ(before.verify("POST", "/v1/stop", "{}", s.headers(), now), std::nullopt) << "its own instance takes it";
}

TEST(Auth, TheRunsTokenIsGeneratedOnceAndPrivate) {
  testing_util::TempDir dir;
  const auto run = dir.path() / "run";
  EXPECT_EQ(resolve_token("", run), "") << "no token yet";
  EXPECT_EQ(coordinator_token("", run, "0.0.0.0", false), "") << "none is generated for a non-loopback address";
  const auto token = coordinator_token("", run, "127.0.0.1", false);
  EXPECT_EQ(token.size(), 64u);
  EXPECT_EQ(generated_token(run), token) << "a second coordinator on the run reads the first's";
  EXPECT_EQ(resolve_token("", run), token) << "a worker on this machine finds it";
  EXPECT_EQ(resolve_token("mine", run), "mine") << "the user's token comes first";
  EXPECT_EQ(coordinator_token(kStrong, run, "127.0.0.1", false), kStrong);
  EXPECT_EQ(coordinator_token("", run, "127.0.0.1", true), "") << "--insecure: none";
  struct stat info {};
  ASSERT_EQ(::stat((run / "join_token").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  for (const auto& entry : std::filesystem::directory_iterator(run)) {
    EXPECT_EQ(entry.path().filename().string().rfind(".join_token", 0), std::string::npos) << "a temporary file was left";
  }
  write_file_atomic(run / "join_token", "\n", "test");
  ASSERT_EQ(::chmod((run / "join_token").c_str(), 0600), 0);
  expect_error<ConfigError>([&] { resolve_token("", run); }, "does not hold a join token");
}

// In a shared run folder another user may plant the token file before the coordinator starts: a
// token they know, or a link to one. Neither is adopted, and nothing is written through the link.
TEST(Auth, APlantedOrLinkedTokenFileIsRefused) {
  testing_util::TempDir dir;
  const auto run = dir.path() / "run";
  std::filesystem::create_directories(run);
  const auto known = dir.path() / "attackers-token";
  write_file_atomic(known, std::string(kStrong) + "\n", "test");
  ASSERT_EQ(::chmod(known.c_str(), 0600), 0);
  std::filesystem::create_symlink(known, run / "join_token");
  expect_error<ConfigError>([&] { coordinator_token("", run, "127.0.0.1", false); }, "is a symbolic link");
  expect_error<ConfigError>([&] { resolve_token("", run); }, "is a symbolic link");
  std::filesystem::remove(run / "join_token");
  std::filesystem::create_symlink(dir.path() / "nothing-yet", run / "join_token");  // dangling: a write would create it
  expect_error<ConfigError>([&] { coordinator_token("", run, "127.0.0.1", false); }, "is a symbolic link");
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "nothing-yet")) << "the token was written through the link";
  std::filesystem::remove(run / "join_token");

  std::filesystem::copy_file(known, run / "join_token");
  ASSERT_EQ(::chmod((run / "join_token").c_str(), 0644), 0);
  expect_error<ConfigError>([&] { coordinator_token("", run, "127.0.0.1", false); }, "other users may read or write it (mode 0644)");
  ASSERT_EQ(::chmod((run / "join_token").c_str(), 0600), 0);
  EXPECT_EQ(resolve_token("", run), kStrong) << "the same file, private, is the run's token";
  if (::geteuid() != 0) {
    GTEST_SKIP() << "a file of another user's needs root to make (chown); CI runs as root";
  }
  ASSERT_EQ(::chown((run / "join_token").c_str(), 65534, 65534), 0);
  expect_error<ConfigError>([&] { resolve_token("", run); }, "belongs to user 65534");
}

TEST(Auth, AWeakTokenIsRefusedUnlessInsecure) {
  testing_util::TempDir dir;
  const auto run = dir.path() / "run";
  EXPECT_GE(token_bits(kStrong), 256);  // what `openssl rand -hex 32` makes
  EXPECT_EQ(token_bits("3f9a0c7e51d28b46e07c9a3d5f1b8264"), 128) << "16 random bytes in hex: enough";
  EXPECT_LT(token_bits("3f9a0c7e51d28b46e07c9a3d5f1b826"), 128);
  // A repeated piece is worth the piece (issue #49: `abcdefgh` four times passed as 150 bits).
  EXPECT_NEAR(token_bits("abcdefghabcdefghabcdefghabcdefgh"), 8 * std::log2(26.0), 1e-9);
  EXPECT_EQ(token_bits("0123456789abcdef0123456789abcdef"), 64);
  EXPECT_EQ(token_bits("3f9a0c7e51d28b46e07c9a3d5f1b82a3"), 128) << "first character = last: chance, not a repetition";
  EXPECT_EQ(token_bits("3f9a0c7e51d28b46e07c9a3d5f1b3f9a"), 128) << "a border under half the token";
  EXPECT_EQ(token_bits("3f9a0c7e51d23f9a0c7e51d23f9a0c"), 48) << "a piece of 12, two and a half times";
  EXPECT_NEAR(token_bits("Tr0ub4dor&3-Tr0ub4dor&3-Tr0ub4dor&3-Tr0ub4dor&3-"), 12 * std::log2(95.0), 1e-9);
  EXPECT_LT(token_bits("s3cret-token-value"), 128);
  EXPECT_EQ(token_bits(std::string(100, 'a')), 0) << "one character repeated";
  for (const auto& weak : std::vector<std::string>{"a", "s3cret-token-value", "password1234", std::string(100, 'a'),
                                                   "abcdefghabcdefghabcdefghabcdefgh"}) {
    expect_error<ConfigError>([&] { coordinator_token(weak, run, "0.0.0.0", false); }, "too weak");
    EXPECT_EQ(coordinator_token(weak, run, "0.0.0.0", true), weak) << "--insecure takes any token";
  }
  expect_error<ConfigError>([&] { coordinator_token("password1234", run, "127.0.0.1", false); },
                            "LOCO_JOIN_TOKEN=$(openssl rand -hex 32)");
}

}  // namespace
}  // namespace loco::runtime::auth
