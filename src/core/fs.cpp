#include "core/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace kvs {
namespace {

std::string errno_str(int e) { return std::strerror(e); }

std::string parent_dir(const std::string& path) {
  std::filesystem::path p(path);
  std::filesystem::path parent = p.parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// Closes the fd on scope exit unless released.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int release() {
    int f = fd;
    fd = -1;
    return f;
  }
};

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    // Linux writes at most ~2 GiB per call; chunk explicitly.
    size_t chunk = size < (size_t(1) << 30) ? size : (size_t(1) << 30);
    ssize_t n = ::write(fd, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("{}: cannot write: {}", path, errno_str(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

void atomic_write_file_stream(const std::string& path, const std::function<void(const ByteSink&)>& produce) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int raw = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (raw < 0) fail("{}: cannot write: cannot create temp file {}: {}", path, tmp, errno_str(errno));
  Fd fd(raw);
  try {
    ByteSink sink = [&](const void* data, size_t size) { write_all(fd.fd, data, size, path); };
    produce(sink);
    if (::fsync(fd.fd) != 0) fail("{}: cannot write: fsync failed: {}", path, errno_str(errno));
    int f = fd.release();
    if (::close(f) != 0) fail("{}: cannot write: close failed: {}", path, errno_str(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      fail("{}: cannot write: rename from {} failed: {}", path, tmp, errno_str(errno));
  } catch (...) {
    if (fd.fd >= 0) ::close(fd.release());
    ::unlink(tmp.c_str());
    throw;
  }
  // The data is durable under its final name only once the directory entry is.
  fsync_path(parent_dir(path));
}

void atomic_write_file(const std::string& path, std::string_view data) {
  atomic_write_file_stream(path, [&](const ByteSink& sink) { sink(data.data(), data.size()); });
}

void fsync_path(const std::string& path) {
  int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) fail("{}: cannot open for fsync: {}", path, errno_str(errno));
  Fd fd(raw);
  if (::fsync(fd.fd) != 0) {
    // Some file systems do not support fsync on directories; that is not an error.
    if (errno != EINVAL && errno != ENOTSUP) fail("{}: fsync failed: {}", path, errno_str(errno));
  }
}

std::string read_file(const std::string& path) {
  int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) fail("{}: cannot read: {}", path, errno_str(errno));
  Fd fd(raw);
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) fail("{}: cannot read: {}", path, errno_str(errno));
  if (S_ISDIR(st.st_mode)) fail("{}: cannot read: {}", path, errno_str(EISDIR));
  std::string out;
  if (S_ISREG(st.st_mode) && st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd.fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("{}: cannot read: {}", path, errno_str(errno));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

void make_dirs(const std::string& path) {
  std::error_code ec;
  // A dangling link (scratch storage not mounted) would otherwise read "File exists".
  if (std::filesystem::is_symlink(path, ec) && !std::filesystem::exists(path, ec))
    fail("{}: cannot create directory: it is a symbolic link to {}, which does not exist", path,
         std::filesystem::read_symlink(path, ec).string());
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_directory(path, ec))
    fail("{}: cannot create directory: a file of that name is in the way", path);
  std::filesystem::create_directories(path, ec);
  if (ec) fail("{}: cannot create directory: {}", path, ec.message());
  if (!std::filesystem::is_directory(path, ec)) fail("{}: cannot create directory: not a directory", path);
}

}  // namespace kvs
