#include "loco/data/shard.h"

#include <gtest/gtest.h>

#include <cstring>

#include "data/data_test_util.h"
#include "loco/core/error.h"
#include "loco/core/hash.h"

namespace loco::data {
namespace {

using testing::read_text;
using testing::TempDir;
using testing::throws_with;
using testing::write_text;

constexpr uint64_t kTokenizerHash = 0x0123456789abcdefULL;

std::vector<int32_t> ramp(size_t n, uint32_t vocab) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919) % vocab);
  return t;
}

template <typename T>
void patch(const fs::path& file, size_t offset, T value) {
  std::string bytes = read_text(file);
  ASSERT_LE(offset + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
  write_text(file, bytes);
}

TEST(Shard, RoundTripUint16) {
  TempDir tmp;
  const fs::path file = tmp / "a.tok";
  std::vector<int32_t> tokens = ramp(1000, 4096);
  tokens.push_back(4095);
  write_shard(file, tokens, 4096, kTokenizerHash);
  EXPECT_EQ(fs::file_size(file), kShardHeaderBytes + 2 * tokens.size());
  EXPECT_EQ(read_text(file).substr(0, 8), "LOCOTOK1");

  ShardInfo info;
  EXPECT_EQ(read_shard(file, &info), tokens);
  EXPECT_EQ(info.version, kShardVersion);
  EXPECT_EQ(info.dtype, 1u);
  EXPECT_EQ(info.token_count, tokens.size());
  EXPECT_EQ(info.tokenizer_hash, kTokenizerHash);
  EXPECT_EQ(info.vocab_size, 4096u);
  EXPECT_EQ(info.checksum, hash64(read_text(file).substr(kShardHeaderBytes)));

  ShardInfo header = read_shard_info(file);
  EXPECT_EQ(header.checksum, info.checksum);
  EXPECT_EQ(header.token_count, info.token_count);
}

// decode_shard is read_shard on bytes in memory (fuzz/shard_fuzzer feeds it): same checks, the
// given name in its errors.
TEST(Shard, DecodingBytesInMemoryMatchesReadingTheFile) {
  TempDir tmp;
  const fs::path file = tmp / "a.tok";
  const std::vector<int32_t> tokens = ramp(100, 4096);
  write_shard(file, tokens, 4096, kTokenizerHash);
  const std::string bytes = read_text(file);
  ShardInfo info;
  EXPECT_EQ(decode_shard(bytes, "mem.tok", &info), tokens);
  EXPECT_EQ(info.token_count, 100u);
  EXPECT_TRUE(throws_with<DataError>([&] { decode_shard(bytes.substr(0, 70), "mem.tok"); }, {"mem.tok", "truncated"}));
}

TEST(Shard, RoundTripUint32) {
  TempDir tmp;
  const fs::path file = tmp / "b.tok";
  const uint32_t vocab = 65537;  // one more than uint16 can address
  std::vector<int32_t> tokens = ramp(777, vocab);
  tokens.push_back(65536);
  tokens.push_back(0);
  write_shard(file, tokens, vocab, kTokenizerHash);
  EXPECT_EQ(fs::file_size(file), kShardHeaderBytes + 4 * tokens.size());
  ShardInfo info;
  EXPECT_EQ(read_shard(file, &info), tokens);
  EXPECT_EQ(info.dtype, 2u);
  EXPECT_EQ(info.vocab_size, vocab);
}

TEST(Shard, LargestUint16VocabularyStaysUint16) {
  TempDir tmp;
  std::vector<int32_t> tokens = {0, 65535, 1};
  write_shard(tmp / "c.tok", tokens, 65536, 1);
  ShardInfo info;
  EXPECT_EQ(read_shard(tmp / "c.tok", &info), tokens);
  EXPECT_EQ(info.dtype, 1u);
}

TEST(Shard, EmptyShard) {
  TempDir tmp;
  write_shard(tmp / "e.tok", {}, 10, 1);
  EXPECT_EQ(fs::file_size(tmp / "e.tok"), kShardHeaderBytes);
  EXPECT_TRUE(read_shard(tmp / "e.tok").empty());
}

TEST(Shard, WriteRejectsTokensOutsideTheVocabulary) {
  TempDir tmp;
  std::vector<int32_t> too_big = {1, 2, 100};
  EXPECT_TRUE(
      throws_with<InternalError>([&] { write_shard(tmp / "x.tok", too_big, 100, 1); }, {"token 100", "position 2"}));
  std::vector<int32_t> negative = {-1};
  EXPECT_THROW(write_shard(tmp / "x.tok", negative, 100, 1), InternalError);
  EXPECT_FALSE(fs::exists(tmp / "x.tok"));
}

class ShardErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_ = ramp(500, 1000);
    write_shard(file_, tokens_, 1000, kTokenizerHash);
  }
  TempDir tmp_;
  fs::path file_ = tmp_ / "train-00000.tok";
  std::vector<int32_t> tokens_;
};

