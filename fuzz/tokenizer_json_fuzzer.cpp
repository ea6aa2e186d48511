// A model's tokenizer.json as ByteLevelBpe::parse reads it (data/byte_level_bpe.h): it must accept
// the bytes or refuse them with DataError. What it accepts must encode a fixed text, and the input
// itself, into ids of its vocabulary that decode (or refuse text that is not UTF-8).
#include "fuzz.h"
#include "loco/data/byte_level_bpe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loco::data::ByteLevelBpe;
  using loco::fuzz::expect_refusal;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<ByteLevelBpe> bpe;
  expect_refusal("ByteLevelBpe::parse", [&] { bpe = ByteLevelBpe::parse(text, "fuzz/tokenizer.json"); });
  if (!bpe) return 0;
  for (std::string_view sample : {std::string_view("Hello, world! It's 2024: caf\xC3\xA9 \xF0\x9F\x98\x80\n\t  x<|endoftext|>"), text}) {
    expect_refusal("ByteLevelBpe::encode", [&] {
      const auto ids = bpe->encode(sample);
      for (int32_t id : ids) {
        if (id < 0 || id >= bpe->vocab_size()) loco::fuzz::finding("encode gave an id outside the vocabulary");
      }
      bpe->decode(ids);
    });
  }
  return 0;
}
