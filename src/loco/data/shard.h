// Token shard files: the on-disk form of a tokenized split. See docs/data-format.md.
//
// Layout (little-endian), 64-byte header then the payload:
//   0  char[8]  magic "LOCOTOK1"
//   8  u32      format version (kShardVersion)
//  12  u32      dtype: 1 = uint16, 2 = uint32 (uint16 whenever vocab_size <= 65536)
//  16  u64      token count
//  24  u64      XXH3-64 checksum of the payload bytes
//  32  u64      tokenizer hash (Tokenizer::hash())
//  40  u32      vocab size
//  44  u8[20]   reserved, zero
//  64  payload  token count * dtype size bytes
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

namespace loco::data {

namespace fs = std::filesystem;

inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;

struct ShardInfo {
  uint32_t version = kShardVersion;
  uint32_t dtype = 1;
  uint64_t token_count = 0;
  uint64_t checksum = 0;
  uint64_t tokenizer_hash = 0;
  uint32_t vocab_size = 0;
};

// Writes `tokens` atomically. Throws InternalError if a token is outside [0, vocab_size).
void write_shard(const fs::path& path, std::span<const int32_t> tokens, uint32_t vocab_size, uint64_t tokenizer_hash);

// Reads and verifies a shard: magic, version, dtype, size against the token count (truncation),
// checksum (corruption), token ids < vocab_size. Throws DataError naming the file and the problem.
std::vector<int32_t> read_shard(const fs::path& path, ShardInfo* info = nullptr);
// The same checks on a shard's bytes already in memory; `path` only names it in errors.
std::vector<int32_t> decode_shard(std::string_view bytes, const fs::path& path, ShardInfo* info = nullptr);

// Reads only the header (no payload verification).
ShardInfo read_shard_info(const fs::path& path);

}  // namespace loco::data
