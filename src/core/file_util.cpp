// Whole-file reads and crash-safe whole-file writes; see file_util.h.
#include "core/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/file_descriptor.h"
#include "stratum/error.h"

namespace stratum {

namespace {
std::string errno_text() { return std::strerror(errno); }

std::string parent_dir(const std::string& path) {
  auto parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

int file_open_read(const std::string& path) {
  // O_NONBLOCK: opening a FIFO that has no writer returns at once (a plain open waits for one), so
  // the caller's regular-file check refuses it instead of hanging. The flag is cleared again for a
  // regular file: io_uring would honour it and fail reads with EAGAIN.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat st {};
  if (fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string file_read_all(const std::string& path) {
  FileDescriptor fd(file_open_read(path));
  STRATUM_CHECK(fd.get() >= 0, "[file] cannot open '", path, "': ", errno_text());
  struct stat st {};
  STRATUM_CHECK(::fstat(fd.get(), &st) == 0, "[file] cannot stat '", path, "': ", errno_text());
  STRATUM_CHECK(!S_ISDIR(st.st_mode), "[file] '", path, "' is a directory, expected a file");
  STRATUM_CHECK(S_ISREG(st.st_mode), "[file] '", path, "' is not a regular file (a device, pipe or socket); give a file");
  // Read to the end, not to st_size: /proc and /sys files say 0 bytes and still hold text.
  std::string out;
  out.resize(static_cast<std::size_t>(st.st_size) + 1);
  std::size_t done = 0;
  for (;;) {
    if (done == out.size()) out.resize(std::max<std::size_t>(2 * out.size(), 4096));
    ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    STRATUM_CHECK(n >= 0, "[file] read error on '", path, "': ", errno_text());
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  out.resize(done);
  return out;
}

bool file_is_special(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

std::uint64_t file_size_bytes(const std::string& path) {
  struct stat st {};
  STRATUM_CHECK(::stat(path.c_str(), &st) == 0, "[file] cannot stat '", path, "': ", errno_text());
  return static_cast<std::uint64_t>(st.st_size);
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string file_read_problem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return "does not exist";
    if (errno == ELOOP) return "is a symbolic link loop";
    return std::string("cannot be read: ") + errno_text();
  }
  if (S_ISDIR(st.st_mode)) return "is a directory";
  if (!S_ISREG(st.st_mode)) return "is not a regular file (a device, pipe or socket)";
  FileDescriptor fd(file_open_read(path));
  if (fd.get() < 0) return std::string("cannot be read: ") + errno_text();
  return "";
}

bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  std::error_code ec;
  const auto ca = std::filesystem::weakly_canonical(a, ec), cb = std::filesystem::weakly_canonical(b, ec);
  return !ec && ca == cb;
}

std::size_t dir_free_bytes(const std::string& dir, const char* what) {
  struct statvfs fs {};
  STRATUM_CHECK(::statvfs(dir.c_str(), &fs) == 0, "[file] cannot stat ", what, " ", dir, ": ", std::strerror(errno));
  return static_cast<std::size_t>(fs.f_bavail) * fs.f_frsize;
}

bool dir_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void dir_fsync(const std::string& path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  STRATUM_CHECK(fd.get() >= 0, "[file] cannot open directory '", path, "': ", errno_text());
  STRATUM_CHECK(::fsync(fd.get()) == 0, "[file] fsync of directory '", path, "' failed: ", errno_text());
}

void dir_create(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  STRATUM_CHECK(!ec && dir_exists(path), "[file] cannot create directory '", path,
                "': ", ec ? ec.message() : "exists and is not a directory");
}

FileFault file_fault_parse(const std::string& text) {
  const std::size_t at = text.find('@');
  STRATUM_CHECK(at != std::string::npos && at + 1 < text.size(), "[file] STRATUM_FILE_FAULT '", text.substr(0, 60),
                "' must be KIND@TEXT (KIND enospc, eio or kill)");
  const std::string kind = text.substr(0, at);
  FileFault fault;
  fault.match = text.substr(at + 1);
  if (kind == "enospc") fault.kind = FileFault::Kind::Enospc;
  else if (kind == "eio") fault.kind = FileFault::Kind::Eio;
  else if (kind == "kill") fault.kind = FileFault::Kind::Kill;
  else STRATUM_FAIL("[file] STRATUM_FILE_FAULT kind '", kind.substr(0, 20), "' is not enospc, eio or kill");
  return fault;
}

namespace {
const FileFault& file_fault() {
  static const FileFault fault = [] {
    const char* text = std::getenv("STRATUM_FILE_FAULT");
    return text == nullptr || *text == 0 ? FileFault{} : file_fault_parse(text);
  }();
  return fault;
}
}  // namespace

void file_write_atomic(const std::string& path_in,
                       const std::function<void(const ByteSink&)>& writer) {
  // A device, pipe or socket is never replaced by a file (report --out /dev/full made it one);
  // a symbolic link is written through: its target is replaced, the link stays.
  STRATUM_CHECK(!file_is_special(path_in), "[file] '", path_in, "' is a device, pipe or socket; give a file path");
  std::string path = path_in;
  struct stat lst {};
  for (int hops = 0; ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode); ++hops) {  // a dangling one too
    std::error_code ec;
    std::filesystem::path target = std::filesystem::read_symlink(path, ec);
    STRATUM_CHECK(!ec && hops < 40, "[file] cannot follow the symbolic link '", path_in, "': ",
                  ec ? ec.message() : "too many levels");
    if (target.is_relative()) target = std::filesystem::path(path).parent_path() / target;
    path = target.lexically_normal().string();
  }
  const FileFault& fault = file_fault();
  const bool faulty = fault.kind != FileFault::Kind::None && path.find(fault.match) != std::string::npos;
  std::size_t written = 0;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FileDescriptor fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  STRATUM_CHECK(fd.get() >= 0, "[file] cannot create '", tmp, "': ", errno_text(),
                " (is the directory writable?)");
  auto inject = [&] {
    if (fault.kind == FileFault::Kind::Kill) ::raise(SIGKILL);  // a crash mid-write
    errno = fault.kind == FileFault::Kind::Enospc ? ENOSPC : EIO;
    STRATUM_FAIL("[file] write to '", tmp, "' failed: ", errno_text(), " (injected by STRATUM_FILE_FAULT)");
  };
  try {
    writer([&](const void* data, std::size_t size) {
      const char* p = static_cast<const char*>(data);
      while (size > 0) {
        if (faulty && written >= 4096) inject();
        ssize_t n = ::write(fd.get(), p, faulty ? std::min<std::size_t>(size, 4096 - written % 4096) : size);
        if (n < 0 && errno == EINTR) continue;
        STRATUM_CHECK(n > 0, "[file] write to '", tmp, "' failed: ", errno_text());
        p += n;
        written += static_cast<std::size_t>(n);
        size -= static_cast<std::size_t>(n);
      }
    });
    if (faulty) inject();  // a file smaller than 4 KiB fails before its fsync
    STRATUM_CHECK(::fsync(fd.get()) == 0, "[file] fsync of '", tmp, "' failed: ", errno_text());
    int raw = fd.release();
    STRATUM_CHECK(::close(raw) == 0, "[file] close of '", tmp, "' failed: ", errno_text());
    STRATUM_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "[file] cannot rename '", tmp,
                  "' to '", path, "': ", errno_text());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  dir_fsync(parent_dir(path));
}

void file_write_atomic(const std::string& path, const std::string& contents) {
  file_write_atomic(path, [&](const ByteSink& sink) { sink(contents.data(), contents.size()); });
}

FileUnlinkGuard::~FileUnlinkGuard() { ::unlink(path_.c_str()); }

}  // namespace stratum
