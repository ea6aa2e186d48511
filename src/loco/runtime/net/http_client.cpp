#include "loco/runtime/net/http_client.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <httplib.h>
#include <netdb.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

namespace loco::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

}  // namespace

std::string error_text(const std::string& body) {
  try {
    auto json = nlohmann::json::parse(body);
    if (json.is_object() && json.contains("error") && json["error"].is_string()) return json["error"].get<std::string>();
  } catch (const nlohmann::json::exception&) {
  }
  return body.substr(0, 500);
}

HttpClient::HttpClient(std::string peer, const std::string& address, ClientSecurity security)
    : peer_(std::move(peer)), security_(std::move(security)) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    throw ConfigError("net", fmt::format("{} address '{}' is not HOST:PORT", peer_, address));
  }
  host_ = address.substr(0, colon);
  if (host_.size() > 2 && host_.front() == '[' && host_.back() == ']') host_ = host_.substr(1, host_.size() - 2);
  try {
    size_t used = 0;
    port_ = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1 || port_ < 1 || port_ > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    throw ConfigError("net", fmt::format("{} address '{}': the port must be a number in 1..65535", peer_, address));
  }
  if (!security_.token.empty()) key_.emplace(security_.token);
  if (security_.tls) {
    const auto bracketed = host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_;
    client_ = std::make_unique<httplib::Client>(fmt::format("https://{}:{}", bracketed, port_));
    client_->set_ca_cert_path(security_.tls_ca.c_str());
    client_->enable_server_certificate_verification(true);
  } else {
    client_ = std::make_unique<httplib::Client>(host_, port_);
  }
  if (!client_->is_valid()) throw ConfigError("net", fmt::format("cannot make a client for the {} at {}", peer_, address));
  client_->set_url_encode(false);  // paths are encoded already, and signed as sent
  client_->set_connection_timeout(5s);
  client_->set_write_timeout(10s);
  client_->set_keep_alive(true);
}

HttpClient::~HttpClient() = default;

std::string HttpClient::address() const { return fmt::format("{}:{}", host_, port_); }

std::string HttpClient::data_plane_secret() {
  std::lock_guard lock(mutex_);
  load_token_file();
  return key_ ? auth::data_plane_secret(*key_) : std::string();
}

void HttpClient::load_token_file() {
  if (key_ || security_.token_file.empty()) return;
  std::error_code missing;
  if (std::filesystem::exists(security_.token_file, missing)) {
    security_.token = auth::resolve_token("", security_.token_file.parent_path());
    key_.emplace(security_.token);
  }
}

std::optional<HttpClient::Reply> HttpClient::attempt(const std::string& method, const std::string& path,
                                                     const std::string& body, std::chrono::milliseconds read_timeout,
                                                     std::string& error) {
  std::lock_guard lock(mutex_);
  client_->set_read_timeout(read_timeout);
  return send(method, path, body, error);
}

std::optional<HttpClient::Reply> HttpClient::send(const std::string& method, const std::string& path,
                                                  const std::string& body, std::string& error) {
  load_token_file();
  std::string told;
  auto reply = send_once(method, path, body, error, told);
  // At most twice: an unsigned request, then signed without the instance, would be refused twice.
  for (int again = 0; again < 2 && reply && reply->first == 401; ++again) {
    const bool was_signed = key_.has_value();
    const auto used = instance_;
    if (!was_signed) load_token_file();
    if (!told.empty()) instance_ = told;
    if (!key_ || (was_signed && instance_ == used)) break;  // nothing new to sign with
    reply = send_once(method, path, body, error, told);
  }
  // A signed request's refusal is never signed (the coordinator signs only what it authenticated),
  // so it is not believed: anyone on the path could forge one to end this worker. Passed on only
  // to sign again with the instance it told (above); refused still, it is what an unanswered
  // request is, and the caller tries again within its patience.
  if (reply && key_ && (reply->first == 401 || reply->first == 403)) {
    error = fmt::format("a refusal (HTTP {} to {}: {}) not signed with this worker's token, not believed: the {} has "
                        "another token, or another process answered", reply->first, path, error_text(reply->second), peer_);
    return std::nullopt;
  }
  return reply;
}

