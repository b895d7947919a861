// One process at a time in a directory: an exclusive flock on DIR/.kvshift.lock
// for the owner's lifetime. A second `kvshift train` on the same run directory
// is refused at once, naming the holder's pid, instead of two trainers writing
// the same checkpoints and metrics.jsonl. The kernel drops the lock when its
// process dies (a kill -9 leaves at most the empty file, which the next owner
// takes over). Where the file system has no flock (some network file systems)
// the lock is skipped with a warning.
#pragma once
#include <string>

namespace kvs {

class DirLock {
 public:
  // Throws kvs::Error naming `dir` and the holder when another process has it.
  explicit DirLock(const std::string& dir);
  ~DirLock();  // removes the file, then releases the lock
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  static constexpr const char* kFileName = ".kvshift.lock";

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace kvs
