// JSONL corpora and the text checks of data/corpus.h: parse_jsonl (one JSON object per line with
// a string "text") must accept the bytes or throw DataError; check_utf8 likewise; strip_brown_tags
// takes any text, and keeps valid UTF-8 valid.
#include "fuzz.h"
#include "loco/data/corpus.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loco::data;
  using loco::fuzz::expect_refusal;
  using loco::fuzz::finding;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  expect_refusal("parse_jsonl", [&] {
    for (const auto& document : parse_jsonl(text, "fuzz.jsonl")) {
      try {
        check_utf8(document.text, "text");
        check_utf8(document.label, "label");
      } catch (const std::exception& e) {
        finding(std::string("parse_jsonl returned a document that is not UTF-8: ") + e.what());
      }
    }
  });
  bool utf8 = true;
  expect_refusal("check_utf8", [&] {
    utf8 = false;
    check_utf8(text, "fuzz.txt");
    utf8 = true;
  });
  const std::string stripped = strip_brown_tags(text);
  if (utf8) {
    try {
      check_utf8(stripped, "stripped");
    } catch (const std::exception& e) {
      finding(std::string("strip_brown_tags broke valid UTF-8: ") + e.what());
    }
  }
  return 0;
}
