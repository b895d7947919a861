// Tokenizers: the byte tokenizer, sentencepiece training (Llama 2 options,
// determinism, atomic output, input errors) and loading a tokenizer directory.
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/sha256.h"
#include "data/text_input.h"
#include "test_util.h"
#include "text_corpus_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_meta.h"
#include "tokenizer/train.h"

namespace kvs {
namespace {

using testing_util::corpus_text;
using testing_util::shared_tokenizer_dir;
using testing_util::slurp;
using testing_util::spit;
using testing_util::TmpDir;

// Text the trainer never saw: emoji, CJK, tabs, whitespace runs, CRLF, digits,
// a ligature NFKC would rewrite ("ﬁ" -> "fi"), leading/trailing spaces.
const std::vector<std::string> kVaried = {
    "the attention model learns to copy tokens.",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\t\ttabs, runs     of spaces\n\n\nand newlines\r\n",
    "digits 1234567890 and 3.14159 and -42",
    "unicode: café naïve Grüße Ελληνικά 日本語 🦀 ﬁne ①",
    "\n starts with a newline",
    "",
    " ",
    "a",
};

TEST(TokenizerBytes, RoundTripAndIds) {
  auto t = make_byte_tokenizer();
  EXPECT_EQ(t->vocab_size(), 256);
  EXPECT_EQ(t->bos_id(), -1);
  EXPECT_EQ(t->eos_id(), -1);
  const std::string text("h\xc3\xa9\x00\xff!", 6);
  const auto ids = t->encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{'h', 0xc3, 0xa9, 0, 0xff, '!'}));
  EXPECT_EQ(t->decode(ids), text);
  EXPECT_EQ(t->describe(), "bytes (256)");
  EXPECT_KVS_ERROR(t->decode({1, 256}), "256", "position 1");
}

TEST(TokenizerTrain, LlamaSpecialsAndMeta) {
  const std::string dir = shared_tokenizer_dir();
  auto t = load_tokenizer(dir);
  EXPECT_EQ(t->vocab_size(), 500);
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  const TokenizerMeta m = read_tokenizer_meta(dir);
  EXPECT_EQ(m.type, "sentencepiece");
  EXPECT_EQ(m.model_type, "bpe");
  EXPECT_EQ(m.unk_id, 0);
  EXPECT_EQ(m.pad_id, -1);
  EXPECT_EQ(m.sha256, sha256_file(dir + "/tokenizer.model"));
  EXPECT_EQ(m.trainer["byte_fallback"], "true");
  EXPECT_EQ(m.trainer["normalization_rule_name"], "identity");
  EXPECT_NE(t->describe().find("500 pieces"), std::string::npos) << t->describe();
  // Special tokens decode to nothing.
  EXPECT_EQ(t->decode({1, 2}), "");
}

TEST(TokenizerTrain, RoundTripVariedText) {
  auto t = load_tokenizer(shared_tokenizer_dir());
  for (const std::string& s : kVaried) EXPECT_EQ(t->decode(t->encode(s)), s) << "text: [" << s << "]";
  const std::string corpus = corpus_text(200, 7);  // unseen lines of the training distribution
  const auto ids = t->encode(corpus);
  EXPECT_EQ(t->decode(ids), corpus);
  EXPECT_LT(ids.size(), corpus.size() / 2) << "BPE should compress its own training distribution";
  for (int32_t id : ids) EXPECT_NE(id, 0) << "byte fallback means no <unk>";
}

