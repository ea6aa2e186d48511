// libloco_spm.so: the only code of loco that includes SentencePiece (see spm_c_api.h for why).
#include "spm_c_api.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

struct loco_spm {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

char* copy_out(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, s.data(), s.size());
    out[s.size()] = '\0';
  }
  return out;
}

int fail(char** error, const std::string& message) {
  if (error != nullptr) *error = copy_out(message);
  return 1;
}

class LineIterator : public sentencepiece::SentenceIterator {
 public:
  LineIterator(const char* const* lines, const size_t* sizes, size_t count) : lines_(lines), sizes_(sizes), count_(count) {
    load();
  }
  bool done() const override { return index_ >= count_; }
  void Next() override {
    ++index_;
    load();
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void load() {
    if (!done()) value_.assign(lines_[index_], sizes_[index_]);
  }
  const char* const* lines_;
  const size_t* sizes_;
  size_t count_;
  size_t index_ = 0;
  std::string value_;
};

}  // namespace

extern "C" {

int loco_spm_train(const char* const* lines, const size_t* line_sizes, size_t count, const char* const* keys,
                   const char* const* values, size_t option_count, char** model, size_t* model_size, char** error) {
  try {
    std::unordered_map<std::string, std::string> kwargs;
    for (size_t i = 0; i < option_count; ++i) kwargs[keys[i]] = values[i];
    LineIterator iterator(lines, line_sizes, count);
    std::string serialized;
    auto status = sentencepiece::SentencePieceTrainer::Train(kwargs, &iterator, &serialized);
    if (!status.ok()) return fail(error, status.ToString());
    *model_size = serialized.size();
    *model = copy_out(serialized);
    return *model == nullptr ? fail(error, "out of memory") : 0;
  } catch (const std::exception& e) {
    return fail(error, e.what());
  }
}

int loco_spm_load(const char* model, size_t model_size, loco_spm** processor, char** error) {
  try {
    auto* p = new loco_spm;
    auto status = p->processor.LoadFromSerializedProto(std::string_view(model, model_size));
    if (!status.ok()) {
      delete p;
      return fail(error, status.ToString());
    }
    *processor = p;
    return 0;
  } catch (const std::exception& e) {
    return fail(error, e.what());
  }
}

void loco_spm_destroy(loco_spm* processor) { delete processor; }

int loco_spm_encode(const loco_spm* processor, const char* text, size_t text_size, int32_t** ids, size_t* count, char** error) {
  try {
    std::vector<int> out;
    auto status = processor->processor.Encode(std::string_view(text, text_size), &out);
    if (!status.ok()) return fail(error, status.ToString());
    *count = out.size();
    *ids = static_cast<int32_t*>(std::malloc(std::max<size_t>(1, out.size()) * sizeof(int32_t)));
    if (*ids == nullptr) return fail(error, "out of memory");
    for (size_t i = 0; i < out.size(); ++i) (*ids)[i] = out[i];
    return 0;
  } catch (const std::exception& e) {
    return fail(error, e.what());
  }
}

int loco_spm_decode(const loco_spm* processor, const int32_t* ids, size_t count, char** text, size_t* text_size, char** error) {
  try {
    std::string out;
    auto status = processor->processor.Decode(std::vector<int>(ids, ids + count), &out);
    if (!status.ok()) return fail(error, status.ToString());
    *text_size = out.size();
    *text = copy_out(out);
    return *text == nullptr ? fail(error, "out of memory") : 0;
  } catch (const std::exception& e) {
    return fail(error, e.what());
  }
}

void loco_spm_info(const loco_spm* processor, int* vocab_size, int* unk_id, int* bos_id, int* eos_id) {
  const auto& p = processor->processor;
  *vocab_size = p.GetPieceSize();
  *unk_id = p.unk_id();
  *bos_id = p.bos_id();
  *eos_id = p.eos_id();
}

void loco_spm_free(void* buffer) { std::free(buffer); }

}  // extern "C"
