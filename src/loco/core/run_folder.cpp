#include "loco/core/run_folder.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "loco/core/error.h"

namespace loco {

namespace fs = std::filesystem;

bool RunFolder::unstarted() const {
  std::error_code error;
  for (fs::directory_iterator it(dir_, error), end; !error && it != end; it.increment(error)) {
    if (it->path() != join_token() && it->path() != lock()) return false;
  }
  return !error && fs::is_directory(dir_, error);
}

void RunFolder::check_new_run(std::string_view module) const {
  std::error_code error;
  if (!fs::exists(dir_, error)) return;
  if (!fs::is_directory(dir_, error)) {
    throw ConfigError(module, fmt::format("run.dir {} exists and is not a folder; choose another --run.dir", dir_.string()));
  }
  if (!fs::is_empty(dir_, error) && !unstarted()) {
    throw ConfigError(module, fmt::format("run.dir {} already holds a run; pass --resume to continue it, or choose another "
                                          "--run.dir (nothing was overwritten)", dir_.string()));
  }
}

RunLock RunLock::acquire(const fs::path& dir, std::string_view module, std::string_view command) {
  std::error_code error;
  if (fs::exists(dir, error) && !fs::is_directory(dir, error)) {
    throw ConfigError(module, fmt::format("run.dir {} exists and is not a folder; choose another --run.dir", dir.string()));
  }
  fs::create_directories(dir, error);
  if (error) throw Error(module, fmt::format("cannot create run.dir {}: {}", dir.string(), error.message()));
  const auto file = RunFolder(dir).lock();
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw Error(module, fmt::format("cannot open {}: {}", file.string(),
                                    errno == ELOOP ? "it is a symbolic link, which loco does not follow" : std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int why = errno;
    std::string holder(512, '\0');
    const auto n = ::pread(fd, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd);
    if (why != EWOULDBLOCK) throw Error(module, fmt::format("cannot lock {}: {}", file.string(), std::strerror(why)));
    throw ConfigError(module, fmt::format("run.dir {} is in use by another process ({}); wait for it to end or stop it, or "
                                          "choose another --run.dir (nothing was written)",
                                          dir.string(), holder.empty() ? "it has not said which yet" : holder));
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const auto since = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
  const auto text = fmt::format("pid {} on {}: {}, since {} (Unix time)\n", ::getpid(), host, command, since.count());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int why = errno;
    ::close(fd);
    throw Error(module, fmt::format("cannot write {}: {}", file.string(), std::strerror(why)));
  }
  return RunLock(fd);
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays, naming the last holder
}

}  // namespace loco
