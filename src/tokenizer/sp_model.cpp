#include "tokenizer/sp_model.h"

#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/fs.h"

namespace kvs {

namespace {

struct Reader {
  const std::string& path;
  const uint8_t* p;
  const uint8_t* end;

  static Reader of(const std::string& path, std::string_view bytes) {
    const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
    return {path, b, b + bytes.size()};
  }
  bool more() const { return p < end; }
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
  // One field: its number, wire type, varint value (wire type 0) and payload (the others).
  struct Field {
    uint32_t number, wire;
    uint64_t value;
    std::string_view bytes;
  };
  Field next() {
    const uint64_t key = varint();
    Field f{static_cast<uint32_t>(key >> 3), static_cast<uint32_t>(key & 7), 0, {}};
    switch (f.wire) {
      case 0: f.value = varint(); break;
      case 1: f.bytes = take(8); break;
      case 5: f.bytes = take(4); break;
      case 2: f.bytes = take(varint()); break;
      default: fail("{}: not a sentencepiece model (protobuf wire type {})", path, f.wire);
    }
    return f;
  }
  std::string_view take(uint64_t n) {
    KVS_CHECK(n <= static_cast<uint64_t>(end - p), "{}: not a sentencepiece model (truncated protobuf)", path);
    std::string_view s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
};

float as_float(std::string_view four) {
  float f;
  std::memcpy(&f, four.data(), 4);  // protobuf's fixed32 is little-endian, as every target here
  return f;
}

SpPiece read_piece(const std::string& path, std::string_view bytes) {
  SpPiece piece;
  for (Reader r = Reader::of(path, bytes); r.more();) {
    const auto f = r.next();
    if (f.number == 1 && f.wire == 2) piece.piece = std::string(f.bytes);
    if (f.number == 2 && f.wire == 5) piece.score = as_float(f.bytes);
    if (f.number == 3 && f.wire == 0) piece.type = static_cast<int>(f.value);
  }
  return piece;
}

void read_trainer_spec(const std::string& path, std::string_view bytes, SpModel& m) {
  for (Reader r = Reader::of(path, bytes); r.more();) {
    const auto f = r.next();
    if (f.number == 3 && f.wire == 0) m.model_type = static_cast<int>(f.value);
    if (f.number == 24 && f.wire == 0) m.treat_whitespace_as_suffix = f.value != 0;
    if (f.number == 35 && f.wire == 0) m.byte_fallback = f.value != 0;
    if (f.number == 45 && f.wire == 2) m.unk_piece = std::string(f.bytes);
  }
}

void read_normalizer_spec(const std::string& path, std::string_view bytes, SpModel& m) {
  for (Reader r = Reader::of(path, bytes); r.more();) {
    const auto f = r.next();
    if (f.number == 1 && f.wire == 2) m.normalizer_name = std::string(f.bytes);
    if (f.number == 2 && f.wire == 2) m.has_precompiled_charsmap = !f.bytes.empty();
    if (f.number == 3 && f.wire == 0) m.add_dummy_prefix = f.value != 0;
    if (f.number == 4 && f.wire == 0) m.remove_extra_whitespaces = f.value != 0;
    if (f.number == 5 && f.wire == 0) m.escape_whitespaces = f.value != 0;
    if (f.number == 6 && f.wire == 2) m.has_normalization_rule_tsv = !f.bytes.empty();
  }
}

}  // namespace

SpModel read_sentencepiece_model(const std::string& path) { return parse_sentencepiece_model(path, read_file(path)); }

SpModel parse_sentencepiece_model(const std::string& path, std::string_view data) {
  SpModel m;
  for (Reader top = Reader::of(path, data); top.more();) {
    const auto f = top.next();
    if (f.wire != 2) continue;
    if (f.number == 1) m.pieces.push_back(read_piece(path, f.bytes));
    if (f.number == 2) read_trainer_spec(path, f.bytes, m);
    if (f.number == 3) read_normalizer_spec(path, f.bytes, m);
  }
  KVS_CHECK(!m.pieces.empty(), "{}: not a sentencepiece model (no pieces)", path);
  return m;
}

}  // namespace kvs
