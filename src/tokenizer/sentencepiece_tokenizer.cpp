// sentencepiece models behind kvs::Tokenizer, and load_tokenizer for a
// tokenizer directory (tokenizer.model + kvshift_tokenizer.json).
#include <sentencepiece_processor.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/fs.h"
#include "core/sha256.h"
#include "tokenizer/sp_model.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_meta.h"

namespace kvs {
namespace {

constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";  // "▁", sentencepiece's escaped space

// Where a text may be cut without changing its ids. Decided from the model
// (sentencepiece 0.1.97's bpe_model.cc, normalizer.cc, sentencepiece_processor.cc):
// a BPE merge joins two adjacent symbols into a vocabulary piece, so a cut
// that no piece can span keeps both sides' merges apart, and the merge order
// (score, then position) within each side is the same with or without the
// other. That needs a text-independent normalization (no charsmap, no
// whitespace removal, the dummy "▁" only at the start) and byte fallback (or
// unknown characters on both sides of a cut would merge into one <unk>).
// Then two cuts hold:
//   - after a newline, when no piece holds a newline followed by more;
//   - before a space that follows neither a space nor a literal "▁", when
//     every "▁" inside a piece follows another "▁" (split_by_whitespace).
// A later piece is encoded after a "\n" (its ids dropped), so the dummy
// prefix lands on that newline, as the piece's start is no word start.
struct CutRules {
  bool after_newline = false, before_space = false;
};

CutRules cut_rules(const SpModel& m) {
  CutRules r;
  constexpr int kBpe = 2;
  if (m.model_type != kBpe || m.has_precompiled_charsmap || m.remove_extra_whitespaces ||
      m.treat_whitespace_as_suffix || !m.byte_fallback)
    return r;
  r.after_newline = true;
  r.before_space = m.escape_whitespaces;
  for (const SpPiece& p : m.pieces) {
    const std::string_view s = p.piece;
    const size_t nl = s.find('\n');
    if (nl != std::string_view::npos && nl + 1 < s.size()) r.after_newline = false;
    for (size_t at = s.find(kSpaceSymbol, 1); at != std::string_view::npos; at = s.find(kSpaceSymbol, at + 1))
      if (at < kSpaceSymbol.size() || s.substr(at - kSpaceSymbol.size(), kSpaceSymbol.size()) != kSpaceSymbol)
        r.before_space = false;
  }
  r.before_space = r.before_space && r.after_newline;  // a later piece's ids come from "\n" + piece
  return r;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& dir, const TokenizerMeta& meta) : dir_(dir), meta_(meta) {
    const std::string model = (std::filesystem::path(dir) / kTokenizerModelFile).string();
    const std::string meta_file = (std::filesystem::path(dir) / kTokenizerMetaFile).string();
    const std::string bytes = read_file(model);
    // The hash ties the model to the shards prepared with it (their manifest records it).
    const std::string sha = sha256_hex(bytes);
    KVS_CHECK(sha == meta.sha256, "{}: sha256 {} does not match 'sha256' {} in {} (model replaced or corrupt)", model,
              sha, meta.sha256, meta_file);
    const auto st = sp_.LoadFromSerializedProto(bytes);
    KVS_CHECK(st.ok(), "{}: not a sentencepiece model: {}", model, st.ToString());
    KVS_CHECK(sp_.GetPieceSize() == meta.vocab_size, "{}: the model has {} pieces but 'vocab_size' in {} is {}", model,
              sp_.GetPieceSize(), meta_file, meta.vocab_size);
    cuts_ = cut_rules(parse_sentencepiece_model(model, bytes));
    if (cuts_.after_newline) newline_ids_ = encode("\n");
    KVS_CHECK(sp_.bos_id() == meta.bos_id && sp_.eos_id() == meta.eos_id && sp_.unk_id() == meta.unk_id &&
                  sp_.pad_id() == meta.pad_id,
              "{}: special ids (bos {}, eos {}, unk {}, pad {}) differ from {} (bos {}, eos {}, unk {}, pad {})", model,
              sp_.bos_id(), sp_.eos_id(), sp_.unk_id(), sp_.pad_id(), meta_file, meta.bos_id, meta.eos_id,
              meta.unk_id, meta.pad_id);
  }
  int vocab_size() const override { return meta_.vocab_size; }
  int bos_id() const override { return meta_.bos_id; }
  int eos_id() const override { return meta_.eos_id; }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto st = sp_.Encode(text, &ids);
    KVS_CHECK(st.ok(), "{}: sentencepiece cannot encode: {}", dir_, st.ToString());
    return {ids.begin(), ids.end()};
  }
  std::vector<size_t> safe_cuts(std::string_view text, size_t max_bytes) const override {
    std::vector<size_t> cuts;
    if (!cuts_.after_newline || max_bytes == 0) return cuts;
    for (size_t start = 0; text.size() - start > max_bytes;) {
      // The last cut in the second half of the next max_bytes, else the first one after them.
      size_t at = last_cut(text, start + max_bytes / 2 + 1, start + max_bytes);
      if (at == std::string_view::npos) at = first_cut(text, start + max_bytes + 1);
      if (at == std::string_view::npos) break;  // the rest stays whole
      cuts.push_back(at);
      start = at;
    }
    return cuts;
  }
  std::vector<int32_t> encode_after_cut(std::string_view piece) const override {
    KVS_CHECK(cuts_.after_newline, "{}: this sentencepiece model cannot encode a text in pieces", dir_);
    std::string text = "\n";
    text += piece;
    std::vector<int32_t> ids = encode(text);
    KVS_CHECK(ids.size() >= newline_ids_.size() && std::equal(newline_ids_.begin(), newline_ids_.end(), ids.begin()),
              "{}: a piece after a cut does not start with the newline's ids (internal error)", dir_);
    ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(newline_ids_.size()));
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    for (size_t i = 0; i < ids.size(); ++i)
      KVS_CHECK(ids[i] >= 0 && ids[i] < meta_.vocab_size, "{}: id {} at position {} is outside [0, {})", dir_, ids[i],
                i, meta_.vocab_size);
    std::string out;
    const auto st = sp_.Decode(std::vector<int>(ids.begin(), ids.end()), &out);
    KVS_CHECK(st.ok(), "{}: sentencepiece cannot decode: {}", dir_, st.ToString());
    return out;
  }
  std::string id_to_piece(int32_t id) const override {
    KVS_CHECK(id >= 0 && id < meta_.vocab_size, "{}: id {} is outside [0, {})", dir_, id, meta_.vocab_size);
    return sp_.IdToPiece(id);
  }
  std::string describe() const override {
    return "sentencepiece " + meta_.model_type + ", " + std::to_string(meta_.vocab_size) + " pieces (" + dir_ + ")";
  }

 private:
  // Is `at` (0 < at < text.size()) a cut of cuts_?
  bool is_cut(std::string_view text, size_t at) const {
    if (text[at - 1] == '\n') return true;
    return cuts_.before_space && text[at] == ' ' && text[at - 1] != ' ' &&
           !text.substr(0, at).ends_with(kSpaceSymbol);
  }
  size_t last_cut(std::string_view text, size_t lo, size_t hi) const {  // in [lo, hi], or npos
    for (size_t at = hi; at >= lo && at > 0; --at)
      if (at < text.size() && is_cut(text, at)) return at;
    return std::string_view::npos;
  }
  size_t first_cut(std::string_view text, size_t from) const {  // at or after `from`, or npos
    for (size_t at = std::max<size_t>(from, 1); at < text.size(); ++at)
      if (is_cut(text, at)) return at;
    return std::string_view::npos;
  }
  std::string dir_;
  TokenizerMeta meta_;
  sentencepiece::SentencePieceProcessor sp_;
  CutRules cuts_;
  std::vector<int32_t> newline_ids_;  // encode("\n"): what encode_after_cut drops
};

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  const TokenizerMeta meta = read_tokenizer_meta(dir);
  if (meta.type == "bytes") return make_byte_tokenizer();
  return std::make_unique<SentencePieceTokenizer>(dir, meta);
}

}  // namespace kvs
