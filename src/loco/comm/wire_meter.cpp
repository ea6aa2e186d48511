#include "loco/comm/wire_meter.h"

#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace loco::comm {

WireCounters read_wire_counters() {
  WireCounters total;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string name = entry.path().filename().string();
    char* end = nullptr;
    const long fd = std::strtol(name.c_str(), &end, 10);
    if (end == name.c_str() || *end != '\0') continue;
    int protocol = 0;
    socklen_t length = sizeof protocol;
    if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_PROTOCOL, &protocol, &length) != 0 || protocol != IPPROTO_TCP) continue;
    tcp_info info{};
    length = sizeof info;
    if (::getsockopt(static_cast<int>(fd), IPPROTO_TCP, TCP_INFO, &info, &length) != 0) continue;
    int queued = 0;  // written but not yet acknowledged by the peer
    if (::ioctl(static_cast<int>(fd), SIOCOUTQ, &queued) != 0) queued = 0;
    total.sent += static_cast<int64_t>(info.tcpi_bytes_acked) + queued;
    total.received += static_cast<int64_t>(info.tcpi_bytes_received);
  }
  return total;
}

}  // namespace loco::comm
