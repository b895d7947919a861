#include "core/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"

namespace kvs {

namespace {

// The pid the holder wrote into the file ("" if none could be read).
std::string holder_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

DirLock::DirLock(const std::string& dir) : path_(dir + "/" + kFileName) {
  // The file is removed when released: a process that opened it just before that
  // holds a lock on a removed file, so a lock counts only while the path still
  // names the locked file (checked after locking; otherwise try again).
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    KVS_CHECK(fd >= 0, "{}: cannot create the run directory's lock file: {}", path_, std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        const std::string pid = holder_pid(fd);
        ::close(fd);
        fail("{}: another kvshift train{} is using this run directory; wait for it to end or stop it{}, or use "
             "another --run-dir",
             dir, pid.empty() ? "" : " (pid " + pid + ")",
             pid.empty() ? "" : " (kill -TERM " + pid + " stops it after a checkpoint)");
      }
      ::close(fd);
      spdlog::warn("{}: no lock on the run directory ({}): this file system has no flock; do not start a second "
                   "run on it",
                   path_, std::strerror(err));
      return;
    }
    struct stat held {}, named {};
    if (::fstat(fd, &held) == 0 && ::stat(path_.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino) {
      const std::string pid = fmt::format("{}\n", ::getpid());
      if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
        spdlog::warn("{}: cannot write this process's pid into the lock file", path_);
      fd_ = fd;
      return;
    }
    ::close(fd);  // the file was removed (or replaced) as we locked it: take the current one
  }
  fail("{}: the run directory's lock file keeps changing; is another process removing it?", path_);
}

DirLock::~DirLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // before releasing: the next owner then creates a new file
  ::close(fd_);
}

}  // namespace kvs
