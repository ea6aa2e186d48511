// Private to the data module: the SentencePiece C interface (spm_c_api.h), loaded once per process
// from libloco_spm.so with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
#pragma once

#include "loco/data/spm/spm_c_api.h"

namespace loco::data::detail {

struct SpmLibrary {
  decltype(&loco_spm_train) train;
  decltype(&loco_spm_load) load;
  decltype(&loco_spm_destroy) destroy;
  decltype(&loco_spm_encode) encode;
  decltype(&loco_spm_decode) decode;
  decltype(&loco_spm_info) info;
  decltype(&loco_spm_free) free;
};

// The library, loaded on first use (thread-safe). Looked up in $LOCO_SPM_LIBRARY, next to the
// running executable, then at its build-tree path. Throws Error naming the paths tried.
const SpmLibrary& spm_library();

}  // namespace loco::data::detail
