#include "data/compressed_input.h"

#ifdef KVS_HAVE_ZLIB
#include <zlib.h>
#endif
#ifdef KVS_HAVE_ZSTD
#include <zstd.h>
#endif

#include <memory>
#include <string_view>

#include "core/error.h"
#include "core/fs.h"

namespace kvs {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

#ifdef KVS_HAVE_ZLIB
// gzip, every member of a multi-member file (as `cat a.gz b.gz` makes) in turn.
std::string gunzip(const std::string& in, const std::string& path) {
  std::string out;
  z_stream z{};
  KVS_CHECK(inflateInit2(&z, 15 + 32) == Z_OK, "{}: zlib could not start", path);  // 32: gzip or zlib header
  std::unique_ptr<z_stream, int (*)(z_stream*)> end(&z, inflateEnd);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  KVS_CHECK(in.size() == z.avail_in, "{}: larger than 4 GiB compressed: split the file", path);
  char buf[1 << 16];
  for (;;) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    const int rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof buf - z.avail_out);
    if (rc == Z_STREAM_END) {
      if (z.avail_in == 0) return out;
      KVS_CHECK(inflateReset(&z) == Z_OK, "{}: zlib could not go on to the next gzip member", path);
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && z.avail_in == 0)
      fail("{}: truncated gzip data (it ends after {} compressed bytes)", path, in.size());
    // The offset in the file (total_in restarts at each member's inflateReset).
    fail("{}: not valid gzip data ({}) at compressed byte {}", path, z.msg ? z.msg : "zlib error",
         in.size() - z.avail_in);
  }
}
#endif

#ifdef KVS_HAVE_ZSTD
std::string unzstd(const std::string& in, const std::string& path) {
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  KVS_CHECK(ctx, "{}: libzstd could not start", path);
  std::string out;
  ZSTD_inBuffer src{in.data(), in.size(), 0};
  std::string buf(ZSTD_DStreamOutSize(), '\0');
  size_t last = 0;
  while (src.pos < src.size) {
    ZSTD_outBuffer dst{buf.data(), buf.size(), 0};
    last = ZSTD_decompressStream(ctx.get(), &dst, &src);
    if (ZSTD_isError(last))
      fail("{}: not valid zstd data ({}) near compressed byte {}", path, ZSTD_getErrorName(last), src.pos);
    out.append(buf.data(), dst.pos);
  }
  // A frame not finished when the input ends: more output may be pending, or the file was cut.
  while (last != 0) {
    ZSTD_outBuffer dst{buf.data(), buf.size(), 0};
    last = ZSTD_decompressStream(ctx.get(), &dst, &src);
    if (ZSTD_isError(last)) fail("{}: not valid zstd data ({})", path, ZSTD_getErrorName(last));
    out.append(buf.data(), dst.pos);
    if (dst.pos == 0 && last != 0) fail("{}: truncated zstd data (it ends after {} compressed bytes)", path, in.size());
  }
  return out;
}
#endif

}  // namespace

std::string read_input_bytes(const std::string& path) {
  const bool gz = ends_with(path, ".gz"), zst = ends_with(path, ".zst");
#ifndef KVS_HAVE_ZLIB
  KVS_CHECK(!gz, "{}: a gzip file, but this kvshift was built without zlib (install zlib1g-dev and rebuild, or "
            "decompress it first)", path);
#endif
#ifndef KVS_HAVE_ZSTD
  KVS_CHECK(!zst, "{}: a zstd file, but this kvshift was built without libzstd (install libzstd-dev and rebuild, or "
            "decompress it first)", path);
#endif
  std::string bytes = read_file(path);
#ifdef KVS_HAVE_ZLIB
  if (gz) return gunzip(bytes, path);
#endif
#ifdef KVS_HAVE_ZSTD
  if (zst) return unzstd(bytes, path);
#endif
  return bytes;
}

std::string input_compressions() {
  std::string s;
#ifdef KVS_HAVE_ZLIB
  s += "gzip";
#endif
#ifdef KVS_HAVE_ZSTD
  s += s.empty() ? "zstd" : ", zstd";
#endif
  return s.empty() ? "none" : s;
}

}  // namespace kvs
