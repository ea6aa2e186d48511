// loco-bench-control: what a flood of TLS handshakes from strangers does to the members of a run.
//
//   build/loco-bench-control [--key ec|rsa] [--flooders 8] [--hello-only [--burst 1]] [--fresh] [--seconds 10] [--cpus 0:1]
//
// The coordinator's HTTP server (runtime/net/http_server.h) serves HTTPS with a throwaway
// certificate (an ECDSA P-256 or an RSA 2048 key, made by the openssl tool). A member (from
// 127.0.0.1, its requests answered as authentic, as a signed request is) asks it every 20 ms over its kept-alive connection, as a worker's heartbeat does (or, with --fresh, over
// a new connection each time, as a worker that lost its connection does), through loco's own
// client (HttpClient); a second process, the flood, from 127.0.0.2, opens connections as fast as it can with
// `flooders` threads, each doing a whole TLS handshake and hanging up. Printed, for a quiet minute
// and then under the flood: the member's request latency (median, 99th percentile, worst), how far
// the server's I/O thread fell behind (HttpServer::behind(), which the elastic run's hold-off
// reads: at 0.5 s it stops holding members' silence against them) and the handshakes per second the
// flood completed.
//
// On one machine the flood and the server share the CPUs: `--cpus S:F` pins the server (and the
// member) to CPU S and the flood to CPU F, as if the flood came from a machine of its own with one
// core. --json prints one JSON line per phase.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <openssl/ssl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "loco/runtime/net/http_client.h"
#include "loco/runtime/net/http_server.h"
#include "process_util.h"  // (tests/: connect_loopback)

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

void pin_to(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof set, &set) != 0) throw std::runtime_error(fmt::format("cannot pin to CPU {}", cpu));
}

// A self-signed certificate for 127.0.0.1 in `dir`, with an ECDSA P-256 or an RSA 2048 key.
std::pair<std::string, std::string> make_certificate(const fs::path& dir, const std::string& key_type) {
  const auto cert = (dir / "cert.pem").string(), key = (dir / "key.pem").string();
  const auto algorithm = key_type == "rsa" ? "rsa:2048" : "ec -pkeyopt ec_paramgen_curve:prime256v1";
  const auto command = fmt::format("openssl req -x509 -newkey {} -nodes -days 1 -subj /CN=127.0.0.1 "
                                   "-addext subjectAltName=IP:127.0.0.1 -keyout {} -out {} 2>/dev/null",
                                   algorithm, key, cert);
  if (std::system(command.c_str()) != 0) throw std::runtime_error("openssl could not make a certificate");
  return {cert, key};
}

// A connection to 127.0.0.1:port from 127.0.0.2, another loopback address: the flood's machine.
int connect_loopback(int port) { return loco::testing_util::connect_loopback(port, "127.0.0.2"); }

// A TLS ClientHello, made once: sent again and again, it costs its sender nothing, while the
// server answers each with a key exchange and a signature.
std::string client_hello(SSL_CTX* context) {
  SSL* ssl = SSL_new(context);
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  SSL_set_bio(ssl, in, out);
  SSL_connect(ssl);  // wants to read the server's answer
  char* bytes = nullptr;
  const long n = BIO_get_mem_data(out, &bytes);
  std::string hello(bytes, static_cast<size_t>(n));
  SSL_free(ssl);
  return hello;
}

// The flood, in a process of its own: `threads` threads until `seconds` pass, each doing whole
// handshakes (no certificate check: a stranger does not care) or, with `hello_only`, sending one
// canned ClientHello on each of `burst` new connections and hanging up once each answer arrives;
// writes the count of
// handshakes the server answered to `out`.
[[noreturn]] void flood(int port, int threads, bool hello_only, int burst, double seconds, int cpu, int out) {
  pin_to(cpu);
  SSL_CTX* context = SSL_CTX_new(TLS_client_method());
  const std::string hello = client_hello(context);
  std::atomic<int64_t> handshakes = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      while (Clock::now() < end) {
        const int fd = connect_loopback(port);
        if (fd < 0) continue;
        if (hello_only) {
          // `burst` connections at once, each with its hello sent, then each answer awaited.
          std::vector<int> fds;
          for (int i = 0; i < burst; ++i) {
            const int next = i == 0 ? fd : connect_loopback(port);
            if (next < 0) break;
            if (::send(next, hello.data(), hello.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(hello.size())) {
              fds.push_back(next);
            } else {
              ::close(next);
            }
          }
          for (int each : fds) {
            char answer[4096];
            if (::recv(each, answer, sizeof answer, 0) > 0) ++handshakes;
            ::close(each);
          }
          continue;
        }
        SSL* ssl = SSL_new(context);
        SSL_set_fd(ssl, fd);
        if (SSL_connect(ssl) == 1) ++handshakes;
        SSL_free(ssl);
        ::close(fd);
      }
    });
  }
  for (auto& t : pool) t.join();
  const int64_t n = handshakes;
  if (::write(out, &n, sizeof n) != sizeof n) std::_Exit(1);
  std::_Exit(0);
}

struct Phase {
  std::vector<double> latency_ms;
  double worst_behind_ms = 0;
  int64_t failed = 0;
  double cpu = 0;  // CPU time of this process (server and member) over wall time
};

double cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// The member's requests and the server's lag, sampled for `seconds`.
Phase observe(loco::runtime::HttpServer& server, loco::runtime::HttpClient& member, bool fresh, double seconds) {
  Phase phase;
  std::atomic<bool> done = false;
  std::thread lag([&] {
    while (!done) {
      phase.worst_behind_ms = std::max<double>(phase.worst_behind_ms, static_cast<double>(server.behind().count()));
      std::this_thread::sleep_for(20ms);
    }
  });
  const auto begin = Clock::now();
  const double cpu_begin = cpu_seconds();
  const auto end = begin + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    const auto start = Clock::now();
    try {
      if (fresh) {
        loco::runtime::HttpClient once("coordinator", member.address(), member.security());
        once.request("GET", "/v1/ping", "", 10s);
      } else {
        member.request("GET", "/v1/ping", "", 10s);
      }
      phase.latency_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    } catch (const std::exception&) {
      ++phase.failed;
    }
    std::this_thread::sleep_for(20ms);
  }
  done = true;
  lag.join();
  phase.cpu = (cpu_seconds() - cpu_begin) / std::chrono::duration<double>(Clock::now() - begin).count();
  return phase;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loco-bench-control: a TLS handshake flood against the coordinator's HTTP server"};
  std::string key_type = "ec", cpus;
  int flooders = 8, burst = 1;
  double seconds = 10;
  bool json = false, hello_only = false, fresh = false;
  app.add_option("--key", key_type, "the certificate's key: ec (P-256) or rsa (2048)")->check(CLI::IsMember({"ec", "rsa"}));
  app.add_option("--flooders", flooders, "threads opening connections and handshaking")->check(CLI::Range(1, 256));
  app.add_option("--seconds", seconds, "length of each phase")->check(CLI::Range(1.0, 600.0));
  app.add_option("--cpus", cpus, "S:F: the server on CPU S, the flood on CPU F (default: unpinned)");
  app.add_flag("--hello-only", hello_only, "the flood sends a canned ClientHello and hangs up at the answer");
  app.add_option("--burst", burst, "with --hello-only: connections each flooder opens and sends its hello on at once")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--fresh", fresh, "the member connects (and handshakes) anew for every request");
  app.add_flag("--json", json, "one JSON line per phase");
  CLI11_PARSE(app, argc, argv);
  int server_cpu = -1, flood_cpu = -1;
  if (!cpus.empty() && std::sscanf(cpus.c_str(), "%d:%d", &server_cpu, &flood_cpu) != 2) {
    std::fprintf(stderr, "--cpus takes S:F, two CPU numbers\n");
    return 2;
  }
  pin_to(server_cpu);

  const auto dir = fs::temp_directory_path() / fmt::format("loco-bench-control-{}", ::getpid());
  fs::create_directories(dir);
  const auto [cert, key] = make_certificate(dir, key_type);
  loco::runtime::HttpServerOptions options;
  options.tls_cert = cert;
  options.tls_key = key;
  loco::runtime::HttpServer server(options);
  // As the coordinator answers a member's signed request.
  server.route("GET", "/v1/ping", [](const loco::runtime::HttpRequest&, loco::runtime::HttpResponse& response) {
    response.set_content("{}", "application/json");
    response.authentic = true;
  });
  server.start();
  loco::runtime::HttpClient member("coordinator", fmt::format("127.0.0.1:{}", server.port()), {"", true, cert});

  auto report = [&](const char* name, const Phase& phase, double handshakes_per_s) {
    if (json) {
      std::printf("%s\n", nlohmann::json{{"phase", name}, {"key", key_type}, {"flooders", flooders},
                                         {"median_ms", percentile(phase.latency_ms, 0.5)},
                                         {"p99_ms", percentile(phase.latency_ms, 0.99)},
                                         {"worst_ms", percentile(phase.latency_ms, 1.0)}, {"failed", phase.failed},
                                         {"worst_behind_ms", phase.worst_behind_ms}, {"server_cpu", phase.cpu},
                                         {"handshakes_per_s", handshakes_per_s}}.dump().c_str());
    } else {
      std::printf("%-6s %-4s %3d flooders  member latency median %7.2f ms  p99 %7.2f ms  worst %7.2f ms  failed %ld  "
                  "server behind at worst %6.0f ms  server CPU %3.0f%%  flood %7.0f handshakes/s\n",
                  name, key_type.c_str(), flooders, percentile(phase.latency_ms, 0.5), percentile(phase.latency_ms, 0.99),
                  percentile(phase.latency_ms, 1.0), static_cast<long>(phase.failed), phase.worst_behind_ms, 100 * phase.cpu,
                  handshakes_per_s);
    }
    std::fflush(stdout);
  };

  report("quiet", observe(server, member, fresh, seconds), 0);
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) throw std::runtime_error("pipe");
  const pid_t child = ::fork();
  if (child == 0) flood(server.port(), flooders, hello_only, burst, seconds + 1, flood_cpu, pipe_fds[1]);
  std::this_thread::sleep_for(500ms);  // the flood gets going
  const auto flooded = observe(server, member, fresh, seconds);
  int64_t handshakes = 0;
  if (::read(pipe_fds[0], &handshakes, sizeof handshakes) != sizeof handshakes) handshakes = -1;
  ::waitpid(child, nullptr, 0);
  report("flood", flooded, static_cast<double>(handshakes) / (seconds + 1));
  server.stop();
  fs::remove_all(dir);
  return 0;
}
