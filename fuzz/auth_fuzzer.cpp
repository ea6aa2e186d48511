// The control plane's signatures as a coordinator and a worker check them (runtime/net/auth.h):
// the bytes are, separated by NUL, a request's X-Loco-Time, X-Loco-Nonce, X-Loco-Mac and
// X-Loco-Instance, an answer's X-Loco-Answer-Mac, and a body. Without the key no input may pass either check, and
// neither check may throw or read out of bounds, whatever the headers hold.
#include <algorithm>
#include <string>
#include <vector>

#include "fuzz.h"
#include "loco/runtime/net/auth.h"

using namespace loco::runtime;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = loco::fuzz::bytes_of(data, size);
  // Up to six fields; the last one (the body) takes the rest, NULs included.
  std::vector<std::string> fields;
  size_t start = 0;
  while (fields.size() < 5) {
    const size_t nul = bytes.find('\0', start);
    if (nul == std::string::npos) break;
    fields.push_back(bytes.substr(start, nul - start));
    start = nul + 1;
  }
  fields.push_back(bytes.substr(std::min(start, bytes.size())));
  fields.resize(6);
  const std::string &time = fields[0], &nonce = fields[1], &mac = fields[2], &instance = fields[3], &answer = fields[4],
                    &body = fields[5];
  static auth::Verifier verifier("a token the input does not know 0123456789abcdef");
  const int64_t now = 1'700'000'000;
  try {
    // The instance as the input has it, and the verifier's own (which a stranger can learn).
    for (const std::string* claimed : {&instance, &verifier.instance()}) {
      const auth::SignatureHeaders headers{&time, &nonce, &mac, claimed};
      (void)verifier.precheck(headers, now);
      if (!verifier.verify("POST", "/v1/stop", body, headers, now)) loco::fuzz::finding("a forged request passed");
    }
    static const auth::Key key("a token the input does not know 0123456789abcdef");
    for (int status : {200, 401, 409}) {
      if (!auth::check_answer(key, nonce, status, body, &answer)) loco::fuzz::finding("a forged answer passed");
    }
  } catch (const std::exception& e) {
    loco::fuzz::finding(std::string("a signature check threw: ") + e.what());
  }
  return 0;
}
