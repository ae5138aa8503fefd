// An exclusive lock on a directory for one process's use of it: flock(2) on a lock file inside
// it, held for the object's life (and by the kernel only while the process lives, so a crashed
// run never leaves a stale lock). Released on destruction or release(), which also removes the
// lock file. Used for --offload-dir (the store) and --save (the checkpoint root).
#pragma once

#include <string>

#include "core/file_descriptor.h"

namespace stratum {

class DirLock {
 public:
  DirLock() = default;
  // Locks dir/name. Throws Error with `busy` when another process holds it, and a one-line error
  // naming the file when it cannot be created.
  DirLock(const std::string& dir, const std::string& name, const std::string& busy);
  DirLock(DirLock&&) = default;
  DirLock& operator=(DirLock&& other) noexcept;
  ~DirLock() { release(); }
  bool held() const { return fd_.get() >= 0; }
  void release();  // removes the lock file, then unlocks

 private:
  std::string path_;
  FileDescriptor fd_;
};

}  // namespace stratum
