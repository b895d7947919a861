// SHA-256 for manifests and the tokenizer's model hash, computed by OpenSSL's
// libcrypto (EVP API), which uses the CPU's SHA extensions where it has them.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX, kept out of this header

namespace kvs {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::string hex();  // finalizes; the object must not be updated afterwards

 private:
  struct FreeCtx {
    void operator()(evp_md_ctx_st* c) const;
  };
  std::unique_ptr<evp_md_ctx_st, FreeCtx> ctx_;
};

std::string sha256_hex(std::string_view data);
// Streams the file; throws kvs::Error("<path>: cannot read: ...").
std::string sha256_file(const std::string& path);

}  // namespace kvs
