// What the harnesses of fuzz/ share: which exceptions are a parser's proper answer to bad bytes,
// and how a harness reports a finding (see scripts/fuzz.sh).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <typeinfo>

#include "loco/core/error.h"

namespace loco::fuzz {

// Prints `what` and aborts: libFuzzer reports the abort as a crash and keeps the input.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "\n==loco-fuzz== finding: %s\n", what.c_str());
  std::abort();
}

// Runs `parse`. A loco::Error (ConfigError, DataError, ProtocolError...) is the parser refusing bad
// input, as documented. Anything else is a finding: an InternalError (a LOCO_CHECK, i.e. a bug
// reached from outside), std::bad_alloc or length_error (a length field believed), an exception
// of a library under loco (nlohmann, toml++, c10) that leaked through.
template <class Parse>
void expect_refusal(std::string_view parser, Parse&& parse) {
  try {
    parse();
  } catch (const InternalError& e) {
    finding(std::string(parser) + " raised InternalError: " + e.what());
  } catch (const Error&) {
  } catch (const std::exception& e) {
    finding(std::string(parser) + " raised " + typeid(e).name() + ": " + e.what());
  } catch (...) {
    finding(std::string(parser) + " raised an exception that is not a std::exception");
  }
}

inline std::string bytes_of(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace loco::fuzz
