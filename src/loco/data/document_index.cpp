// The document index of a split (train.docs / val.docs; docs/data-format.md): its bytes, written
// and checked.
#include <fmt/format.h>

#include <cstring>

#include "loco/core/error.h"
#include "loco/core/hash.h"
#include "loco/data/dataset.h"
#include "loco/data/text.h"

namespace loco::data {
namespace {

// Document index (train.docs / val.docs), little-endian:
//   0  char[8]  magic "LOCODOC1"
//   8  u32      version (kDocsVersion)
//  12  u32      reserved, zero
//  16  u64      entry count
//  24  u64      XXH3-64 of the entry bytes
//  32  entries  count * {u64 offset, u32 length, u32 label}
constexpr char kDocsMagic[8] = {'L', 'O', 'C', 'O', 'D', 'O', 'C', '1'};
constexpr uint32_t kDocsVersion = 1;
constexpr size_t kDocsHeaderBytes = 32;
constexpr size_t kDocsEntryBytes = 16;
}  // namespace

std::string encode_document_index(const std::vector<DocumentEntry>& docs) {
  std::string buf(kDocsHeaderBytes + docs.size() * kDocsEntryBytes, '\0');
  char* entries = buf.data() + kDocsHeaderBytes;
  for (size_t i = 0; i < docs.size(); ++i) {
    std::memcpy(entries + i * kDocsEntryBytes, &docs[i].offset, 8);
    std::memcpy(entries + i * kDocsEntryBytes + 8, &docs[i].length, 4);
    std::memcpy(entries + i * kDocsEntryBytes + 12, &docs[i].label, 4);
  }
  const uint64_t count = docs.size();
  const uint64_t checksum = hash64(entries, docs.size() * kDocsEntryBytes);
  std::memcpy(buf.data(), kDocsMagic, 8);
  std::memcpy(buf.data() + 8, &kDocsVersion, 4);
  std::memcpy(buf.data() + 16, &count, 8);
  std::memcpy(buf.data() + 24, &checksum, 8);
  return buf;
}

std::vector<DocumentEntry> decode_document_index(std::string_view bytes, const fs::path& file) {
  if (bytes.size() < kDocsHeaderBytes) {
    fail(file, fmt::format("truncated: {} bytes, shorter than the {}-byte header", bytes.size(), kDocsHeaderBytes));
  }
  if (std::memcmp(bytes.data(), kDocsMagic, 8) != 0) {
    fail(file, "not a loco document index (bad magic; expected \"LOCODOC1\")");
  }
  uint32_t version, reserved;
  uint64_t count, checksum;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&reserved, bytes.data() + 12, 4);
  std::memcpy(&count, bytes.data() + 16, 8);
  std::memcpy(&checksum, bytes.data() + 24, 8);
  if (version != kDocsVersion) {
    fail(file, fmt::format("document index version {}, this loco reads version {}. hint: re-run loco prepare", version,
                           kDocsVersion));
  }
  if (reserved != 0) fail(file, "reserved header bytes are not zero");
  const uint64_t entry_bytes = bytes.size() - kDocsHeaderBytes;
  if (count > entry_bytes / kDocsEntryBytes) {
    fail(file,
         fmt::format("truncated: the header says {} documents but only {} entry bytes follow", count, entry_bytes));
  }
  if (entry_bytes != count * kDocsEntryBytes) {
    fail(file, fmt::format("{} unexpected bytes after the {} entries", entry_bytes - count * kDocsEntryBytes, count));
  }
  const char* entries = bytes.data() + kDocsHeaderBytes;
  if (hash64(entries, entry_bytes) != checksum) {
    fail(file, "checksum mismatch: the file is corrupted. hint: re-run loco prepare");
  }
  std::vector<DocumentEntry> docs(count);
  for (uint64_t i = 0; i < count; ++i) {
    std::memcpy(&docs[i].offset, entries + i * kDocsEntryBytes, 8);
    std::memcpy(&docs[i].length, entries + i * kDocsEntryBytes + 8, 4);
    std::memcpy(&docs[i].label, entries + i * kDocsEntryBytes + 12, 4);
  }
  return docs;
}

}  // namespace loco::data