TEST(TokenizerTrain, ByteFallbackAndSplitDigits) {
  auto t = load_tokenizer(shared_tokenizer_dir());
  // An unseen character becomes its UTF-8 bytes: pieces <0x00>..<0xFF> are ids 3..258.
  const auto crab = t->encode("🦀");
  std::vector<int32_t> bytes;
  for (int32_t id : crab)
    if (id >= 3 && id < 259) bytes.push_back(id - 3);
  EXPECT_EQ(bytes, (std::vector<int32_t>{0xF0, 0x9F, 0xA6, 0x80})) << "ids: " << ::testing::PrintToString(crab);
  EXPECT_EQ(t->id_to_piece(3 + 0xF0), "<0xF0>");
  EXPECT_EQ(t->id_to_piece(1), "<s>");
  // split_digits: every digit is its own piece (a leading "▁" piece is allowed).
  const auto ids = t->encode("9876543210");
  std::string digits;
  for (int32_t id : ids) {
    const std::string piece = t->decode({id});
    if (piece.empty() || piece == " ") continue;
    EXPECT_EQ(piece.size(), 1u) << "piece [" << piece << "]";
    digits += piece;
  }
  EXPECT_EQ(digits, "9876543210");
  // Identity normalization: no NFKC ("ﬁ" stays a ligature, "①" stays a circled one).
  EXPECT_EQ(t->decode(t->encode("ﬁ①")), "ﬁ①");
}

TEST(TokenizerTrain, DeterministicAcrossRuns) {
  TmpDir tmp;
  spit(tmp / "a.txt", corpus_text(800, 3));
  spit(tmp / "b.txt", corpus_text(300, 4));
  TokenizerTrainOptions o;
  o.inputs = {tmp / "a.txt", tmp / "b.txt"};
  o.vocab_size = 400;
  o.out = tmp / "t1";
  train_tokenizer(o);
  o.out = tmp / "t2";
  train_tokenizer(o);
  const std::string m1 = slurp(tmp / "t1/tokenizer.model");
  ASSERT_GT(m1.size(), 1000u);
  EXPECT_EQ(m1, slurp(tmp / "t2/tokenizer.model"));
  EXPECT_EQ(slurp(tmp / "t1/kvshift_tokenizer.json"), slurp(tmp / "t2/kvshift_tokenizer.json"));
}

TEST(TokenizerTrain, SubsampleIsEvenlySpacedAndDeterministic) {
  TmpDir tmp;
  spit(tmp / "a.txt", corpus_text(1000, 5));
  TokenizerTrainOptions o;
  o.inputs = {tmp / "a.txt"};
  o.vocab_size = 380;
  o.max_sentences = 300;
  o.out = tmp / "t1";
  const auto r = train_tokenizer(o);
  EXPECT_EQ(r.sentences_total, 1000);
  EXPECT_EQ(r.sentences_used, 300);
  o.out = tmp / "t2";
  train_tokenizer(o);
  EXPECT_EQ(slurp(tmp / "t1/tokenizer.model"), slurp(tmp / "t2/tokenizer.model"));
  // Evenly spaced: the same model as training on sentences i with
  // floor((i+1) M / N) > floor(i M / N) written out by hand (N = 1000 lines, M = 300).
  std::vector<std::string> lines;
  const std::string all = slurp(tmp / "a.txt");
  for (size_t pos = 0, nl; pos < all.size(); pos = nl + 1) {
    nl = all.find('\n', pos);
    if (nl == std::string::npos) nl = all.size();
    const std::string line = all.substr(pos, nl - pos);
    if (line.find_first_not_of(" \t\f\v\r") != std::string::npos) lines.push_back(line);
  }
  ASSERT_EQ(lines.size(), 1000u);
  std::string picked;
  for (size_t i = 0; i < lines.size(); ++i)
    if ((i + 1) * 300 / 1000 != i * 300 / 1000) picked += lines[i] + "\n";
  spit(tmp / "picked.txt", picked);
  o.inputs = {tmp / "picked.txt"};
  o.max_sentences = TokenizerTrainOptions{}.max_sentences;
  o.out = tmp / "t3";
  EXPECT_EQ(train_tokenizer(o).sentences_used, 300);
  EXPECT_EQ(slurp(tmp / "t1/tokenizer.model"), slurp(tmp / "t3/tokenizer.model"));
}

