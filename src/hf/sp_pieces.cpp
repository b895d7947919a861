#include "hf/sp_pieces.h"

#include <cstdint>

#include "core/error.h"
#include "core/fs.h"

namespace kvs::hf {

namespace {

struct Reader {
  const std::string& path;
  const uint8_t* p;
  const uint8_t* end;

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      KVS_CHECK(p < end, "{}: not a sentencepiece model (truncated protobuf)", path);
      const uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("{}: not a sentencepiece model (bad varint)", path);
  }
  // Skips a field of wire type `wt`; returns the payload for length-delimited ones.
  std::string_view field(uint32_t wt) {
    switch (wt) {
      case 0: varint(); return {};
      case 1: return take(8);
      case 5: return take(4);
      case 2: return take(varint());
      default: fail("{}: not a sentencepiece model (protobuf wire type {})", path, wt);
    }
  }
  std::string_view take(uint64_t n) {
    KVS_CHECK(n <= static_cast<uint64_t>(end - p), "{}: not a sentencepiece model (truncated protobuf)", path);
    std::string_view s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
};

}  // namespace

std::vector<std::string> read_sentencepiece_pieces(const std::string& path) {
  const std::string data = read_file(path);
  const auto* b = reinterpret_cast<const uint8_t*>(data.data());
  Reader top{path, b, b + data.size()};
  std::vector<std::string> pieces;
  while (top.p < top.end) {
    const uint64_t key = top.varint();
    const std::string_view payload = top.field(key & 7);
    if ((key >> 3) != 1 || (key & 7) != 2) continue;
    const auto* pb = reinterpret_cast<const uint8_t*>(payload.data());
    Reader sub{path, pb, pb + payload.size()};
    std::string piece;
    while (sub.p < sub.end) {
      const uint64_t k = sub.varint();
      const std::string_view v = sub.field(k & 7);
      if ((k >> 3) == 1 && (k & 7) == 2) piece = std::string(v);
    }
    pieces.push_back(std::move(piece));
  }
  KVS_CHECK(!pieces.empty(), "{}: not a sentencepiece model (no pieces)", path);
  return pieces;
}

}  // namespace kvs::hf
