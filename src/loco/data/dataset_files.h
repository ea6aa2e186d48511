// The files of a prepared dataset folder (data/dataset.h): what reading it (dataset.cpp) and writing
// it (prepare.cpp) share. Internal to data/.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "loco/data/dataset.h"
#include "loco/data/text.h"

namespace loco::data::files {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kManifestFile = "manifest.json";
// The tokenizer kinds a dataset may hold: type in the manifest -> its file.
inline const std::map<std::string, std::string> kTokenizerFiles = {{"sentencepiece-bpe", "tokenizer.model"},
                                                                   {"byte-level-bpe", "tokenizer.json"}};
// 3 special ids + 256 byte-fallback pieces; SentencePiece needs room for the characters on top.
inline constexpr int kMinVocab = 260;

// "<split>.docs": a split's document index.
std::string docs_file_name(std::string_view split);
// manifest.json's text; the per-label document counts are the splits'.
std::string manifest_json(const Manifest& manifest, const std::vector<uint64_t>& train_label_documents,
                          const std::vector<uint64_t>& val_label_documents);

}  // namespace loco::data::files
