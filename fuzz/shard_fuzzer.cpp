// A prepared dataset's files (data/shard.h, data/dataset.h): token shards (LOCOTOK1), document
// indexes (LOCODOC1) and manifest.json. Each decoder sees every input and must accept it or throw
// DataError. Shards and indexes are also decoded with their checksum field set to match the bytes
// that follow, so that the fuzzer reaches the checks behind the checksum.
#include <cstring>

#include "fuzz.h"
#include "loco/core/hash.h"
#include "loco/data/dataset.h"
#include "loco/data/shard.h"

namespace {

// Shard header: checksum at byte 24 over the payload from byte 64; document index: checksum at
// byte 24 over the entries from byte 32 (shard.h, dataset.cpp).
std::string with_checksum(std::string bytes, size_t payload_at) {
  if (bytes.size() < payload_at) return bytes;
  const uint64_t sum = loco::hash64(bytes.data() + payload_at, bytes.size() - payload_at);
  std::memcpy(bytes.data() + 24, &sum, 8);
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loco::data;
  using loco::fuzz::expect_refusal;
  const std::string bytes = loco::fuzz::bytes_of(data, size);
  expect_refusal("decode_shard", [&] { decode_shard(bytes, "fuzz.tok"); });
  expect_refusal("decode_shard", [&] { decode_shard(with_checksum(bytes, kShardHeaderBytes), "fuzz.tok"); });
  expect_refusal("decode_document_index", [&] { decode_document_index(bytes, "fuzz.docs"); });
  expect_refusal("decode_document_index", [&] { decode_document_index(with_checksum(bytes, 32), "fuzz.docs"); });
  expect_refusal("decode_manifest", [&] { decode_manifest(bytes, "manifest.json"); });
  return 0;
}
