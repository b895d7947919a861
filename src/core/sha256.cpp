#include "core/sha256.h"

#include <openssl/err.h>
#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace kvs {
namespace {

// OpenSSL's reason for the last failure on this thread, for the one-line error.
std::string openssl_reason() {
  char buf[256];
  const unsigned long e = ERR_get_error();
  if (e == 0) return "no OpenSSL error queued";
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

}  // namespace

void Sha256::FreeCtx::operator()(evp_md_ctx_st* c) const { EVP_MD_CTX_free(c); }

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_) fail("SHA-256: EVP_MD_CTX_new failed: {}", openssl_reason());
  if (EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
    fail("SHA-256: EVP_DigestInit_ex failed: {}", openssl_reason());
}

void Sha256::update(const void* data, size_t size) {
  if (EVP_DigestUpdate(ctx_.get(), data, size) != 1) fail("SHA-256: EVP_DigestUpdate failed: {}", openssl_reason());
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx_.get(), digest, &len) != 1)
    fail("SHA-256: EVP_DigestFinal_ex failed: {}", openssl_reason());
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out += digits[digest[i] >> 4];
    out += digits[digest[i] & 0xf];
  }
  return out;
}

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data);
  return h.hex();
}

std::string sha256_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("{}: cannot read: {}", path, std::strerror(errno));
  Sha256 h;
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.update(buf.data(), n);
  const bool bad = std::ferror(f) != 0;
  std::fclose(f);
  if (bad) fail("{}: cannot read: read error", path);
  return h.hex();
}

}  // namespace kvs
