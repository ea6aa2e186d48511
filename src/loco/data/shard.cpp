#include "loco/data/shard.h"

#include <bit>
#include <cstring>
#include <fstream>
#include <string>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/hash.h"
#include "loco/data/text.h"

namespace loco::data {
namespace {

static_assert(std::endian::native == std::endian::little, "loco's file formats are little-endian");

constexpr char kMagic[8] = {'L', 'O', 'C', 'O', 'T', 'O', 'K', '1'};
constexpr uint32_t kDtypeU16 = 1, kDtypeU32 = 2;

template <typename T>
void put(std::string& buf, size_t offset, T value) {
  std::memcpy(buf.data() + offset, &value, sizeof(T));
}

template <typename T>
T get(std::string_view buf, size_t offset) {
  T value;
  std::memcpy(&value, buf.data() + offset, sizeof(T));
  return value;
}

size_t dtype_bytes(uint32_t dtype) { return dtype == kDtypeU16 ? 2 : 4; }

// Parses and checks the 64-byte header at the start of `header` (the payload is not looked at).
ShardInfo parse_header(std::string_view header, const fs::path& path) {
  auto fail = [&](const std::string& problem) {
    throw DataError(kModule, fmt::format("{}: {}", path.string(), problem));
  };
  if (header.size() < kShardHeaderBytes) {
    fail(fmt::format("truncated: {} bytes, shorter than the {}-byte shard header", header.size(), kShardHeaderBytes));
  }
  if (std::memcmp(header.data(), kMagic, sizeof(kMagic)) != 0) {
    fail("not a loco token shard (bad magic; expected \"LOCOTOK1\")");
  }
  ShardInfo info;
  info.version = get<uint32_t>(header, 8);
  info.dtype = get<uint32_t>(header, 12);
  info.token_count = get<uint64_t>(header, 16);
  info.checksum = get<uint64_t>(header, 24);
  info.tokenizer_hash = get<uint64_t>(header, 32);
  info.vocab_size = get<uint32_t>(header, 40);
  if (info.version != kShardVersion) {
    fail(fmt::format("shard format version {}, this loco reads version {}. hint: re-run loco prepare", info.version,
                     kShardVersion));
  }
  if (info.dtype != kDtypeU16 && info.dtype != kDtypeU32) {
    fail(fmt::format("unknown dtype {} (expected 1 or 2)", info.dtype));
  }
  if (info.vocab_size == 0) fail("vocab size 0 in the header");
  if (info.dtype == kDtypeU16 && info.vocab_size > 65536) {
    fail(fmt::format("dtype uint16 cannot hold a vocabulary of {}", info.vocab_size));
  }
  for (size_t i = 44; i < kShardHeaderBytes; ++i) {
    if (header[i] != 0) fail("reserved header bytes are not zero");
  }
  return info;
}

}  // namespace

void write_shard(const fs::path& path, std::span<const int32_t> tokens, uint32_t vocab_size, uint64_t tokenizer_hash) {
  LOCO_CHECK(vocab_size > 0, "write_shard {}: vocab_size 0", path.string());
  const uint32_t dtype = vocab_size <= 65536 ? kDtypeU16 : kDtypeU32;
  const size_t width = dtype_bytes(dtype);
  std::string buf(kShardHeaderBytes + tokens.size() * width, '\0');
  char* payload = buf.data() + kShardHeaderBytes;
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t t = tokens[i];
    if (t < 0 || static_cast<uint32_t>(t) >= vocab_size) {
      throw InternalError(kModule, fmt::format("write_shard {}: token {} at position {} is outside [0, {})",
                                               path.string(), t, i, vocab_size));
    }
    if (dtype == kDtypeU16) {
      auto v = static_cast<uint16_t>(t);
      std::memcpy(payload + 2 * i, &v, 2);
    } else {
      auto v = static_cast<uint32_t>(t);
      std::memcpy(payload + 4 * i, &v, 4);
    }
  }
  std::memcpy(buf.data(), kMagic, sizeof(kMagic));
  put<uint32_t>(buf, 8, kShardVersion);
  put<uint32_t>(buf, 12, dtype);
  put<uint64_t>(buf, 16, tokens.size());
  put<uint64_t>(buf, 24, hash64(payload, tokens.size() * width));
  put<uint64_t>(buf, 32, tokenizer_hash);
  put<uint32_t>(buf, 40, vocab_size);
  write_file_atomic(path, buf, kModule);
}

std::vector<int32_t> read_shard(const fs::path& path, ShardInfo* info_out) {
  return decode_shard(read_file(path, kModule), path, info_out);
}

std::vector<int32_t> decode_shard(std::string_view bytes, const fs::path& path, ShardInfo* info_out) {
  ShardInfo info = parse_header(bytes, path);
  auto fail = [&](const std::string& problem) {
    throw DataError(kModule, fmt::format("{}: {}", path.string(), problem));
  };

  const size_t width = dtype_bytes(info.dtype);
  const uint64_t payload_bytes = bytes.size() - kShardHeaderBytes;
  if (info.token_count > payload_bytes / width) {
    fail(
        fmt::format("truncated: the header says {} tokens ({} bytes) but only {} payload bytes follow. "
                    "hint: re-run loco prepare",
                    info.token_count, info.token_count * width, payload_bytes));
  }
  if (payload_bytes != info.token_count * width) {
    fail(fmt::format("{} unexpected bytes after the {} tokens the header announces",
                     payload_bytes - info.token_count * width, info.token_count));
  }
  const char* payload = bytes.data() + kShardHeaderBytes;
  const uint64_t checksum = hash64(payload, payload_bytes);
  if (checksum != info.checksum) {
    fail(fmt::format("checksum mismatch (header {}, payload {}): the file is corrupted. hint: re-run loco prepare",
                     hex64(info.checksum), hex64(checksum)));
  }

  std::vector<int32_t> tokens(info.token_count);
  for (uint64_t i = 0; i < info.token_count; ++i) {
    uint32_t t;
    if (info.dtype == kDtypeU16) {
      uint16_t v;
      std::memcpy(&v, payload + 2 * i, 2);
      t = v;
    } else {
      std::memcpy(&t, payload + 4 * i, 4);
    }
    if (t >= info.vocab_size) {
      fail(fmt::format("token {} at position {} is outside the vocabulary [0, {})", t, i, info.vocab_size));
    }
    tokens[i] = static_cast<int32_t>(t);
  }
  if (info_out) *info_out = info;
  return tokens;
}

ShardInfo read_shard_info(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw DataError(kModule, fmt::format("{}: no such file", path.string()));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(kModule, fmt::format("{}: cannot open", path.string()));
  std::string header(kShardHeaderBytes, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header.size()));
  header.resize(static_cast<size_t>(in.gcount()));
  return parse_header(header, path);
}

}  // namespace loco::data
