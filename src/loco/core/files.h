// Small, careful file helpers: every write that matters is atomic (temporary file, fsync, rename),
// and every failure names the file and the reason (a full disk included).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace loco {

namespace fs = std::filesystem;

// Whole file as bytes. Throws DataError("[module] <path>: <reason>") when it cannot be read.
std::string read_file(const fs::path& path, std::string_view module);

// A file under `root` (a run folder others may write into, as DiPaCo's workers share theirs), read
// without following a link anywhere below `root`: every folder of `relative` and the file itself
// are opened with O_NOFOLLOW, the file must be a regular one (not a device, a pipe or a folder)
// of at most `max_bytes`. `relative` may not be absolute nor hold "..". Throws DataError naming
// the path and what is wrong.
std::string read_file_beneath(const fs::path& root, const fs::path& relative, std::string_view module, uint64_t max_bytes);
// The last `max_bytes` of a regular file (all of it when smaller), opened with O_NOFOLLOW: where
// a long log's newest lines are. Throws DataError naming the path when it cannot be read.
std::string read_file_tail(const fs::path& path, uint64_t max_bytes, std::string_view module);
// The most a run folder's text file may hold (checkpoints' state.json, `latest`, coordinator.json,
// config.toml): what is larger was not written by loco, and is refused unread.
inline constexpr uint64_t kMaxRunTextBytes = uint64_t{64} << 20;

// Deletes the file `relative` under `root` without following a link below `root` (a link at the
// name itself is removed, not what it points to). One already gone, a path through a link and a
// malformed `relative` delete nothing; false then.
bool remove_file_beneath(const fs::path& root, const fs::path& relative);

// Who may read a file write_file_atomic writes: everyone (0644: data, tokenizers, reports,
// configs), or its owner only (0600: checkpoints and the coordinator's state, which hold the model
// and the run's membership).
enum class Readers { kEveryone, kOwner };

// Writes `bytes` to `path` atomically: a reader sees either the old file or the complete new one,
// never a torn write. Creates parent folders. Throws Error naming the path (ENOSPC included).
void write_file_atomic(const fs::path& path, std::string_view bytes, std::string_view module,
                       Readers readers = Readers::kEveryone);

// The same for a file written piece by piece (one larger than memory should hold at once): the
// pieces go to a new file beside `path`, which commit() makes `path` (fsync, rename, the folder's
// fsync); destroyed uncommitted, the new file is removed and `path` is untouched. Throws Error
// naming the file.
class AtomicFile {
 public:
  AtomicFile(fs::path path, std::string_view module, Readers readers = Readers::kEveryone);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();
  void write(std::string_view bytes);
  // Replaces bytes already written (a header whose checksum is known only at the end).
  void overwrite(uint64_t offset, std::string_view bytes);
  uint64_t size() const { return size_; }
  void commit();

 private:
  fs::path path_, tmp_;
  std::string module_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Whether `name` is one plain file name: 1 to 255 letters, digits, '.', '_' and '-', neither "."
// nor "..". Names that come from outside (a module's, the files a DiPaCo registry names) must be.
bool plain_file_name(std::string_view name);

// fsync a folder so that a rename inside it is durable.
void sync_directory(const fs::path& dir, std::string_view module);

// Appends lines to a file, flushing each one (for metrics.jsonl: a killed process loses at most the
// line being written). Throws Error naming the path on failure.
class LineAppender {
 public:
  LineAppender() = default;
  LineAppender(const fs::path& path, std::string_view module);
  LineAppender(LineAppender&& other) noexcept;
  LineAppender& operator=(LineAppender&& other) noexcept;
  LineAppender(const LineAppender&) = delete;
  LineAppender& operator=(const LineAppender&) = delete;
  ~LineAppender();
  void append(std::string_view line);
  bool is_open() const { return fd_ >= 0; }
  const fs::path& path() const { return path_; }

 private:
  int fd_ = -1;
  fs::path path_;
  std::string module_;
};

}  // namespace loco
