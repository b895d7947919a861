// Pre-tokenized token shards (see docs/FORMATS.md). A shard file is a 32-byte
// header followed by the tokens, little-endian:
//   bytes 0..7   magic "KVSTOKS\0"
//   bytes 8..11  u32 version (1)
//   bytes 12..15 u32 bytes per token (2 = u16, 4 = u32)
//   bytes 16..23 u64 token count
//   bytes 24..31 reserved (0)
// Readers memory-map the file and check the size against the header.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvs {

struct ShardHeader {
  uint32_t version = 1;
  uint32_t token_bytes = 2;
  uint64_t count = 0;
};

// Writes a shard atomically. token_bytes 2 requires every token < 65536.
void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, uint32_t token_bytes);

// A read-only memory-mapped shard.
class ShardFile {
 public:
  explicit ShardFile(const std::string& path);  // throws kvs::Error naming the path on bad magic/version/size
  ~ShardFile();
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;
  uint64_t size() const { return header_.count; }
  uint32_t token(uint64_t i) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  ShardHeader header_;
  const uint8_t* map_ = nullptr;
  size_t map_len_ = 0;
};

}  // namespace kvs