// The subsample counts sentences across files: the same corpus split into two files after line 333 trains the
// same model. (There i * M / N = 99.9 is not whole, so restarting the count in each file would pick other lines,
// and 99 + 200 = 299 of them.)
TEST(TokenizerTrain, SubsampleSpansFiles) {
  TmpDir tmp;
  const std::string all = corpus_text(1000, 5);
  size_t cut = 0;  // just after the 333rd sentence (corpus_text's blank lines are empty)
  for (int sentences = 0; sentences < 333; cut = all.find('\n', cut) + 1)
    if (all[cut] != '\n') ++sentences;
  spit(tmp / "all.txt", all);
  spit(tmp / "a.txt", all.substr(0, cut));
  spit(tmp / "b.txt", all.substr(cut));
  TokenizerTrainOptions o;
  o.vocab_size = 380;
  o.max_sentences = 300;
  o.inputs = {tmp / "all.txt"};
  o.out = tmp / "one";
  const auto one = train_tokenizer(o);
  o.inputs = {tmp / "a.txt", tmp / "b.txt"};
  o.out = tmp / "two";
  const auto two = train_tokenizer(o);
  EXPECT_EQ(one.sentences_total, 1000);
  EXPECT_EQ(two.sentences_total, 1000);
  EXPECT_EQ(one.sentences_used, 300);
  EXPECT_EQ(two.sentences_used, 300);
  EXPECT_EQ(slurp(tmp / "one/tokenizer.model"), slurp(tmp / "two/tokenizer.model"));
}

// Long lines with no space to cut at are cut at a character boundary: every piece is valid UTF-8 of at most
// kMaxSentenceBytes, and the pieces back to back are the line (a cut drops nothing; '\n' ends a line).
TEST(TokenizerTrain, SentenceSplitterCutsAtCharacterBoundaries) {
  auto expect_pieces = [](const std::string& line, size_t n) {
    const std::string text = line + "\n";
    const std::vector<std::string_view> pieces = split_sentences(text);
    ASSERT_EQ(pieces.size(), n);
    std::string joined;
    for (std::string_view p : pieces) {
      EXPECT_LE(p.size(), kMaxSentenceBytes);
      EXPECT_EQ(first_invalid_utf8(p), std::string_view::npos) << "piece of " << p.size() << " bytes at byte "
                                                               << joined.size();
      joined += p;
    }
    EXPECT_TRUE(joined == line) << "the pieces differ from the line";  // (no dump of kilobytes)
  };
  std::string cjk;
  for (int i = 0; i < 2000; ++i) cjk += "日";  // 6000 bytes, no space; byte 4192 is inside a character
  expect_pieces(cjk, 2);
  // The only space is at 0, where a cut would leave an empty piece; byte 4192 is inside an "é".
  std::string spaced = " ";
  for (int i = 0; i < 2500; ++i) spaced += "é";
  expect_pieces(spaced, 2);
  // Lines: '\r' before '\n' dropped, blank ones skipped, a last line without '\n' kept.
  EXPECT_EQ(split_sentences("a b\r\n\n \t\nc"), (std::vector<std::string_view>{"a b", "c"}));
}

// sentencepiece drops sentences over 4192 bytes; we cut long lines instead.
TEST(TokenizerTrain, LongLinesAreCutNotDropped) {
  TmpDir tmp;
  std::string line;
  for (int i = 0; i < 3000; ++i) line += i % 3 ? "kernel memory " : "scheduler ";
  spit(tmp / "long.txt", line + "\n");
  TokenizerTrainOptions o;
  o.inputs = {tmp / "long.txt"};
  o.vocab_size = 300;
  o.out = tmp / "tok";
  const auto r = train_tokenizer(o);
  EXPECT_EQ(r.sentences_total, static_cast<int64_t>((line.size() - 1) / 4192 + 1));
  auto t = load_tokenizer(o.out);
  EXPECT_EQ(t->encode("scheduler kernel memory").size(), 3u) << "the long line was learned from";
}

