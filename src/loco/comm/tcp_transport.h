// loco's own transport under a sealed data plane, in two parts (group.h, connect_tcp;
// docs/security.md, "The data plane"): tcp_connect.cpp forms a group's connections, each proving
// membership before anything else is read from it; tcp_group.cpp moves the frames over them.
// Internal to comm.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "loco/comm/group.h"
#include "loco/comm/key_value.h"

namespace loco::comm::tcp_transport {

using Clock = std::chrono::steady_clock;
inline constexpr Duration kAbortPoll{100};  // how often a wait asks GroupOptions::abort

// A socket closed when it goes out of scope.
struct Socket {
  int fd = -1;
  Socket() = default;
  explicit Socket(int f) : fd(f) {}
  Socket(Socket&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd = std::exchange(o.fd, -1);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

// Little-endian integers in frames and handshakes.
inline void put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void put64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline uint32_t get32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t get64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline std::string errno_text() { return std::strerror(errno); }
inline void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// A note for the process's log (GroupOptions::log, else standard error as "comm: ...").
void note(const GroupOptions& options, const std::string& line);

// One proven connection to a peer, nonblocking, and the address it was made with.
struct Link {
  Socket socket;
  std::string address;
};

// Forms `options`'s connections through `store`: links[q][i] is connection i with rank q (none
// for this rank), each proven. Throws PeerError naming the ranks that did not arrive or did not
// prove membership within options.timeout, or when options.abort says so.
std::vector<std::vector<Link>> form_links(KeyValueStore& store, const GroupOptions& options);

}  // namespace loco::comm::tcp_transport
