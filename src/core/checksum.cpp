#include "core/checksum.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace kvs {
namespace {

std::string hex(XXH64_hash_t h) { return fmt::format("{:016x}", static_cast<uint64_t>(h)); }

}  // namespace

std::string xxh3_hex(const void* data, size_t size) { return hex(XXH3_64bits(data, size)); }

FileDigest digest_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot read: {}", path, std::strerror(errno));
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> st(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(st.get());
  std::vector<char> buf(size_t{4} << 20);
  FileDigest d;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      fail("{}: cannot read: {}", path, std::strerror(e));
    }
    if (n == 0) break;
    XXH3_64bits_update(st.get(), buf.data(), static_cast<size_t>(n));
    d.bytes += static_cast<uint64_t>(n);
  }
  ::close(fd);
  d.xxh3 = hex(XXH3_64bits_digest(st.get()));
  return d;
}

}  // namespace kvs
