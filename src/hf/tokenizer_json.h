// tokenizer.json (Hugging Face tokenizers) for a sentencepiece BPE model, so
// that transformers encodes as sentencepiece does, the way kvshift's data were
// made: the dummy prefix "▁" before every text (also one that starts with a
// space), spaces as "▁", byte fallback, and the merges ranked by the merged
// piece's score, as transformers' own converter (generate_merges) ranks them.
// transformers 5 rebuilds a LlamaTokenizer from the vocabulary alone with its
// own pre-tokenizer, which drops that prefix before a leading space; a
// PreTrainedTokenizerFast takes this file as it is, on 4.x and 5.x.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/sp_model.h"

namespace kvs::hf {

// The merges, best first: every split of a normal piece into two pieces of the
// vocabulary, ordered by the piece's score (higher first), then the longer left
// part, then the longer right part, then vocabulary order (the left's id, the
// right's id). Control, byte and user-defined pieces are never merged into:
// sentencepiece does not build them by merging either.
std::vector<std::pair<std::string, std::string>> sentencepiece_merges(const std::vector<SpPiece>& pieces);

// "" when tokenizer.json can reproduce the model's encoding, else why not (a
// unigram model, a normalization other than identity, removal of extra spaces, ...).
std::string why_no_tokenizer_json(const SpModel& m);

// The file's contents; bos_id >= 0 adds BOS in front of every sequence.
nlohmann::ordered_json tokenizer_json(const SpModel& m, int bos_id);

}  // namespace kvs::hf
