// The coordinator's TLS server reading a client's first flight (runtime/net/handshake_queue.h:
// client_hello_missing), driven as the server drives it: it asks how many bytes are missing, reads
// them from the input, and asks again, until the ClientHello is whole, refused, or the input ends
// (the server would wait). It must ask for something each time, never take more than
// kMaxClientHello bytes in all, and call whole only what opens with a handshake record.
#include <string>

#include "fuzz.h"
#include "loco/runtime/net/handshake_queue.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loco::runtime::detail::client_hello_missing;
  using loco::runtime::detail::kMaxClientHello;
  std::string read;
  for (;;) {
    const auto missing = client_hello_missing(read);
    if (!missing) return 0;
    if (*missing == 0) {
      if (read.size() < 9 || read[0] != 22) loco::fuzz::finding("a ClientHello called whole that is none");
      return 0;
    }
    if (read.size() + *missing > kMaxClientHello + 5) loco::fuzz::finding("asked to read past the bound");
    if (read.size() + *missing > size) return 0;
    read.append(reinterpret_cast<const char*>(data) + read.size(), *missing);
  }
}
