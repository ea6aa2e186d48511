#include "loco/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

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

namespace {

// A file descriptor closed with its owner.
class Descriptor {
 public:
  explicit Descriptor(int fd = -1) : fd_(fd) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor(Descriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Descriptor& operator=(Descriptor&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// The folder holding `relative`'s last part, opened beneath `root` one part at a time without
// following a link, and that last part's name; errno set and a closed descriptor on failure.
std::pair<Descriptor, std::string> open_parent_beneath(const fs::path& root, const fs::path& relative) {
  std::vector<std::string> parts;
  for (const auto& part : relative) {
    const auto name = part.string();
    if (name.empty() || name == ".") continue;
    if (name == ".." || part.is_absolute() || name == "/") {
      errno = EINVAL;
      return {Descriptor(), ""};
    }
    parts.push_back(name);
  }
  if (parts.empty()) {
    errno = EINVAL;
    return {Descriptor(), ""};
  }
  Descriptor dir(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  for (size_t i = 0; dir.get() >= 0 && i + 1 < parts.size(); ++i) {
    dir = Descriptor(::openat(dir.get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  }
  return {std::move(dir), parts.back()};
}

std::string beneath_reason(int err) {
  if (err == ELOOP || err == ENOTDIR) return "a link (or not a folder) on the way: links inside the run folder are not followed";
  if (err == EINVAL) return "not a path inside the run folder";
  return std::strerror(err);
}

}  // namespace

std::string read_file_beneath(const fs::path& root, const fs::path& relative, std::string_view module, uint64_t max_bytes) {
  const auto shown = (root / relative).string();
  if (relative.is_absolute()) throw DataError(module, fmt::format("{}: {}", shown, beneath_reason(EINVAL)));
  auto [dir, name] = open_parent_beneath(root, relative);
  if (dir.get() < 0) throw DataError(module, fmt::format("{}: cannot open: {}", shown, beneath_reason(errno)));
  // O_NONBLOCK: a pipe planted at the name must not hold the reader before fstat refuses it.
  Descriptor file(::openat(dir.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0) {
    const int err = errno;
    throw DataError(module, fmt::format("{}: {}", shown, err == ENOENT ? std::string("no such file") : "cannot open: " + beneath_reason(err)));
  }
  struct stat st {};
  if (::fstat(file.get(), &st) != 0) throw DataError(module, fmt::format("{}: cannot stat: {}", shown, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw DataError(module, fmt::format("{}: not a regular file", shown));
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    throw DataError(module, fmt::format("{}: {} bytes, more than the {} a file of this run can hold", shown, st.st_size, max_bytes));
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(file.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw DataError(module, fmt::format("{}: read failed: {}", shown, std::strerror(errno)));
    if (n == 0) throw DataError(module, fmt::format("{}: shorter than its size ({} of {} bytes): changed while read", shown, done, bytes.size()));
    done += static_cast<size_t>(n);
  }
  return bytes;
}

std::string read_file_tail(const fs::path& path, uint64_t max_bytes, std::string_view module) {
  Descriptor file(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0) throw DataError(module, fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  struct stat st {};
  if (::fstat(file.get(), &st) != 0) throw DataError(module, fmt::format("{}: cannot stat: {}", path.string(), std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw DataError(module, fmt::format("{}: not a regular file", path.string()));
  const auto size = static_cast<uint64_t>(st.st_size);
  const uint64_t from = size > max_bytes ? size - max_bytes : 0;
  std::string bytes(static_cast<size_t>(size - from), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pread(file.get(), bytes.data() + done, bytes.size() - done, static_cast<off_t>(from + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw DataError(module, fmt::format("{}: read failed: {}", path.string(), std::strerror(errno)));
    if (n == 0) break;  // cut while read: what was there
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

bool remove_file_beneath(const fs::path& root, const fs::path& relative) {
  if (relative.is_absolute()) return false;
  auto [dir, name] = open_parent_beneath(root, relative);
  return dir.get() >= 0 && ::unlinkat(dir.get(), name.c_str(), 0) == 0;
}

void sync_directory(const fs::path& dir, std::string_view module) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw Error(module, fmt::format("{}: cannot open folder: {}", dir.string(), std::strerror(errno)));
  ::fsync(fd);
  ::close(fd);
}

AtomicFile::AtomicFile(fs::path path, std::string_view module, Readers readers) : path_(std::move(path)), module_(module) {
  const fs::path parent = path_.parent_path().empty() ? fs::path(".") : path_.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw Error(module_, fmt::format("{}: cannot create folder: {}", parent.string(), ec.message()));
  // Named by host, process and a random number: writers on several machines may share the folder
  // (DiPaCo's run folder), and nobody can plant a link at a name they cannot guess; created anew
  // (O_EXCL), never through a link (O_NOFOLLOW), with the mode `readers` says.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  tmp_ = path_;
  tmp_ += fmt::format(".tmp.{}.{}.{:016x}", host, ::getpid(), random_u64());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, readers == Readers::kOwner ? 0600 : 0644);
  if (fd_ < 0) throw Error(module_, fmt::format("{}: cannot create: {}", tmp_.string(), reason(errno)));
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  std::error_code ec;
  fs::remove(tmp_, ec);
}

void AtomicFile::write(std::string_view bytes) {
  LOCO_CHECK(fd_ >= 0, "write to a committed AtomicFile");
  write_all(fd_, bytes, tmp_, module_);
  size_ += bytes.size();
}

void AtomicFile::overwrite(uint64_t offset, std::string_view bytes) {
  LOCO_CHECK(fd_ >= 0 && offset + bytes.size() <= size_, "overwrite past what was written");
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(module_, fmt::format("{}: write failed: {}", tmp_.string(), reason(errno)));
    done += static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  LOCO_CHECK(fd_ >= 0, "commit of a committed AtomicFile");
  if (::fsync(fd_) != 0) throw Error(module_, fmt::format("{}: fsync failed: {}", tmp_.string(), reason(errno)));
  ::close(fd_);
  fd_ = -1;
  std::error_code ec;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    fs::remove(tmp_, ec);
    throw Error(module_, fmt::format("{}: rename failed: {}", path_.string(), reason(err)));
  }
  sync_directory(path_.parent_path().empty() ? fs::path(".") : path_.parent_path(), module_);
}

void write_file_atomic(const fs::path& path, std::string_view bytes, std::string_view module, Readers readers) {
  AtomicFile file(path, module, readers);
  file.write(bytes);
  file.commit();
}

LineAppender::LineAppender(const fs::path& path, std::string_view module) : path_(path), module_(module) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  // Never through a link planted at the name (a run folder others write into): O_NOFOLLOW.
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw Error(module, fmt::format("{}: cannot open for appending: {}", path.string(),
                                    errno == ELOOP ? "it is a symbolic link, which loco does not follow" : reason(errno)));
  }
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
