// One peer's HTTP client, as loco's control plane talks: every request signed with the run's key
// (auth.h) and its answer checked to be the peer's, over TLS when asked, with a timeout on every
// attempt and retries with backoff while the peer cannot be reached. It knows nothing of what the
// requests mean (coordinator/coordinator_client.h speaks the coordinator's protocol over it).
// The transport is libcurl's: it lets the client bound an answer's headers as they arrive
// (kMaxAnswerHeaderBytes), which cpp-httplib 0.11's client cannot (issue #49).
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "loco/core/error.h"
#include "loco/runtime/net/auth.h"

namespace loco::runtime {

// The peer did not answer (refused, reset or timed out) through all of a request's retries.
class PeerUnreachable : public PeerError {
 public:
  PeerUnreachable(std::string_view peer, std::string_view message) : PeerError(peer, message) {}
};

// How a client reaches its peer securely (docs/security.md).
struct ClientSecurity {
  std::string token;   // signs every request (auth.h); "" = requests are not signed
  bool tls = false;    // HTTPS, verifying the peer's certificate against `tls_ca`
  std::string tls_ca;  // PEM file of the CA (or the self-signed certificate) to trust
  // Where the run's generated token appears when a coordinator on this machine makes one
  // (RUN/join_token): read when `token` is "" and the file exists by the time of a request, so
  // that a worker started together with its coordinator finds it.
  std::filesystem::path token_file;
  // Believe unsigned answers while there is no token (`loco worker --insecure`, for a coordinator
  // run with --insecure). Without it a client with no token believes only a refusal (401: sign
  // with the token file, or tell the user a token is needed): any process holding the port could
  // answer otherwise (issue #49).
  bool insecure = false;
};

// The most an answer's status line and headers may take, in bytes and in lines: a peer that sends
// more is not the coordinator (whose answers carry a handful), and is cut off as it sends.
inline constexpr size_t kMaxAnswerHeaderBytes = 16 << 10;
inline constexpr size_t kMaxAnswerHeaderLines = 64;

// The text of an error answer: its JSON "error" field, else its first 500 bytes.
std::string error_text(const std::string& body);

class HttpClient {
 public:
  using Reply = std::pair<int, std::string>;  // (HTTP status, body)

  // `address` is "host:port" (ConfigError when malformed); `peer` names the peer in errors
  // ("coordinator"). Nothing is sent yet.
  HttpClient(std::string peer, const std::string& address, ClientSecurity security = {});
  ~HttpClient();

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  std::string address() const;
  const ClientSecurity& security() const { return security_; }

  // How long request() keeps retrying a peer that does not answer (backoff from 0.2 s, doubling to
  // 5 s). Default 3 s.
  void set_patience(std::chrono::milliseconds patience) { patience_ = patience; }
  // The largest answer it reads (default auth::kMaxAnswerBytes); a longer one is cut off and refused.
  void set_max_answer_bytes(size_t bytes) { max_answer_bytes_ = bytes; }

  // One request, signed when there is a token, retried (signed anew) on connection errors for the
  // patience. Returns (HTTP status, body); throws PeerUnreachable when it stays unreachable.
  Reply request(const std::string& method, const std::string& path, const std::string& body,
                std::chrono::milliseconds read_timeout);
  // One attempt of a request, for callers with a retry policy of their own: nullopt on a
  // connection error or an answer that is not the peer's (then `error` says which). A request
  // refused (401) is signed and sent again when there is something new to sign it with: the run's
  // token file, for an unsigned request (a coordinator starting beside this worker writes it just
  // before it listens), or the peer instance the refusal told (this client's first request, or its
  // first after the peer restarted). A refusal (401, 403) of a signed request is never believed
  // (none is signed): nullopt, as for an answer that is not the peer's.
  std::optional<Reply> attempt(const std::string& method, const std::string& path, const std::string& body,
                               std::chrono::milliseconds read_timeout, std::string& error);

  // The local address this machine uses to reach the peer: the one peers on its network can reach
  // this machine at (no packet is sent to find it). ConfigError when there is none.
  std::string local_address() const;
  // The data plane's secret (auth::data_plane_secret) of the token this client signs with; "" when
  // it has none (yet: a token file is adopted at the first request that finds it).
  std::string data_plane_secret();

 private:
  std::optional<Reply> send(const std::string& method, const std::string& path, const std::string& body, std::string& error);
  // One request; on a refusal that tells an instance (auth::kInstanceHeader), `told` is set to it.
  std::optional<Reply> send_once(const std::string& method, const std::string& path, const std::string& body,
                                 std::string& error, std::string& told);
  // Adopts the run's generated token once its file exists (ClientSecurity::token_file).
  void load_token_file();

  std::string peer_;
  std::string host_;
  int port_ = 0;
  ClientSecurity security_;
  std::optional<auth::Key> key_;
  std::string instance_;  // the peer instance requests are signed for; "" until a refusal tells it
  std::chrono::milliseconds patience_{3000};
  size_t max_answer_bytes_ = auth::kMaxAnswerBytes;
  std::chrono::milliseconds read_timeout_{30000};  // of the attempt under way
  std::mutex mutex_;
  void* curl_ = nullptr;  // libcurl's easy handle (CURL*): it keeps the connection between requests
};

}  // namespace loco::runtime
