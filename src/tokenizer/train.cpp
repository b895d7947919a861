#include "tokenizer/train.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <string_view>
#include <unordered_map>

#include "core/atomic_dir.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "data/text_input.h"
#include "tokenizer/tokenizer_meta.h"

namespace kvs {
namespace {

namespace fs = std::filesystem;

// Every non-blank line is a sentence; long lines are cut (kMaxSentenceBytes), at a space or at least at a character
// boundary.
template <class F>
void for_each_sentence(std::string_view text, F&& f) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos = nl + 1;
    if (line.find_first_not_of(" \t\f\v") == std::string_view::npos) continue;  // blank: nothing to learn
    while (line.size() > kMaxSentenceBytes) {
      size_t cut = line.rfind(' ', kMaxSentenceBytes);
      if (cut == std::string_view::npos || cut == 0) {
        cut = kMaxSentenceBytes;
        while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
      }
      f(line.substr(0, cut));
      line.remove_prefix(cut);
    }
    if (!line.empty()) f(line);
  }
}

// An input file's text, or with JSON Lines its documents (decoded copies).
struct HeldText {
  std::string text;
  std::vector<std::string> docs;
};

// The sample as sentencepiece reads it, one input file at a time: sentence i
// (0-based over all files) is kept iff floor(i*M/N) advances, exactly M evenly
// spread. Only the current file's text is held, never a copy of the sample
// (sentencepiece keeps its own).
class SampledSentences final : public sentencepiece::SentenceIterator {
 public:
  // load(f, held, each): reads input f into `held` and calls each(sentence)
  // for its sentences in order (views into `held`).
  using Load = std::function<void(size_t, HeldText&, const std::function<void(std::string_view)>&)>;
  SampledSentences(int64_t total, int64_t keep, size_t files, Load load)
      : total_(total), keep_(keep), files_(files), load_(std::move(load)) {
    fill();
  }
  bool done() const override { return at_ >= kept_.size(); }
  void Next() override {
    if (++at_ >= kept_.size()) fill();
    else value_ = kept_[at_];
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override {
    if (!error_) return {};
    return {sentencepiece::util::StatusCode::kInternal, "reading an input failed"};
  }
  std::exception_ptr error() const { return error_; }
  int64_t kept() const { return kept_total_; }

 private:
  void fill() {  // the kept sentences of the next file that has any
    kept_.clear();
    at_ = 0;
    while (kept_.empty() && file_ < files_ && !error_) {
      try {
        load_(file_++, held_, [&](std::string_view s) {
          const auto k0 = static_cast<__int128>(index_) * keep_ / total_;
          const auto k1 = static_cast<__int128>(index_ + 1) * keep_ / total_;
          if (k1 != k0) kept_.push_back(s);
          ++index_;
        });
      } catch (...) {
        error_ = std::current_exception();
        kept_.clear();
      }
    }
    kept_total_ += static_cast<int64_t>(kept_.size());
    if (!kept_.empty()) value_ = kept_[0];
    else held_ = {};  // done: free the last file while sentencepiece trains
  }
  int64_t total_, keep_;
  size_t files_;
  Load load_;
  size_t file_ = 0, at_ = 0;
  int64_t index_ = 0, kept_total_ = 0;
  HeldText held_;
  std::vector<std::string_view> kept_;
  std::string value_;
  std::exception_ptr error_;
};

}  // namespace

std::vector<std::string_view> split_sentences(std::string_view text) {
  std::vector<std::string_view> out;
  for_each_sentence(text, [&](std::string_view s) { out.push_back(s); });
  return out;
}

