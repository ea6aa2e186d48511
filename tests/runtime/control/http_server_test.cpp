// The coordinator's HTTP server on its own (http_server.h): routes, deadlines that a slow client
// cannot stretch, the gate, a full connection table making room, and knowing when it is behind.
#include "loco/runtime/control/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "process_util.h"

namespace loco::runtime {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Whether the server has closed `fd` (end of file, or a reset), waiting at most `patience`.
bool closed_within(int fd, std::chrono::milliseconds patience) {
  timeval timeout{0, static_cast<suseconds_t>(patience.count() * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  char buffer[256];
  const auto n = ::recv(fd, buffer, sizeof buffer, 0);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

HttpServerOptions fast_options() {
  HttpServerOptions o;
  o.header_deadline = 300ms;
  o.handler_threads = 2;
  return o;
}

TEST(HttpServer, RoutesGateAndErrors) {
  HttpServer server(fast_options());
  server.route("POST", "/echo", [](const HttpRequest& request, HttpResponse& response) {
    response.set_content(request.param("word") + ":" + request.body, "text/plain");
  });
  server.set_gate([](const HttpRequest& request) -> std::optional<HttpResponse> {
    if (request.header("x-pass") != nullptr) return std::nullopt;  // names compare without case
    HttpResponse refusal;
    refusal.status = 401;
    refusal.set_content("no", "text/plain");
    return refusal;
  });
  server.start();
  httplib::Client client("127.0.0.1", server.port());
  const httplib::Headers pass = {{"X-Pass", "1"}};
  auto ok = client.Post("/echo?word=h%C3%A9llo", pass, "body", "text/plain");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->body, "h\xC3\xA9llo:body") << "the query is decoded";
  auto refused = client.Post("/echo", "body", "text/plain");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(client.Get("/echo", pass)->status, 405);
  EXPECT_EQ(client.Get("/nowhere", pass)->status, 404);
  EXPECT_EQ(server.counts().refused_at_gate, 1);
}

// Headers sent a byte at a time are cut off at the deadline, however steadily they come.
TEST(HttpServer, ASlowClientIsCutOffAtTheHeaderDeadline) {
  HttpServer server(fast_options());
  server.start();
  const int fd = testing_util::connect_loopback(server.port());
  ASSERT_GE(fd, 0);
  const std::string request = "GET / HTTP/1.1\r\nX-Slow: " + std::string(1000, 's');
  const auto start = Clock::now();
  bool cut = false;
  for (char c : request) {
    if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1 || closed_within(fd, 50ms)) {
      cut = true;
      break;
    }
  }
  const auto took = Clock::now() - start;
  ::close(fd);
  EXPECT_TRUE(cut);
  EXPECT_LT(took, 3s) << "the deadline is 300 ms";
  // Beast closes the socket when the timer fires and only then runs the handler that counts it,
  // so the client may see the close before the count moves.
  const auto counted_by = Clock::now() + 2s;
  while (server.counts().timed_out < 1 && Clock::now() < counted_by) std::this_thread::sleep_for(10ms);
  EXPECT_GE(server.counts().timed_out, 1);
}

// A full table of idle connections makes room for a new client: the one idle longest is closed.
TEST(HttpServer, AFullConnectionTableMakesRoom) {
  auto options = fast_options();
  options.header_deadline = 30s;  // the idle ones would otherwise be closed by their deadline
  options.max_connections = 16;
  HttpServer server(options);
  server.route("GET", "/", [](const HttpRequest&, HttpResponse& response) { response.set_content("here", "text/plain"); });
  server.start();
  std::vector<int> idle;
  for (int i = 0; i < 16; ++i) {
    idle.push_back(testing_util::connect_loopback(server.port()));
    ASSERT_GE(idle.back(), 0);
  }
  std::this_thread::sleep_for(100ms);
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(5s);
  auto answer = client.Get("/");
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->body, "here");
  EXPECT_GE(server.counts().evicted, 1);
  EXPECT_TRUE(closed_within(idle.front(), 1000ms)) << "the oldest idle connection made room";
  for (int fd : idle) ::close(fd);
}

// Connections that hold a slot by sending a body slowly (a client without the key can: the MAC
// covers the body, so the gate lets well-formed headers through) make room as idle ones do.
TEST(HttpServer, ConnectionsHoldingABodyMakeRoomToo) {
  auto options = fast_options();
  options.body_deadline = 30s;
  options.max_connections = 16;
  HttpServer server(options);
  server.route("GET", "/", [](const HttpRequest&, HttpResponse& response) { response.set_content("here", "text/plain"); });
  server.route("POST", "/slow", [](const HttpRequest&, HttpResponse& response) { response.set_content("late", "text/plain"); });
  server.start();
  std::vector<int> holding;
  const std::string start = "POST /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\nx";
  for (int i = 0; i < 16; ++i) {
    holding.push_back(testing_util::connect_loopback(server.port()));
    ASSERT_GE(holding.back(), 0);
    ASSERT_EQ(::send(holding.back(), start.data(), start.size(), MSG_NOSIGNAL), static_cast<ssize_t>(start.size()));
  }
  std::this_thread::sleep_for(200ms);
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(5s);
  auto answer = client.Get("/");
  ASSERT_TRUE(answer) << "a full table of slow bodies locked a new client out";
  EXPECT_EQ(answer->body, "here");
  EXPECT_GE(server.counts().evicted, 1);
  EXPECT_TRUE(closed_within(holding.front(), 1000ms)) << "the oldest slow body made room";
  for (int fd : holding) ::close(fd);
}

// What the server sends on `fd` within `patience`, up to 4 KiB.
std::string answer_on(int fd, std::chrono::milliseconds patience) {
  timeval timeout{0, static_cast<suseconds_t>(patience.count() * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  char buffer[4096];
  const auto n = ::recv(fd, buffer, sizeof buffer, 0);
  return n > 0 ? std::string(buffer, n) : std::string();
}

// The bytes of request bodies held are bounded: from one address (503 beyond the bound), and in
// all (the body waited on longest is closed to make room); a member is still answered.
TEST(HttpServer, BodiesHeldAreBoundedPerAddressAndInAll) {
  auto options = fast_options();
  options.body_deadline = 30s;
  options.max_held_body_bytes_per_address = 350'000;
  options.max_held_body_bytes = 1'000'000;
  HttpServer server(options);
  server.route("POST", "/slow", [](const HttpRequest& request, HttpResponse& response) {
    response.set_content(std::to_string(request.body.size()), "text/plain");
  });
  server.start();
  // Each announces 100,000 bytes and sends one.
  const std::string start = "POST /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\nx";
  auto open_body = [&](const char* from) {
    const int fd = testing_util::connect_loopback(server.port(), from);
    EXPECT_GE(fd, 0) << from;
    EXPECT_EQ(::send(fd, start.data(), start.size(), MSG_NOSIGNAL), static_cast<ssize_t>(start.size()));
    return fd;
  };
  auto held_settles_at = [&](int64_t bytes) {
    const auto deadline = Clock::now() + 3s;
    while (server.counts().held_body_bytes != bytes && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
    return server.counts().held_body_bytes == bytes;
  };
  std::vector<int> holding;
  for (int i = 0; i < 3; ++i) holding.push_back(open_body("127.0.0.2"));
  ASSERT_TRUE(held_settles_at(300'000)) << server.counts().held_body_bytes;
  const int over = open_body("127.0.0.2");
  EXPECT_EQ(answer_on(over, 2000ms).rfind("HTTP/1.1 503", 0), 0u) << "a fourth body from the same address";
  EXPECT_EQ(server.counts().refused_over_budget, 1);
  ::close(over);

  // Nine more from three other addresses: 1.2 MB announced in all, over the bound of 1 MB.
  for (const char* from : {"127.0.0.3", "127.0.0.4", "127.0.0.5"}) {
    for (int i = 0; i < 3; ++i) {
      holding.push_back(open_body(from));
      std::this_thread::sleep_for(20ms);  // in order, so that the oldest is the first
    }
  }
  ASSERT_TRUE(held_settles_at(1'000'000)) << server.counts().held_body_bytes;
  EXPECT_EQ(server.counts().evicted, 2);
  EXPECT_TRUE(closed_within(holding[0], 1000ms)) << "the oldest body made room";
  EXPECT_TRUE(closed_within(holding[1], 1000ms));
  EXPECT_EQ(answer_on(holding[2], 100ms), "") << "the third is still held";

  httplib::Client member("127.0.0.1", server.port());
  member.set_read_timeout(5s);
  auto answer = member.Post("/slow", std::string(200'000, 'm'), "text/plain");
  ASSERT_TRUE(answer) << "a member's body was locked out";
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(answer->body, "200000");
  EXPECT_LE(server.counts().held_body_bytes, 1'000'000);
  for (int fd : holding) ::close(fd);
  EXPECT_TRUE(held_settles_at(0)) << "closed connections give back what they held";
}

// Requests waiting for a busy handler pool show as the server being behind.
TEST(HttpServer, KnowsWhenItIsBehind) {
  auto options = fast_options();
  options.handler_threads = 1;
  HttpServer server(options);
  server.route("GET", "/slow", [](const HttpRequest&, HttpResponse&) { std::this_thread::sleep_for(1500ms); });
  server.start();
  EXPECT_LT(server.behind(), 200ms);
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back([&] {
      httplib::Client client("127.0.0.1", server.port());
      client.set_read_timeout(10s);
      client.Get("/slow");
    });
  }
  std::this_thread::sleep_for(1200ms);
  EXPECT_GT(server.behind(), 500ms) << "the second request has waited for the only handler thread";
  for (auto& t : clients) t.join();
  EXPECT_LT(server.behind(), 200ms);
}

}  // namespace
}  // namespace loco::runtime
