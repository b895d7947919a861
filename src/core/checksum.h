// Fast whole-file checksums for checkpoint manifests: XXH3-64 from the
// packaged xxHash library (Debian: libxxhash-dev), several GB/s on one core,
// so verifying a checkpoint costs about as much as reading it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvs {

struct FileDigest {
  uint64_t bytes = 0;
  std::string xxh3;  // 16 lower-case hex digits
};

// Reads `path` in chunks; throws kvs::Error("<path>: cannot read: <reason>").
FileDigest digest_file(const std::string& path);
// The same digest of a buffer.
std::string xxh3_hex(const void* data, size_t size);

}  // namespace kvs
