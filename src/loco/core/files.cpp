#include "loco/core/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "loco/core/error.h"

namespace loco {
namespace {

std::string reason(int err) {
  if (err == ENOSPC) return "no space left on the device (the disk is full)";
  if (err == EDQUOT) return "disk quota exceeded";
  return std::strerror(err);
}

void write_all(int fd, std::string_view bytes, const fs::path& path, std::string_view module) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(module, fmt::format("{}: write failed: {}", path.string(), reason(errno)));
    }
    done += static_cast<size_t>(n);
  }
}

uint64_t random_u64() {
  static thread_local std::mt19937_64 generator{(uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()};
  return generator();
}

}  // namespace

bool plain_file_name(std::string_view name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string read_file(const fs::path& path, std::string_view module) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw DataError(module, fmt::format("{}: no such file", path.string()));
  if (fs::is_directory(path, ec)) throw DataError(module, fmt::format("{}: is a folder, expected a file", path.string()));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(module, fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) throw DataError(module, fmt::format("{}: read failed", path.string()));
  return std::move(out).str();
}

void sync_directory(const fs::path& dir, std::string_view module) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw Error(module, fmt::format("{}: cannot open folder: {}", dir.string(), std::strerror(errno)));
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const fs::path& path, std::string_view bytes, std::string_view module, Readers readers) {
  fs::path parent = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw Error(module, fmt::format("{}: cannot create folder: {}", parent.string(), ec.message()));
  // Named by host, process and a random number: writers on several machines may share the folder
  // (DiPaCo's run folder), and nobody can plant a link at a name they cannot guess; created anew
  // (O_EXCL), never through a link (O_NOFOLLOW), with the mode `readers` says.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  fs::path tmp = path;
  tmp += fmt::format(".tmp.{}.{}.{:016x}", host, ::getpid(), random_u64());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                  readers == Readers::kOwner ? 0600 : 0644);
  if (fd < 0) throw Error(module, fmt::format("{}: cannot create: {}", tmp.string(), reason(errno)));
  try {
    write_all(fd, bytes, tmp, module);
    if (::fsync(fd) != 0) throw Error(module, fmt::format("{}: fsync failed: {}", tmp.string(), reason(errno)));
  } catch (...) {
    ::close(fd);
    fs::remove(tmp, ec);
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    fs::remove(tmp, ec);
    throw Error(module, fmt::format("{}: rename failed: {}", path.string(), reason(err)));
  }
  sync_directory(parent, module);
}

LineAppender::LineAppender(const fs::path& path, std::string_view module) : path_(path), module_(module) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(module, fmt::format("{}: cannot open for appending: {}", path.string(), reason(errno)));
}

LineAppender::LineAppender(LineAppender&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), module_(std::move(other.module_)) {
  other.fd_ = -1;
}

LineAppender& LineAppender::operator=(LineAppender&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    module_ = std::move(other.module_);
    other.fd_ = -1;
  }
  return *this;
}

LineAppender::~LineAppender() {
  if (fd_ >= 0) ::close(fd_);
}

void LineAppender::append(std::string_view line) {
  LOCO_CHECK(fd_ >= 0, "append to a closed LineAppender");
  std::string buffer(line);
  buffer.push_back('\n');
  // One write() per line: with O_APPEND, lines from one process never interleave mid-line.
  write_all(fd_, buffer, path_, module_);
}

}  // namespace loco
