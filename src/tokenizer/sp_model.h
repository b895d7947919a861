// A sentencepiece model file (tokenizer.model) as data: its pieces with scores
// and types, and the trainer and normalizer settings that decide how a text is
// split. Read straight from the protobuf wire format (sentencepiece_model.proto),
// as sentencepiece's own headers do not expose it: HF export and import
// translate it, the tokenizer decides from it where a long text may be cut.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

struct SpPiece {
  enum Type { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
  std::string piece;
  float score = 0;
  int type = kNormal;
};

struct SpModel {
  std::vector<SpPiece> pieces;
  // TrainerSpec (the proto's defaults where a field is absent)
  int model_type = 1;  // 1 unigram, 2 BPE, 3 word, 4 char
  std::string unk_piece = "<unk>";
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  // NormalizerSpec
  std::string normalizer_name;
  bool has_precompiled_charsmap = false;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
  bool has_normalization_rule_tsv = false;
};

SpModel read_sentencepiece_model(const std::string& path);
// The same from the file's bytes; `name` is for errors.
SpModel parse_sentencepiece_model(const std::string& name, std::string_view bytes);

}  // namespace kvs
