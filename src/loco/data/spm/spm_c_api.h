// A C interface to SentencePiece, implemented by libloco_spm.so and loaded with dlopen().
//
// Why: Debian's libsentencepiece.so.0 bundles its own protobuf-lite (3.14) and exports those
// symbols, while libtorch links the system libprotobuf.so.32 (3.21). Linked into one process the
// two interpose each other and the process crashes before main(). Loading SentencePiece behind
// this small C interface with RTLD_LOCAL | RTLD_DEEPBIND keeps each protobuf to its own library.
// See docs/footguns.md.
//
// Every function returns 0 on success; on failure it returns non-zero and sets *error to a
// malloc()ed message. Buffers returned through out-parameters are malloc()ed; release them with
// loco_spm_free().
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loco_spm loco_spm;

// Trains a model on `count` lines with SentencePiece trainer options given as key/value pairs.
int loco_spm_train(const char* const* lines, const size_t* line_sizes, size_t count, const char* const* keys,
                   const char* const* values, size_t option_count, char** model, size_t* model_size, char** error);
int loco_spm_load(const char* model, size_t model_size, loco_spm** processor, char** error);
void loco_spm_destroy(loco_spm* processor);
int loco_spm_encode(const loco_spm* processor, const char* text, size_t text_size, int32_t** ids, size_t* count, char** error);
int loco_spm_decode(const loco_spm* processor, const int32_t* ids, size_t count, char** text, size_t* text_size, char** error);
// Vocabulary size and the ids of unk, bos and eos (-1 when absent).
void loco_spm_info(const loco_spm* processor, int* vocab_size, int* unk_id, int* bos_id, int* eos_id);
void loco_spm_free(void* buffer);

#ifdef __cplusplus
}
#endif
