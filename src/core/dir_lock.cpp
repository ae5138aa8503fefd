// DirLock; see dir_lock.h.
#include "core/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "stratum/error.h"

namespace stratum {

DirLock::DirLock(const std::string& dir, const std::string& name, const std::string& busy) : path_(dir + "/" + name) {
  // The lock file is removed when its holder finishes, so a process that opened it just before
  // that would lock a deleted inode; re-open until the locked file is the one at the path.
  for (int attempt = 0;; ++attempt) {
    fd_ = FileDescriptor(::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    STRATUM_CHECK(fd_.get() >= 0, "cannot create ", path_, ": ", std::strerror(errno));
    if (::flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
      fd_ = FileDescriptor();
      STRATUM_FAIL(busy);
    }
    struct stat held {}, at_path {};
    if (::fstat(fd_.get(), &held) == 0 && ::stat(path_.c_str(), &at_path) == 0 && held.st_ino == at_path.st_ino &&
        held.st_dev == at_path.st_dev)
      return;
    if (attempt >= 10) {
      fd_ = FileDescriptor();
      STRATUM_FAIL("cannot lock ", dir, ": its lock file ", name, " keeps changing");
    }
  }
}

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    fd_ = std::move(other.fd_);
  }
  return *this;
}

void DirLock::release() {
  if (fd_.get() < 0) return;
  ::unlink(path_.c_str());  // while still locked: a waiting process then re-opens a fresh file
  fd_ = FileDescriptor();
}

}  // namespace stratum
