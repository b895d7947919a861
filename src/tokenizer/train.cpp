#include "tokenizer/train.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <filesystem>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "core/fs.h"
#include "core/sha256.h"
#include "data/text_input.h"
#include "tokenizer/tokenizer_meta.h"

namespace kvs {
namespace {

namespace fs = std::filesystem;

// sentencepiece skips sentences longer than this (Llama 2's value); we cut long
// lines instead, at a space or at least at a character boundary.
constexpr size_t kMaxSentenceBytes = 4192;

template <class F>
void for_each_sentence(std::string_view text, F&& f) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
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
    pos = nl + 1;
  }
}

class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

// Writes dir/ under a temp name beside it and renames it into place, so `out`
// is either absent, the previous tokenizer, or complete.
void write_dir_atomically(const std::string& out, const std::vector<std::pair<std::string, std::string>>& files) {
  const fs::path target = fs::absolute(out);
  const std::string tmp = target.string() + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  make_dirs(tmp);
  try {
    for (const auto& [name, data] : files) atomic_write_file((fs::path(tmp) / name).string(), data);
    std::string old;
    if (fs::exists(target)) {
      old = target.string() + ".old." + std::to_string(::getpid());
      if (::rename(target.c_str(), old.c_str()) != 0) fail("{}: cannot move the old tokenizer aside", out);
    }
    if (::rename(tmp.c_str(), target.c_str()) != 0) fail("{}: cannot rename {} into place", out, tmp);
    if (!old.empty()) fs::remove_all(old, ec);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fsync_path(target.parent_path().string());
}

}  // namespace

TokenizerTrainResult train_tokenizer(const TokenizerTrainOptions& o) {
  KVS_CHECK(!o.inputs.empty(), "tokenizer train: no --input files");
  KVS_CHECK(o.vocab_size >= 261, "--vocab-size {} is too small: byte fallback alone needs 256 + 3 special pieces",
            o.vocab_size);
  KVS_CHECK(o.max_sentences > 0, "--max-sentences must be positive (got {})", o.max_sentences);
  KVS_CHECK(o.force || !fs::exists(o.out), "{}: already exists; pass --force to replace it", o.out);

  // Pass 1: validate every file and count sentences, so the subset can be evenly spaced.
  TokenizerTrainResult r;
  for (const auto& f : o.inputs) {
    const std::string text = read_text_file(f);
    r.bytes += static_cast<int64_t>(text.size());
    for_each_sentence(text, [&](std::string_view) { ++r.sentences_total; });
  }
  KVS_CHECK(r.sentences_total > 0, "tokenizer train: empty corpus: the {} input file(s) hold no text (first: {})",
            o.inputs.size(), o.inputs[0]);
  // Pass 2: sentence i is kept iff floor(i*M/N) advances: exactly M, evenly spread.
  const int64_t N = r.sentences_total, M = std::min<int64_t>(N, o.max_sentences);
  std::vector<std::string> sentences;
  sentences.reserve(static_cast<size_t>(M));
  int64_t i = 0;
  for (const auto& f : o.inputs) {
    const std::string text = read_text_file(f);
    for_each_sentence(text, [&](std::string_view s) {
      const auto k0 = static_cast<__int128>(i) * M / N, k1 = static_cast<__int128>(i + 1) * M / N;
      if (k1 != k0) sentences.emplace_back(s);
      ++i;
    });
  }
  r.sentences_used = static_cast<int64_t>(sentences.size());

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
      {"minloglevel", "1"},
  };
  VectorIterator it(sentences);
  std::string model;
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  KVS_CHECK(st.ok(), "tokenizer train: sentencepiece failed: {}", st.ToString());

  sentencepiece::SentencePieceProcessor sp;
  const auto lst = sp.LoadFromSerializedProto(model);
  KVS_CHECK(lst.ok(), "tokenizer train: sentencepiece produced an unloadable model: {}", lst.ToString());
  std::string vocab;  // piece \t score, one per id: for people, not read back
  for (int id = 0; id < sp.GetPieceSize(); ++id) vocab += fmt::format("{}\t{}\n", sp.IdToPiece(id), sp.GetScore(id));

  TokenizerMeta m;
  m.type = "sentencepiece";
  m.model_type = "bpe";
  m.vocab_size = sp.GetPieceSize();
  m.bos_id = sp.bos_id();
  m.eos_id = sp.eos_id();
  m.unk_id = sp.unk_id();
  m.pad_id = sp.pad_id();
  m.sha256 = sha256_hex(model);
  nlohmann::json trainer = nlohmann::json::object();
  for (const auto& [k, v] : args)
    if (k != "num_threads" && k != "minloglevel") trainer[k] = v;
  trainer["sentences_total"] = r.sentences_total;
  trainer["sentences_used"] = r.sentences_used;
  trainer["input_bytes"] = r.bytes;
  m.trainer = trainer;  // nlohmann's object is a sorted map: stable bytes
  r.sha256 = m.sha256;
  write_dir_atomically(o.out,
                       {{kTokenizerModelFile, model},
                        {"tokenizer.vocab", vocab},
                        {kTokenizerMetaFile, tokenizer_meta_json(m).dump(2) + "\n"}});
  return r;
}

}  // namespace kvs