TEST(TokenizerTrain, InputErrorsNameTheFileAndLeaveNoOutput) {
  TmpDir tmp;
  spit(tmp / "good.txt", corpus_text(50, 1));
  spit(tmp / "bad.txt", "fine text\nthen \xff a bad byte\n");
  spit(tmp / "empty.txt", "");
  spit(tmp / "blank.txt", "\n \n\t\n");
  TokenizerTrainOptions o;
  o.vocab_size = 400;
  o.out = tmp / "tok";
  o.inputs = {tmp / "good.txt", tmp / "bad.txt"};
  EXPECT_KVS_ERROR(train_tokenizer(o), tmp / "bad.txt", "not UTF-8", "0xff", "byte offset 15");
  o.inputs = {tmp / "good.txt", tmp / "missing.txt"};
  EXPECT_KVS_ERROR(train_tokenizer(o), tmp / "missing.txt", "cannot read");
  o.inputs = {tmp / "empty.txt", tmp / "blank.txt"};
  EXPECT_KVS_ERROR(train_tokenizer(o), "empty corpus", tmp / "empty.txt");
  o.inputs = {tmp / "good.txt"};
  o.vocab_size = 100;
  EXPECT_KVS_ERROR(train_tokenizer(o), "--vocab-size 100");
  // Nothing was left behind: no tokenizer, no temp directory.
  for (const auto& e : std::filesystem::directory_iterator(tmp.str()))
    EXPECT_EQ(e.path().extension(), ".txt") << e.path();
}

TEST(TokenizerTrain, ExistingOutputNeedsForceAndIsReplacedWhole) {
  TmpDir tmp;
  spit(tmp / "a.txt", corpus_text(300, 1));
  spit(tmp / "b.txt", corpus_text(300, 2) + "zzzz qqqq zzzz qqqq xxxx\n");
  TokenizerTrainOptions o;
  o.inputs = {tmp / "a.txt"};
  o.vocab_size = 390;
  o.out = tmp / "tok";
  train_tokenizer(o);
  const std::string first = slurp(tmp / "tok/tokenizer.model");
  o.inputs = {tmp / "b.txt"};
  EXPECT_KVS_ERROR(train_tokenizer(o), tmp / "tok", "already exists", "--force");
  EXPECT_EQ(slurp(tmp / "tok/tokenizer.model"), first);
  o.force = true;
  train_tokenizer(o);
  EXPECT_NE(slurp(tmp / "tok/tokenizer.model"), first);
  EXPECT_NO_THROW(load_tokenizer(tmp / "tok"));
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(tmp.str())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a.txt", "b.txt", "tok"}));
}

TEST(TokenizerLoad, ErrorsNameTheFile) {
  TmpDir tmp;
  EXPECT_KVS_ERROR(load_tokenizer(tmp / "nope"), tmp / "nope", "not a tokenizer directory");
  std::filesystem::create_directories(tmp / "empty");
  EXPECT_KVS_ERROR(load_tokenizer(tmp / "empty"), tmp / "empty/kvshift_tokenizer.json", "missing");
  // A copy of the shared tokenizer, then broken in different ways.
  const std::string src = shared_tokenizer_dir();
  const std::string dir = tmp / "tok";
  std::filesystem::copy(src, dir);
  ASSERT_NO_THROW(load_tokenizer(dir));
  const std::string meta = slurp(dir + "/kvshift_tokenizer.json");
  const std::string model = slurp(dir + "/tokenizer.model");

  spit(dir + "/tokenizer.model", model.substr(0, model.size() / 2));
  EXPECT_KVS_ERROR(load_tokenizer(dir), dir + "/tokenizer.model", "sha256");
  spit(dir + "/tokenizer.model", model);

  auto j = nlohmann::json::parse(meta);
  j["vocab_size"] = 501;
  spit(dir + "/kvshift_tokenizer.json", j.dump());
  EXPECT_KVS_ERROR(load_tokenizer(dir), dir + "/tokenizer.model", "500 pieces", "501");
  j = nlohmann::json::parse(meta);
  j["type"] = "wordpiece";
  spit(dir + "/kvshift_tokenizer.json", j.dump());
  EXPECT_KVS_ERROR(load_tokenizer(dir), dir + "/kvshift_tokenizer.json", "'type'", "wordpiece");
  j = nlohmann::json::parse(meta);
  j.erase("eos_id");
  spit(dir + "/kvshift_tokenizer.json", j.dump());
  EXPECT_KVS_ERROR(load_tokenizer(dir), dir + "/kvshift_tokenizer.json", "'eos_id'");
  spit(dir + "/kvshift_tokenizer.json", "{not json");
  EXPECT_KVS_ERROR(load_tokenizer(dir), dir + "/kvshift_tokenizer.json", "invalid JSON");

  // "type": "bytes" needs no model file.
  spit(dir + "/kvshift_tokenizer.json", R"({"type": "bytes"})");
  EXPECT_EQ(load_tokenizer(dir)->describe(), "bytes (256)");
}

