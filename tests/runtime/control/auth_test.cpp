// Request signatures and the run's join token (auth.h): what a MAC covers, the window, replays,
// and where a token comes from.
#include "loco/runtime/control/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "test_util.h"

namespace loco::runtime::auth {
namespace {

using testing_util::expect_error;

TEST(Auth, TheMacCoversEveryPartOfTheRequest) {
  const Key key("token");
  const auto base = mac(key, "POST", "/v1/kv/set?key=a", 1000, std::string(32, 'a'), "body");
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(base, mac(Key("token"), "POST", "/v1/kv/set?key=a", 1000, std::string(32, 'a'), "body")) << "deterministic";
  EXPECT_NE(base, mac(Key("token2"), "POST", "/v1/kv/set?key=a", 1000, std::string(32, 'a'), "body"));
  EXPECT_NE(base, mac(key, "GET", "/v1/kv/set?key=a", 1000, std::string(32, 'a'), "body"));
  EXPECT_NE(base, mac(key, "POST", "/v1/kv/set?key=b", 1000, std::string(32, 'a'), "body"));
  EXPECT_NE(base, mac(key, "POST", "/v1/kv/set?key=a", 1001, std::string(32, 'a'), "body"));
  EXPECT_NE(base, mac(key, "POST", "/v1/kv/set?key=a", 1000, std::string(32, 'b'), "body"));
  EXPECT_NE(base, mac(key, "POST", "/v1/kv/set?key=a", 1000, std::string(32, 'a'), "bodY"));
  EXPECT_EQ(base.find("token"), std::string::npos);
  const std::string key_hex = Key("token").bytes();
  EXPECT_EQ(key_hex.size(), 32u) << "the key is HMAC-SHA256 of the token, not the token";
  EXPECT_NE(key_hex, "token");
}

TEST(Auth, TheVerifierRefusesWrongStaleAndReplayedRequests) {
  Verifier verifier("token");
  const int64_t now = unix_now();
  const auto s = sign(Key("token"), "POST", "/v1/stop", "{}");
  const auto time = std::to_string(s.time);
  EXPECT_EQ(verifier.verify("POST", "/v1/stop", "{}", &time, &s.nonce, &s.mac, now), std::nullopt);
  auto replay = verifier.verify("POST", "/v1/stop", "{}", &time, &s.nonce, &s.mac, now + 5);
  ASSERT_TRUE(replay);
  EXPECT_NE(replay->find("replayed"), std::string::npos) << *replay;
  // Still refused just inside the window's far edge, and stale beyond it.
  EXPECT_TRUE(verifier.verify("POST", "/v1/stop", "{}", &time, &s.nonce, &s.mac, s.time + kWindow.count()));
  auto stale = verifier.verify("POST", "/v1/stop", "{}", &time, &s.nonce, &s.mac, s.time + kWindow.count() + 1);
  ASSERT_TRUE(stale);
  EXPECT_NE(stale->find("behind the coordinator's clock"), std::string::npos) << *stale;

  const auto other = sign(Key("other"), "POST", "/v1/stop", "{}");
  const auto other_time = std::to_string(other.time);
  auto wrong = verifier.verify("POST", "/v1/stop", "{}", &other_time, &other.nonce, &other.mac, now);
  ASSERT_TRUE(wrong);
  EXPECT_NE(wrong->find("wrong MAC"), std::string::npos) << *wrong;
  EXPECT_NE(verifier.precheck(nullptr, &s.nonce, &s.mac, now)->find("not signed"), std::string::npos);
  const std::string bad_time = "12x", short_nonce = "abc";
  EXPECT_NE(verifier.precheck(&bad_time, &s.nonce, &s.mac, now)->find("malformed"), std::string::npos);
  EXPECT_NE(verifier.precheck(&time, &short_nonce, &s.mac, now)->find("malformed"), std::string::npos);

  Verifier small("token", 2);  // holds two nonces: a third valid request waits for the window to pass
  for (int i = 0; i < 2; ++i) {
    const auto t = sign(Key("token"), "GET", "/v1/state", "");
    const auto tt = std::to_string(t.time);
    EXPECT_EQ(small.verify("GET", "/v1/state", "", &tt, &t.nonce, &t.mac, now), std::nullopt);
  }
  const auto third = sign(Key("token"), "GET", "/v1/state", "");
  const auto third_time = std::to_string(third.time);
  EXPECT_TRUE(small.verify("GET", "/v1/state", "", &third_time, &third.nonce, &third.mac, now));
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
  EXPECT_EQ(coordinator_token("mine", run, "127.0.0.1", false), "mine");
  EXPECT_EQ(coordinator_token("", run, "127.0.0.1", true), "") << "--insecure: none";
  struct stat info {};
  ASSERT_EQ(::stat((run / "join_token").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  write_file_atomic(run / "join_token", "\n", "test");
  expect_error<ConfigError>([&] { resolve_token("", run); }, "does not hold a join token");
}

}  // namespace
}  // namespace loco::runtime::auth
