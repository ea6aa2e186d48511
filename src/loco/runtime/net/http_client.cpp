#include "loco/runtime/net/http_client.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <thread>

namespace loco::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// libcurl's process-wide start, once, before the first handle (curl_global_init is not thread-safe).
void start_curl() {
  static const CURLcode started = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (started != CURLE_OK) throw Error("net", fmt::format("cannot start libcurl: {}", curl_easy_strerror(started)));
}

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// An answer as libcurl hands it over: the status line and headers counted against
// kMaxAnswerHeaderBytes and kMaxAnswerHeaderLines, the body against auth::kMaxAnswerBytes; past a
// bound the transfer is cut off (a callback taking less than it was given ends it) and `over`
// says which.
struct Answer {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  size_t header_bytes = 0, header_lines = 0;
  std::string body;
  std::string over;
  size_t max_body = auth::kMaxAnswerBytes;

  const std::string* header(std::string_view name) const {
    const auto it = headers.find(lower(name));
    return it == headers.end() ? nullptr : &it->second;
  }

  static size_t on_header(char* data, size_t size, size_t count, void* user) {
    auto& a = *static_cast<Answer*>(user);
    const size_t n = size * count;
    std::string_view line(data, n);
    if (line.starts_with("HTTP/")) {  // a new answer (after a 100 Continue, the final one): its own bounds
      a.headers.clear();
      a.header_bytes = a.header_lines = 0;
      const auto space = line.find(' ');
      a.status = space == std::string_view::npos ? 0 : std::atoi(std::string(line.substr(space + 1, 3)).c_str());
    }
    a.header_bytes += n;
    if (a.header_bytes > kMaxAnswerHeaderBytes || ++a.header_lines > kMaxAnswerHeaderLines) {
      a.over = "headers";
      return 0;
    }
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
    const auto colon = line.find(':');
    if (colon != std::string_view::npos && !line.starts_with("HTTP/")) {
      auto value = line.substr(colon + 1);
      while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
      a.headers.emplace(lower(line.substr(0, colon)), std::string(value));
    }
    return n;
  }
  static size_t on_body(char* data, size_t size, size_t count, void* user) {
    auto& a = *static_cast<Answer*>(user);
    const size_t n = size * count;
    if (a.body.size() + n > a.max_body) {
      a.over = "body";
      return 0;
    }
    a.body.append(data, n);
    return n;
  }
};

// Frees a curl_slist when it goes.
struct HeaderList {
  curl_slist* list = nullptr;
  void add(const std::string& line) {
    if (auto* next = curl_slist_append(list, line.c_str())) list = next;
  }
  ~HeaderList() { curl_slist_free_all(list); }
};

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
  start_curl();
  curl_ = curl_easy_init();
  if (curl_ == nullptr) throw ConfigError("net", fmt::format("cannot make a client for the {} at {}", peer_, address));
}

HttpClient::~HttpClient() { curl_easy_cleanup(curl_); }

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
  read_timeout_ = read_timeout;
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
  HeaderList headers;
  std::string nonce;
  if (key_) {
    const auto s = auth::sign(*key_, method, path, instance_, method == "GET" ? std::string_view() : std::string_view(body));
    headers.add(fmt::format("{}: {}", auth::kTimeHeader, s.time));
    headers.add(fmt::format("{}: {}", auth::kNonceHeader, s.nonce));
    headers.add(fmt::format("{}: {}", auth::kMacHeader, s.mac));
    headers.add(fmt::format("{}: {}", auth::kHeadMacHeader, s.head_mac));
    if (!instance_.empty()) headers.add(fmt::format("{}: {}", auth::kInstanceHeader, instance_));
    nonce = s.nonce;
  }
  headers.add("Expect:");  // no 100-continue round trip before a body
  headers.add("Accept:");
  if (method != "GET") headers.add("Content-Type: application/json");
  // The handle keeps its connection (and TLS session) across the reset; every option is set anew.
  CURL* curl = curl_;
  curl_easy_reset(curl);
  const auto bracketed = host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_;
  const auto url = fmt::format("{}://{}:{}{}", security_.tls ? "https" : "http", bracketed, port_, path);
  char message[CURL_ERROR_SIZE] = {};
  Answer answer;
  answer.max_body = max_answer_bytes_;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());  // paths are encoded already, and signed as sent
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_PROXY, "");  // straight to the peer: no http_proxy from the environment
  curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
  // The whole attempt: the request's writing (at most 10 s, as before) and the answer's reading.
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(read_timeout_.count() + 10000));
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.list);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, message);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &Answer::on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &answer);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Answer::on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer);
  if (method == "GET") {
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    if (method != "POST") curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  if (security_.tls) {
    curl_easy_setopt(curl, CURLOPT_CAINFO, security_.tls_ca.c_str());
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
  }
  const CURLcode result = curl_easy_perform(curl);
  if (answer.over == "body") {
    error = fmt::format("the answer to {} is over {} MiB (not the {}'s)", path, max_answer_bytes_ >> 20, peer_);
    return std::nullopt;
  }
  if (answer.over == "headers") {
    error = fmt::format("the answer to {} has over {} KiB or {} lines of headers (not the {}'s)", path,
                        kMaxAnswerHeaderBytes >> 10, kMaxAnswerHeaderLines, peer_);
    return std::nullopt;
  }
  if (result != CURLE_OK) {
    error = message[0] != 0 ? std::string(message) : std::string(curl_easy_strerror(result));
    if (security_.tls && (result == CURLE_PEER_FAILED_VERIFICATION || result == CURLE_SSL_CACERT_BADFILE)) {
      error += fmt::format(" (the {}'s certificate is not signed by {}, or does not name {})", peer_, security_.tls_ca, host_);
    }
    return std::nullopt;
  }
  told.clear();
  const auto* instance = answer.header(auth::kInstanceHeader);
  if (answer.status == 401 && instance != nullptr && auth::is_instance(*instance)) told = *instance;
  // Without a key, nothing proves who answered: only a refusal (401) is passed on, which makes
  // send() look for the run's token file, or tells the caller a token is needed. An --insecure
  // client believes what it is told, as its coordinator signs nothing.
  if (!key_ && !security_.insecure && answer.status != 401) {
    error = fmt::format("an unsigned answer (HTTP {} to {}), not believed: this worker has no join token, and only a {} "
                        "run with --insecure answers without one (or another process holds the port)",
                        answer.status, path, peer_);
    return std::nullopt;
  }
  // With a key, only answers signed for this request are believed; a refusal (401, 403) is passed
  // to send(), which signs again with the instance it told and believes none.
  if (key_ && answer.status != 401 && answer.status != 403) {
    if (auto why = auth::check_answer(*key_, nonce, answer.status, answer.body, answer.header(auth::kAnswerMacHeader))) {
      error = fmt::format("{} (HTTP {} to {}): not the run's {}, or an answer altered on the way", *why, answer.status,
                          path, peer_);
      return std::nullopt;
    }
  }
  return Reply{answer.status, std::move(answer.body)};
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