TEST_F(ShardErrors, BadMagic) {
  patch<char>(file_, 3, 'X');
  EXPECT_TRUE(throws_with<DataError>([&] { read_shard(file_); }, {"train-00000.tok", "bad magic"}));
  EXPECT_TRUE(throws_with<DataError>([&] { read_shard_info(file_); }, {"train-00000.tok", "bad magic"}));
}

TEST_F(ShardErrors, WrongVersion) {
  patch<uint32_t>(file_, 8, 2);
  EXPECT_TRUE(throws_with<DataError>([&] { read_shard(file_); }, {"train-00000.tok", "version 2", "reads version 1"}));
}

TEST_F(ShardErrors, UnknownDtype) {
  patch<uint32_t>(file_, 12, 3);
  EXPECT_TRUE(throws_with<DataError>([&] { read_shard(file_); }, {"train-00000.tok", "dtype 3"}));
}

TEST_F(ShardErrors, TruncatedPayload) {
  std::string bytes = read_text(file_);
  write_text(file_, bytes.substr(0, bytes.size() - 3));
  EXPECT_TRUE(throws_with<DataError>([&] { read_shard(file_); }, {"train-00000.tok", "truncated", "500 tokens"}));
  // The header alone is intact, so read_shard_info does not notice.
  EXPECT_EQ(read_shard_info(file_).token_count, 500u);
}

TEST_F(ShardErrors, TruncatedHeader) {
  write_text(file_, read_text(file_).substr(0, 40));
  EXPECT_TRUE(throws_with<DataError>([&] { read_shard(file_); }, {"train-00000.tok", "truncated", "40 bytes"}));
  EXPECT_TRUE(throws_with<DataError>([&] { read_shard_info(file_); }, {"train-00000.tok", "truncated"}));
}

TEST_F(ShardErrors, TrailingBytes) {
  write_text(file_, read_text(file_) + "xy");
  EXPECT_TRUE(throws_with<DataError>([&] { read_shard(file_); }, {"train-00000.tok", "2 unexpected bytes"}));
}

TEST_F(ShardErrors, FlippedPayloadByteFailsTheChecksum) {
  std::string bytes = read_text(file_);
  bytes[kShardHeaderBytes + 123] ^= 0x01;
  write_text(file_, bytes);
  EXPECT_TRUE(throws_with<DataError>([&] { read_shard(file_); }, {"train-00000.tok", "checksum mismatch"}));
}

TEST_F(ShardErrors, TokenOutsideTheHeaderVocabulary) {
  // The vocabulary is not covered by the checksum: claim a smaller one than the tokens use.
  patch<uint32_t>(file_, 40, 200);
  EXPECT_TRUE(
      throws_with<DataError>([&] { read_shard(file_); }, {"train-00000.tok", "outside the vocabulary [0, 200)"}));
}

TEST_F(ShardErrors, NonZeroReservedBytes) {
  patch<uint8_t>(file_, 50, 1);
  EXPECT_TRUE(throws_with<DataError>([&] { read_shard(file_); }, {"train-00000.tok", "reserved"}));
}

TEST_F(ShardErrors, MissingFile) {
  EXPECT_TRUE(throws_with<DataError>([&] { read_shard(tmp_ / "nope.tok"); }, {"nope.tok", "no such file"}));
  EXPECT_TRUE(throws_with<DataError>([&] { read_shard_info(tmp_ / "nope.tok"); }, {"nope.tok", "no such file"}));
}

}  // namespace
}  // namespace loco::data