// Text built to make cuts go wrong: runs of spaces and newlines, lines that
// start with spaces, tabs, CRLF, literal "▁" (sentencepiece's escaped space)
// beside real spaces, unseen characters (byte fallback), digits, words glued
// to each other without a space.
std::string cut_hostile_text(size_t bytes, uint64_t seed) {
  static const std::vector<std::string> bits = {
      " ",    "  ",     "   ", "\n", "\n\n", " \n", "\n ", "\n  ", "\t", "\r\n", "▁", "▁▁", " ▁", "▁ ", "x▁y", "日本語",
      "🦀",   "12345", ".",   ",",  "the",  "attention", "model", "copy", "tokens", "café", "Ελληνικά", "über"};
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  std::string s;
  while (s.size() < bytes) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    s += bits[(x >> 33) % bits.size()];
    if ((x >> 20) % 3 == 0) s += ' ';
  }
  return s;
}

// encode(text) through safe_cuts, as data prepare does it: the ids the pieces give, concatenated.
std::vector<int32_t> encode_in_pieces(const Tokenizer& tok, std::string_view text, size_t max_bytes) {
  const std::vector<size_t> cuts = tok.safe_cuts(text, max_bytes);
  std::vector<int32_t> ids;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const size_t begin = i == 0 ? 0 : cuts[i - 1], end = i == cuts.size() ? text.size() : cuts[i];
    const std::string_view piece = text.substr(begin, end - begin);
    const auto part = i == 0 ? tok.encode(piece) : tok.encode_after_cut(piece);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

TEST(TokenizerPieces, CutTextsGiveTheWholeTextsIds) {
  // kvshift's tokenizer, trained on such text too, so that it has pieces of
  // whitespace runs ("▁▁") a wrong cut would split.
  TmpDir tmp;
  spit(tmp / "train.txt", corpus_text(1500, 1) + cut_hostile_text(100000, 99));
  TokenizerTrainOptions o;
  o.inputs = {tmp / "train.txt"};
  o.vocab_size = 600;
  o.out = tmp / "tok";
  train_tokenizer(o);
  const auto sp = load_tokenizer(o.out);
  bool has_space_run = false;
  for (int id = 0; id < sp->vocab_size(); ++id) has_space_run |= sp->id_to_piece(id) == "▁▁";
  ASSERT_TRUE(has_space_run);
  const auto bytes = make_byte_tokenizer();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    std::string text = cut_hostile_text(20000, seed);
    if (seed == 2) text = " \n" + text;      // starts with a space and a newline
    if (seed == 3) text += "\n\n";          // ends with newlines
    if (seed == 4) text = corpus_text(300, 9);  // the training distribution
    for (const Tokenizer* tok : {sp.get(), bytes.get()}) {
      const std::vector<int32_t> whole = tok->encode(text);
      for (size_t max_bytes : {1, 7, 33, 100, 1000}) {
        const std::vector<size_t> cuts = tok->safe_cuts(text, max_bytes);
        // Cuts are many (the test would pass vacuously without them), ascending and inside the text.
        EXPECT_GE(cuts.size(), max_bytes < 33 ? text.size() / 33 : text.size() / max_bytes / 4)
            << tok->describe() << " max " << max_bytes;
        for (size_t i = 0; i < cuts.size(); ++i) {
          ASSERT_GT(cuts[i], i == 0 ? 0 : cuts[i - 1]);
          ASSERT_LT(cuts[i], text.size());
        }
        EXPECT_EQ(encode_in_pieces(*tok, text, max_bytes), whole)
            << tok->describe() << ", seed " << seed << ", pieces of about " << max_bytes << " bytes";
      }
    }
  }
  // No cut where none is safe: a long run without newlines or word starts stays whole.
  EXPECT_TRUE(sp->safe_cuts(std::string(5000, 'a'), 100).empty());
  EXPECT_TRUE(sp->safe_cuts("  ▁ ▁ ▁▁  ▁", 1).empty());  // a space after a space or a literal "▁"
  // One long line is cut before its words.
  const std::string line = corpus_text(200, 5);
  std::string one_line = line;
  std::replace(one_line.begin(), one_line.end(), '\n', ' ');
  const auto cuts = sp->safe_cuts(one_line, 500);
  EXPECT_GE(cuts.size(), one_line.size() / 500 - 1);
  for (size_t c : cuts) EXPECT_EQ(one_line[c], ' ');
  EXPECT_EQ(encode_in_pieces(*sp, one_line, 500), sp->encode(one_line));
}

