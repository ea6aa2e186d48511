#include <gtest/gtest.h>

#include "loco/core/error.h"
#include "loco/core/hash.h"

namespace loco {
namespace {

TEST(Hash, IncrementalEqualsOneShot) {
  const std::string text = "the quick brown fox jumps over the lazy dog";
  Hasher h;
  h.update(text.substr(0, 10));
  h.update(text.substr(10));
  EXPECT_EQ(h.digest(), hash64(text));
  EXPECT_NE(hash64(text), hash64(text + "."));
}

TEST(Hash, HexRoundTripAndErrors) {
  EXPECT_EQ(hex64(0x00ab), "00000000000000ab");
  EXPECT_EQ(parse_hex64(hex64(0xdeadbeef12345678ull), "t", "x"), 0xdeadbeef12345678ull);
  EXPECT_THROW(parse_hex64("xyz", "t", "x"), DataError);
  EXPECT_THROW(parse_hex64("00000000000000AG", "t", "x"), DataError);
}

TEST(Check, ThrowsInternalErrorWithMessage) {
  try {
    LOCO_CHECK(1 + 1 == 3, "arithmetic is {}", "broken");
    FAIL() << "LOCO_CHECK did not throw";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("arithmetic is broken"), std::string::npos);
  }
}

}  // namespace
}  // namespace loco
