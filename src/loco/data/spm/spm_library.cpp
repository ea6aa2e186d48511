#include "loco/data/spm/spm_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "loco/core/environment.h"
#include "loco/core/error.h"

namespace loco::data::detail {
namespace {

SpmLibrary load_library() {
  std::vector<std::string> candidates;
  if (auto path = read_environment().spm_library) candidates.push_back(trusted_file(*path, "LOCO_SPM_LIBRARY").string());
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back((exe.parent_path() / "libloco_spm.so").string());
#ifdef LOCO_SPM_LIBRARY_PATH
  candidates.emplace_back(LOCO_SPM_LIBRARY_PATH);
#endif
  std::string errors;
  for (const auto& path : candidates) {
    if (!std::filesystem::exists(path, ec)) {
      errors += "\n  " + path + ": no such file";
      continue;
    }
    // RTLD_DEEPBIND: SentencePiece resolves to its own bundled protobuf, not libtorch's.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == nullptr) {
      errors += "\n  " + path + ": " + ::dlerror();
      continue;
    }
    auto symbol = [&](const char* name) {
      void* s = ::dlsym(handle, name);
      if (s == nullptr) throw Error("data", fmt::format("{}: missing symbol {}", path, name));
      return s;
    };
    SpmLibrary lib;
    lib.train = reinterpret_cast<decltype(lib.train)>(symbol("loco_spm_train"));
    lib.load = reinterpret_cast<decltype(lib.load)>(symbol("loco_spm_load"));
    lib.destroy = reinterpret_cast<decltype(lib.destroy)>(symbol("loco_spm_destroy"));
    lib.encode = reinterpret_cast<decltype(lib.encode)>(symbol("loco_spm_encode"));
    lib.decode = reinterpret_cast<decltype(lib.decode)>(symbol("loco_spm_decode"));
    lib.info = reinterpret_cast<decltype(lib.info)>(symbol("loco_spm_info"));
    lib.free = reinterpret_cast<decltype(lib.free)>(symbol("loco_spm_free"));
    return lib;
  }
  throw Error("data", fmt::format("cannot load the SentencePiece library libloco_spm.so; tried:{}\n"
                                  "hint: it is built next to the loco binary; set LOCO_SPM_LIBRARY to its path",
                                  errors));
}

}  // namespace

const SpmLibrary& spm_library() {
  // Immutable once loaded: the one process-wide object of the data module, and only a cache.
  static std::once_flag once;
  static SpmLibrary library;
  std::call_once(once, [] { library = load_library(); });
  return library;
}

}  // namespace loco::data::detail