// A sentencepiece tokenizer directory trained with kvshift's options changed by `changes`.
std::string train_variant(const std::filesystem::path& dir, const std::unordered_map<std::string, std::string>& changes) {
  std::filesystem::create_directories(dir);
  spit((dir / "train.txt").string(), corpus_text(1500, 1));
  std::unordered_map<std::string, std::string> args = {
      {"input", (dir / "train.txt").string()}, {"model_type", "bpe"}, {"vocab_size", "400"},
      {"byte_fallback", "true"}, {"split_by_whitespace", "true"}, {"allow_whitespace_only_pieces", "true"},
      {"normalization_rule_name", "identity"}, {"add_dummy_prefix", "true"}, {"remove_extra_whitespaces", "false"},
      {"unk_id", "0"}, {"bos_id", "1"}, {"eos_id", "2"}, {"pad_id", "-1"}, {"minloglevel", "2"}};
  for (const auto& [k, v] : changes) args[k] = v;
  std::string model;
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, nullptr, &model);
  EXPECT_TRUE(st.ok()) << st.ToString();
  spit((dir / "tokenizer.model").string(), model);
  spit((dir / "kvshift_tokenizer.json").string(),
       tokenizer_meta_json(sentencepiece_meta(model, args["model_type"], "test")).dump());
  return dir.string();
}

TEST(TokenizerPieces, ModelsThatCouldMergeAcrossACutAreNotCut) {
  TmpDir tmp;
  const std::string text = cut_hostile_text(5000, 11);
  auto cuts_of = [&](const std::string& name, const std::unordered_map<std::string, std::string>& changes) {
    const auto tok = load_tokenizer(train_variant(tmp / name, changes));
    EXPECT_EQ(encode_in_pieces(*tok, text, 50), tok->encode(text)) << name;
    return tok->safe_cuts(text, 50);
  };
  // kvshift's own options: cut after newlines and before words.
  const auto plain = cuts_of("plain", {});
  bool before_word = false;
  for (size_t c : plain) before_word |= text[c] == ' ';
  EXPECT_GT(plain.size(), 40u);
  EXPECT_TRUE(before_word);
  // Each of these can join text across a cut (or shift the dummy prefix), so nothing is cut.
  EXPECT_TRUE(cuts_of("unigram", {{"model_type", "unigram"}}).empty());   // Viterbi sums scores in floats
  EXPECT_TRUE(cuts_of("nfkc", {{"normalization_rule_name", "nmt_nfkc"}}).empty());  // maps newlines to spaces
  EXPECT_TRUE(cuts_of("collapse", {{"remove_extra_whitespaces", "true"}}).empty());
  EXPECT_TRUE(cuts_of("suffix", {{"treat_whitespace_as_suffix", "true"}}).empty());
  EXPECT_TRUE(cuts_of("no_fallback", {{"byte_fallback", "false"}}).empty());  // runs of <unk> merge
  EXPECT_TRUE(cuts_of("newline_piece", {{"user_defined_symbols", "\nthe"}}).empty());
  // A piece with "▁" after a letter: only the newline cuts are left.
  const auto newline_only = cuts_of("glued_space", {{"user_defined_symbols", "x▁y"}});
  EXPECT_FALSE(newline_only.empty());
  for (size_t c : newline_only) EXPECT_EQ(text[c - 1], '\n');
}

TEST(TokenizerSha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::string million(1000000, 'a');  // FIPS 180-2 long message; also crosses block buffering
  EXPECT_EQ(sha256_hex(million), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

}  // namespace
}  // namespace kvs
