// Whole-file reads and crash-safe whole-file writes (temporary name, fsync, rename, fsync dir).
// Does not do streaming or async I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace stratum {

// open(path, O_RDONLY | O_CLOEXEC) that never waits: a FIFO with no writer opens at once (the
// caller's S_ISREG check then refuses it). Returns the descriptor, or -1 with errno set.
int file_open_read(const std::string& path);
// Reads the whole file (to its end: a /proc file's size says 0); throws stratum::Error naming
// the path on failure, and at once for a device, pipe or socket (a FIFO is never waited on).
std::string file_read_all(const std::string& path);
// Whether `path` exists and is neither a regular file nor a directory (a device, pipe or socket):
// outputs such as --log and --trace refuse it, as opening a FIFO would wait for a reader.
bool file_is_special(const std::string& path);

// Size in bytes of a regular file; throws if it does not exist.
std::uint64_t file_size_bytes(const std::string& path);

bool file_exists(const std::string& path);
// Why `path` cannot be read as a regular file, as the end of a sentence naming it ("does not
// exist", "is a directory", "is a symbolic link loop", "is not a regular file (a device, pipe or
// socket)", "cannot be read: Permission denied"); empty when it can be.
std::string file_read_problem(const std::string& path);
bool dir_exists(const std::string& path);
// Whether two paths name the same file: the same inode when both exist (links and different
// spellings included), else the same normalized absolute path.
bool same_file(const std::string& a, const std::string& b);
// Bytes an unprivileged writer may still use on the file system holding `dir` (statvfs); throws
// Error naming `what` (e.g. "--offload-dir") and dir when it cannot be read.
std::size_t dir_free_bytes(const std::string& dir, const char* what);

// Writes `path` atomically: `writer` is called with a callback that appends bytes to
// "<path>.tmp.<pid>"; the file is fsynced, renamed over `path` and the directory fsynced.
// On any error the temporary is removed and `path` is left as it was.
using ByteSink = std::function<void(const void* data, std::size_t size_bytes)>;
void file_write_atomic(const std::string& path, const std::function<void(const ByteSink&)>& writer);
void file_write_atomic(const std::string& path, const std::string& contents);

// Test hook for the writes above: STRATUM_FILE_FAULT="KIND@TEXT" makes file_write_atomic fail on
// any path containing TEXT once 4 KiB of it are written (a smaller file: once all of it is): KIND enospc or eio fails the write with
// that error (a full disk, a write error), kill raises SIGKILL (a crash in the middle of a file).
struct FileFault {
  enum class Kind { None, Enospc, Eio, Kill } kind = Kind::None;
  std::string match;
};
FileFault file_fault_parse(const std::string& text);  // throws Error for a malformed value

// fsync a directory (after renames inside it).
void dir_fsync(const std::string& path);

// Creates a directory and its parents if missing; throws naming the path on failure.
void dir_create(const std::string& path);

// Removes the file at `path` when it goes out of scope (scratch and probe files); ignores errors.
class FileUnlinkGuard {
 public:
  explicit FileUnlinkGuard(std::string path) : path_(std::move(path)) {}
  FileUnlinkGuard(const FileUnlinkGuard&) = delete;
  FileUnlinkGuard& operator=(const FileUnlinkGuard&) = delete;
  ~FileUnlinkGuard();

 private:
  std::string path_;
};

}  // namespace stratum
