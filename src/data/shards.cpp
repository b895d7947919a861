// Token shards: atomic writer and memory-mapped reader (format in shards.h and docs/DATA.md).
#include "data/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace kvs {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'T', 'O', 'K', 'S', '\0'};
constexpr uint64_t kHeaderBytes = 32;
constexpr uint32_t kVersion = 1;

void put_le(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const uint8_t* data, size_t len, const std::string& tmp) {
  while (len > 0) {
    const ssize_t n = ::write(fd, data, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("{}: write failed: {}", tmp, errno_text());
    data += n;
    len -= static_cast<size_t>(n);
  }
}

}  // namespace

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, uint32_t token_bytes) {
  KVS_CHECK(token_bytes == 2 || token_bytes == 4, "{}: token_bytes must be 2 or 4 (got {})", path, token_bytes);
  if (token_bytes == 2) {
    for (size_t i = 0; i < tokens.size(); ++i)
      KVS_CHECK(tokens[i] < 65536u, "{}: token {} at position {} does not fit in u16 shards (token_bytes 2); use 4",
                path, tokens[i], i);
  }
  std::vector<uint8_t> buf(kHeaderBytes + tokens.size() * token_bytes, 0);
  std::memcpy(buf.data(), kMagic, 8);
  put_le(buf.data() + 8, kVersion, 4);
  put_le(buf.data() + 12, token_bytes, 4);
  put_le(buf.data() + 16, tokens.size(), 8);
  uint8_t* p = buf.data() + kHeaderBytes;
  for (size_t i = 0; i < tokens.size(); ++i) put_le(p + i * token_bytes, tokens[i], static_cast<int>(token_bytes));

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("{}: cannot create {}: {}", path, tmp, errno_text());
  try {
    write_all(fd, buf.data(), buf.size(), tmp);
    if (::fsync(fd) != 0) fail("{}: fsync failed: {}", tmp, errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail("{}: close failed: {}", tmp, errno_text());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    fail("{}: cannot rename {} into place: {}", path, tmp, why);
  }
  // Make the rename durable: fsync the directory (best effort).
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

ShardFile::ShardFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open shard: {}", path, errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    fail("{}: cannot stat shard: {}", path, why);
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kHeaderBytes) {
    ::close(fd);
    fail("{}: not a token shard: {} bytes, shorter than the 32-byte header", path, file_size);
  }
  void* m = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  const std::string why = errno_text();
  ::close(fd);
  // Each open shard is one mapping for the whole run: tens of thousands of
  // files reach the kernel's per-process limit (vm.max_map_count, 65530 by default).
  if (m == MAP_FAILED)
    fail("{}: mmap failed: {}{}", path, why,
         err == ENOMEM ? " (one mapping per shard file: with tens of thousands of shards, raise vm.max_map_count or "
                         "prepare fewer, larger shards with --shard-tokens)"
                       : "");
  map_ = static_cast<const uint8_t*>(m);
  map_len_ = file_size;

  try {
    KVS_CHECK(std::memcmp(map_, kMagic, 8) == 0, "{}: not a token shard (bad magic, expected \"KVSTOKS\\0\")", path);
    header_.version = static_cast<uint32_t>(get_le(map_ + 8, 4));
    header_.token_bytes = static_cast<uint32_t>(get_le(map_ + 12, 4));
    header_.count = get_le(map_ + 16, 8);
    KVS_CHECK(header_.version == kVersion, "{}: unsupported shard version {} (this build reads version {})", path,
              header_.version, kVersion);
    KVS_CHECK(header_.token_bytes == 2 || header_.token_bytes == 4,
              "{}: bad bytes per token {} in the shard header (must be 2 or 4)", path, header_.token_bytes);
    const unsigned __int128 expected =
        static_cast<unsigned __int128>(header_.count) * header_.token_bytes + kHeaderBytes;
    KVS_CHECK(expected == file_size,
              "{}: file size {} does not match the header ({} tokens x {} bytes + 32 header bytes): truncated or "
              "corrupt shard",
              path, file_size, header_.count, header_.token_bytes);
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), map_len_);
    map_ = nullptr;
    throw;
  }
}

ShardFile::~ShardFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_len_);
}

uint32_t ShardFile::token(uint64_t i) const {
  KVS_CHECK(i < header_.count, "{}: token index {} out of range ({} tokens)", path_, i, header_.count);
  const uint8_t* p = map_ + kHeaderBytes + i * header_.token_bytes;
  return static_cast<uint32_t>(get_le(p, static_cast<int>(header_.token_bytes)));
}

}  // namespace kvs