TokenizerTrainResult train_tokenizer(const TokenizerTrainOptions& o) {
  KVS_CHECK(!o.inputs.empty(), "tokenizer train: no --input files");
  warn_repeated_inputs(o.inputs, "tokenizer train");
  KVS_CHECK(o.vocab_size >= 261,
            "--vocab-size {} is too small: the least is 261 (256 byte-fallback pieces, 3 special pieces and the text's "
            "own characters)",
            o.vocab_size);
  KVS_CHECK(o.max_sentences > 0, "--max-sentences must be positive (got {})", o.max_sentences);
  // sentencepiece's own range (its error names no flag).
  KVS_CHECK(o.character_coverage >= 0.98 && o.character_coverage <= 1.0,
            "--character-coverage must be in [0.98, 1] (got {})", o.character_coverage);
  check_output_holds_no_input(o.out, o.inputs);
  check_atomic_target(o.out, o.force, "kvshift_tokenizer.json");  // and removes what a killed run left beside it

  // Input f's sentences: its lines, or with JSON Lines the lines of each document (views into `held`).
  // Returns the file's bytes (decompressed).
  auto sentences_of = [&](size_t f, HeldText& held, const std::function<void(std::string_view)>& each) {
    held = {};
    held.text = read_text_file(o.inputs[f]);
    const auto bytes = static_cast<int64_t>(held.text.size());
    if (o.jsonl_key.empty()) {
      for_each_sentence(without_byte_order_mark(held.text), each);
    } else {
      held.docs = jsonl_documents(held.text, o.jsonl_key, o.inputs[f]);
      std::string().swap(held.text);  // the documents are copies
      for (const std::string& d : held.docs) for_each_sentence(d, each);
    }
    return bytes;
  };
  // Pass 1: validate every file and count sentences, so the subset can be evenly spaced.
  TokenizerTrainResult r;
  std::vector<int64_t> file_sentences(o.inputs.size()), file_bytes(o.inputs.size());
  for (size_t f = 0; f < o.inputs.size(); ++f) {
    HeldText held;
    file_bytes[f] = sentences_of(f, held, [&](std::string_view) { ++file_sentences[f]; });
    r.bytes += file_bytes[f];
    r.sentences_total += file_sentences[f];
  }
  KVS_CHECK(r.sentences_total > 0, "tokenizer train: empty corpus: the {} input file(s) hold no text (first: {})",
            o.inputs.size(), o.inputs[0]);
  // Pass 2, as sentencepiece reads the sample: a file that changed since
  // pass 1 would shift the sample (or overrun it) silently, so it is an error.
  auto sentences_again = [&](size_t f, HeldText& held, const std::function<void(std::string_view)>& each) {
    int64_t n = 0;
    const int64_t bytes = sentences_of(f, held, [&](std::string_view s) {
      if (++n <= file_sentences[f]) each(s);
    });
    KVS_CHECK(n == file_sentences[f] && bytes == file_bytes[f],
              "{}: changed while tokenizer train read it ({} sentences, {} bytes in its first pass; {}, {} in its "
              "second): train on files that do not change",
              o.inputs[f], file_sentences[f], file_bytes[f], n, bytes);
  };
  SampledSentences it(r.sentences_total, std::min<int64_t>(r.sentences_total, o.max_sentences), o.inputs.size(),
                      sentences_again);

  // Llama 2's trainer spec (its tokenizer.model), except vocab size, threads and
  // the sentence sampling, which we do ourselves (no shuffling: deterministic).
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"character_coverage", fmt::format("{}", o.character_coverage)},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"split_by_unicode_script", "true"},
      {"split_by_whitespace", "true"},
      {"split_by_number", "true"},
      {"treat_whitespace_as_suffix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"max_sentencepiece_length", "16"},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "true"},
      {"remove_extra_whitespaces", "false"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      // The model file records num_threads, so it is pinned: sentencepiece 0.1.97's
      // BPE trainer is single-threaded anyway (only its cheap normalization pass
      // uses the threads), and 1 vs 2 threads learn the same pieces.
      {"num_threads", "1"},
      {"hard_vocab_limit", "true"},
      {"vocabulary_output_piece_score", "true"},
      // Errors only: a failure is our one-line error below, and sentencepiece's own
      // warnings (e.g. "No valid symbol found" before a too-large vocabulary) would
      // come first on stderr.
      {"minloglevel", "2"},
  };
  std::string model;
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  if (it.error()) std::rethrow_exception(it.error());  // an input that changed since pass 1, say
  r.sentences_used = it.kept();
  if (!st.ok()) {
    // The most common failure, a vocabulary larger than the text supports: name the flag and the limit.
    const std::string msg = st.ToString();
    const std::string limit_text = "Please set it to a value <= ";
    const auto at = msg.find(limit_text);
    long long limit = 0;
    if (msg.find("Vocabulary size too high") != std::string::npos && at != std::string::npos &&
        std::sscanf(msg.c_str() + at + limit_text.size(), "%lld", &limit) == 1)
      fail("tokenizer train: --vocab-size {} is more pieces than {} lines of text yield (at most {} here): lower it "
           "or train on more text",
           o.vocab_size, r.sentences_used, limit);
    // The other common one, more distinct characters than pieces: in our flags' names, not sentencepiece's.
    const std::string chars_text = "Vocabulary size is smaller than required_chars. ";
    const auto chars_at = msg.find(chars_text);
    long long have = 0, need = 0;
    if (chars_at != std::string::npos &&
        std::sscanf(msg.c_str() + chars_at + chars_text.size(), "%lld vs %lld", &have, &need) == 2 &&
        have == o.vocab_size)
      fail("tokenizer train: --vocab-size {} is too small for this text: the characters --character-coverage {} "
           "keeps need {} pieces (with the byte and special pieces); raise --vocab-size to at least that or lower "
           "--character-coverage (down to 0.98)",
           o.vocab_size, o.character_coverage, need);
    fail("tokenizer train: sentencepiece failed: {}", msg);
  }

  sentencepiece::SentencePieceProcessor sp;
  const auto lst = sp.LoadFromSerializedProto(model);
  KVS_CHECK(lst.ok(), "tokenizer train: sentencepiece produced an unloadable model: {}", lst.ToString());
  std::string vocab;  // piece \t score, one per id: for people, not read back
  for (int id = 0; id < sp.GetPieceSize(); ++id) vocab += fmt::format("{}\t{}\n", sp.IdToPiece(id), sp.GetScore(id));

  TokenizerMeta m = sentencepiece_meta(model, "bpe", "tokenizer train");
  nlohmann::json trainer = nlohmann::json::object();
  for (const auto& [k, v] : args)
    if (k != "num_threads" && k != "minloglevel") trainer[k] = v;
  trainer["sentences_total"] = r.sentences_total;
  trainer["sentences_used"] = r.sentences_used;
  trainer["input_bytes"] = r.bytes;
  m.trainer = trainer;  // nlohmann's object is a sorted map: stable bytes
  r.sha256 = m.sha256;
  // The directory appears whole or not at all (core/atomic_dir.h).
  const std::string tmp = begin_atomic_dir(o.out);
  try {
    atomic_write_file(tmp + "/" + kTokenizerModelFile, model);
    atomic_write_file(tmp + "/tokenizer.vocab", vocab);
    write_json_file(tmp + "/" + kTokenizerMetaFile, tokenizer_meta_json(m));
    commit_atomic_dir(tmp, o.out, o.force, "kvshift_tokenizer.json");
  } catch (...) {
    abandon_atomic_dir(tmp);
    throw;
  }
  return r;
}

}  // namespace kvs
