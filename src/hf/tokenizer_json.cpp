#include "hf/tokenizer_json.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace kvs::hf {

using nlohmann::ordered_json;

namespace {

const char* const kSpace = "\xe2\x96\x81";  // U+2581, sentencepiece's space

bool is_continuation_byte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

size_t code_points(const std::string& s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return !is_continuation_byte(c); }));
}

}  // namespace

std::vector<std::pair<std::string, std::string>> sentencepiece_merges(const std::vector<SpPiece>& pieces) {
  std::unordered_map<std::string, int> id;
  for (size_t i = 0; i < pieces.size(); ++i) id[pieces[i].piece] = static_cast<int>(i);
  struct Merge {
    int left, right;
    float score;
    size_t left_len, right_len;
  };
  std::vector<Merge> merges;
  for (const SpPiece& p : pieces) {
    if (p.type != SpPiece::kNormal) continue;
    std::vector<Merge> local;
    for (size_t cut = 1; cut < p.piece.size(); ++cut) {
      if (is_continuation_byte(p.piece[cut])) continue;  // split between code points only
      const auto l = id.find(p.piece.substr(0, cut)), r = id.find(p.piece.substr(cut));
      if (l != id.end() && r != id.end())
        local.push_back({l->second, r->second, p.score, code_points(l->first), code_points(r->first)});
    }
    std::sort(local.begin(), local.end(),
              [](const Merge& a, const Merge& b) { return std::pair(a.left, a.right) < std::pair(b.left, b.right); });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.left_len != b.left_len) return a.left_len > b.left_len;
    return a.right_len > b.right_len;
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const Merge& m : merges) out.emplace_back(pieces[m.left].piece, pieces[m.right].piece);
  return out;
}

std::string why_no_tokenizer_json(const SpModel& m) {
  if (m.model_type != 2) return "not a BPE model (sentencepiece model_type " + std::to_string(m.model_type) + ")";
  if (m.has_precompiled_charsmap || m.has_normalization_rule_tsv ||
      (!m.normalizer_name.empty() && m.normalizer_name != "identity"))
    return "its normalization is '" + m.normalizer_name + "', not identity";
  if (m.remove_extra_whitespaces) return "it removes extra whitespace";
  if (!m.add_dummy_prefix) return "it adds no dummy prefix";
  if (!m.escape_whitespaces) return "it does not escape whitespace";
  if (m.treat_whitespace_as_suffix) return "it treats whitespace as a suffix";
  std::unordered_set<std::string> seen;
  for (const SpPiece& p : m.pieces) {
    if (p.piece.find(' ') != std::string::npos) return "a piece holds a space";  // merges are "left right"
    if (!seen.insert(p.piece).second) return "the piece '" + p.piece + "' appears twice";
  }
  return "";
}

ordered_json tokenizer_json(const SpModel& m, int bos_id) {
  ordered_json added = ordered_json::array();
  // In id order, as tokenizers writes it. Appended to the ordered map's vector:
  // its operator[] searches linearly (quadratic over 32k pieces), and the
  // pieces are distinct (why_no_tokenizer_json).
  ordered_json vocab = ordered_json::object();
  auto& entries = static_cast<ordered_json::object_t::Container&>(vocab.get_ref<ordered_json::object_t&>());
  entries.reserve(m.pieces.size());
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const SpPiece& p = m.pieces[i];
    entries.emplace_back(p.piece, i);
    const bool special = p.type == SpPiece::kUnknown || p.type == SpPiece::kControl;
    if (special || p.type == SpPiece::kUserDefined)
      added.push_back({{"id", i},
                       {"content", p.piece},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", special}});
  }
  ordered_json merges = ordered_json::array();
  for (const auto& [l, r] : sentencepiece_merges(m.pieces)) merges.push_back(l + " " + r);

  ordered_json post = nullptr;
  if (bos_id >= 0) {
    const std::string bos = m.pieces.at(bos_id).piece;
    auto special = [&](int type_id) { return ordered_json{{"SpecialToken", {{"id", bos}, {"type_id", type_id}}}}; };
    auto seq = [](const char* id, int type_id) { return ordered_json{{"Sequence", {{"id", id}, {"type_id", type_id}}}}; };
    post = {{"type", "TemplateProcessing"},
            {"single", {special(0), seq("A", 0)}},
            {"pair", {special(0), seq("A", 0), special(1), seq("B", 1)}},
            {"special_tokens", {{bos, {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}}}}}};
  }
  auto replace = [](const char* from, const char* to) {
    return ordered_json{{"type", "Replace"}, {"pattern", {{"String", from}}}, {"content", to}};
  };
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          // The dummy prefix before every text, then spaces as "▁" (sentencepiece's
          // add_dummy_prefix with escape_whitespaces); no pre-tokenizer.
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers", {{{"type", "Prepend"}, {"prepend", kSpace}}, replace(" ", kSpace)}}}},
          {"pre_tokenizer", nullptr},
          {"post_processor", post},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {replace(kSpace, " "),
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", m.unk_piece},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", true},
            {"byte_fallback", m.byte_fallback},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

}  // namespace kvs::hf