std::optional<HttpClient::Reply> HttpClient::send_once(const std::string& method, const std::string& path,
                                                       const std::string& body, std::string& error, std::string& told) {
  httplib::Headers headers;
  std::string nonce;
  if (key_) {
    const auto s = auth::sign(*key_, method, path, instance_, method == "GET" ? std::string_view() : std::string_view(body));
    headers = {{auth::kTimeHeader, std::to_string(s.time)}, {auth::kNonceHeader, s.nonce}, {auth::kMacHeader, s.mac}};
    if (!instance_.empty()) headers.emplace(auth::kInstanceHeader, instance_);
    nonce = s.nonce;
  }
  // The answer is read into `answer`, up to auth::kMaxAnswerBytes: a longer one is cut off.
  httplib::Request request;
  request.method = method;
  request.path = path;
  request.headers = std::move(headers);
  if (method != "GET") {
    request.body = body;
    request.set_header("Content-Type", "application/json");
  }
  std::string answer;
  bool too_long = false;
  request.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
    if (answer.size() + length > auth::kMaxAnswerBytes) {
      too_long = true;
      return false;
    }
    answer.append(data, length);
    return true;
  };
  auto result = client_->send(request);
  if (too_long) {
    error = fmt::format("the answer to {} is over {} MiB (not the {}'s)", path, auth::kMaxAnswerBytes >> 20, peer_);
    return std::nullopt;
  }
  if (!result) {
    error = httplib::to_string(result.error());
    if (security_.tls && result.error() == httplib::Error::SSLServerVerification) {
      error += fmt::format(" (the {}'s certificate is not signed by {}, or does not name {})", peer_, security_.tls_ca, host_);
    }
    return std::nullopt;
  }
  told.clear();
  if (result->status == 401 && auth::is_instance(result->get_header_value(auth::kInstanceHeader))) {
    told = result->get_header_value(auth::kInstanceHeader);
  }
  // With a key, only answers signed for this request are believed; a refusal (401, 403) is passed
  // to send(), which signs again with the instance it told and believes none.
  if (key_ && result->status != 401 && result->status != 403) {
    const auto mac = result->get_header_value(auth::kAnswerMacHeader);
    if (auto why = auth::check_answer(*key_, nonce, result->status, answer, result->has_header(auth::kAnswerMacHeader) ? &mac : nullptr)) {
      error = fmt::format("{} (HTTP {} to {}): not the run's {}, or an answer altered on the way", *why, result->status,
                          path, peer_);
      return std::nullopt;
    }
  }
  return Reply{result->status, std::move(answer)};
}

HttpClient::Reply HttpClient::request(const std::string& method, const std::string& path, const std::string& body,
                                      std::chrono::milliseconds read_timeout) {
  std::string error;
  const auto start = Clock::now();
  auto backoff = 200ms;
  for (;;) {
    if (auto reply = attempt(method, path, body, read_timeout, error)) return *reply;
    if (Clock::now() + backoff > start + patience_) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
  throw PeerUnreachable(peer_, fmt::format("the {} at {} did not answer {} for {:.0f} s: {}", peer_, address(), path,
                                           std::chrono::duration<double>(Clock::now() - start).count(), error));
}

std::string HttpClient::local_address() const {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found) != 0 || found == nullptr) {
    throw ConfigError("net", fmt::format("cannot resolve the {}'s host '{}'", peer_, host_));
  }
  std::string out;
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t length = sizeof local;
    char text[INET_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text) != nullptr) {
      out = text;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  if (out.empty()) throw ConfigError("net", fmt::format("cannot find the local address that reaches {}; set cluster.host", host_));
  return out;
}

}  // namespace loco::runtime
