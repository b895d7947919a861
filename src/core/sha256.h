// SHA-256 (FIPS 180-4), for manifests and the tokenizer's model hash; small
// enough to keep in-tree rather than depend on OpenSSL.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvs {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::string hex();  // finalizes; the object must not be updated afterwards

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view data);
// Streams the file; throws kvs::Error("<path>: cannot read: ...").
std::string sha256_file(const std::string& path);

}  // namespace kvs
