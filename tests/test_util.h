// Helpers shared by loco's tests: where the build and the sources are, unique temporary folders and
// error-message checks.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

namespace loco::testing_util {

namespace fs = std::filesystem;

// The build folder this test binary belongs to: the nearest folder above it holding CMakeCache.txt
// (build/tests/test_cli -> build). Found at run time rather than compiled in, so that a test's object
// file is the same in every clone and a second clone's build hits ccache (docs/benchmarks.md, "Build").
inline const fs::path& build_dir() {
  static const fs::path dir = [] {
    const fs::path exe = fs::read_symlink("/proc/self/exe");
    for (fs::path d = exe.parent_path(); !d.empty(); d = d.parent_path()) {
      if (fs::exists(d / "CMakeCache.txt")) return d;
      if (d == d.root_path()) break;
    }
    throw std::runtime_error("[tests] no CMakeCache.txt in any folder above " + exe.string() +
                             ": run the tests from their build folder (ctest in build/)");
  }();
  return dir;
}

// The source tree the build was configured from (CMAKE_HOME_DIRECTORY in the build's cache).
inline const fs::path& source_dir() {
  static const fs::path dir = [] {
    std::ifstream cache(build_dir() / "CMakeCache.txt");
    const std::string key = "CMAKE_HOME_DIRECTORY:INTERNAL=";
    for (std::string line; std::getline(cache, line);) {
      if (line.rfind(key, 0) == 0) return fs::path(line.substr(key.size()));
    }
    throw std::runtime_error("[tests] " + (build_dir() / "CMakeCache.txt").string() + " names no CMAKE_HOME_DIRECTORY");
  }();
  return dir;
}

// The `loco` binary of this build.
inline const std::string& loco_binary() {
  static const std::string path = (build_dir() / "loco").string();
  return path;
}

// A fresh folder under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "loco";
    path_ = fs::temp_directory_path() / ("loco-test-" + name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const fs::path& p) const { return path_ / p; }

 private:
  fs::path path_;
};

// Expects `fn` to throw E whose message contains `fragment`.
template <class E>
void expect_error(const std::function<void()>& fn, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception mentioning '" << fragment << "', none was thrown";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << fragment << "'";
  }
}

}  // namespace loco::testing_util
