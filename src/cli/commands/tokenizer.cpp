// `kvshift tokenizer train|encode`: train a sentencepiece BPE tokenizer as
// Llama 2's was trained, and look at what it does to a text (docs/TOKENIZER.md).
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands/commands.h"
#include "core/error.h"
#include "data/text_input.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/train.h"

namespace kvs::cli {

namespace {

void add_tokenizer_train(CLI::App& parent) {
  auto* cmd = parent.add_subcommand("train", "Train a sentencepiece BPE tokenizer (Llama 2's options) on text files");
  struct Args {
    TokenizerTrainOptions o;
    std::string input_list, text_key = "text";
    bool jsonl = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--input", a->o.inputs, "UTF-8 text files; every line is a training sentence (repeatable); names ending in .gz or .zst are "
                  "decompressed");
  cmd->add_option("--input-list", a->input_list, "A file listing input paths, one per line (added after --input)");
  cmd->add_option("--vocab-size", a->o.vocab_size, "Number of pieces, including <unk> <s> </s> and 256 byte pieces")
      ->capture_default_str();
  cmd->add_option("--out", a->o.out, "Tokenizer directory to create (written whole, or not at all)")->required();
  cmd->add_option("--max-sentences", a->o.max_sentences,
                  "Train on at most this many lines: an evenly spaced subset of all lines (deterministic)")
      ->capture_default_str();
  cmd->add_option("--character-coverage", a->o.character_coverage,
                  "Fraction of characters covered by pieces; the rarest rest is byte-encoded (Llama 2: 0.99995)")
      ->capture_default_str();
  cmd->add_flag("--jsonl", a->jsonl,
                "Inputs are JSON Lines (as Hugging Face datasets export them): the sentences are the lines of each "
                "line's --text-key field");
  cmd->add_option("--text-key", a->text_key, "With --jsonl: the field that holds a document's text")
      ->capture_default_str();
  cmd->add_flag("--force", a->o.force, "Replace an existing --out directory");
  cmd->callback([a]() {
    TokenizerTrainOptions o = a->o;
    KVS_CHECK(a->jsonl || a->text_key == "text", "--text-key: names a field of JSON Lines input: needs --jsonl");
    KVS_CHECK(!a->jsonl || !a->text_key.empty(), "--text-key: must name a field");
    if (a->jsonl) o.jsonl_key = a->text_key;
    if (!a->input_list.empty())
      for (auto& p : read_input_list(a->input_list)) o.inputs.push_back(p);
    KVS_CHECK(!o.inputs.empty(), "tokenizer train: give --input FILE... or --input-list FILE");
    const auto t0 = std::chrono::steady_clock::now();
    const TokenizerTrainResult r = train_tokenizer(o);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: sentencepiece bpe, %d pieces, trained on %lld of %lld lines (%.1f MB, %zu files) in %.1f s; "
                "sha256 %s\n",
                o.out.c_str(), o.vocab_size, static_cast<long long>(r.sentences_used),
                static_cast<long long>(r.sentences_total), r.bytes / 1e6, o.inputs.size(), s, r.sha256.c_str());
  });
}

void add_tokenizer_encode(CLI::App& parent) {
  auto* cmd = parent.add_subcommand("encode", "Show the token ids and vocabulary pieces of a text (no BOS/EOS added)");
  struct Args {
    std::string tokenizer, text;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--tokenizer", a->tokenizer, "Tokenizer directory")->required();
  cmd->add_option("--text", a->text, "The text to encode")->required();
  cmd->add_flag("--json", a->json, "Print one JSON object {ids, pieces}");
  cmd->callback([a]() {
    // As data prepare: text that is not UTF-8 is refused, not encoded as U+FFFD.
    if (const size_t bad = first_invalid_utf8(a->text); bad != std::string::npos)
      fail("--text: not UTF-8 text: invalid byte 0x{:02x} at byte offset {}", static_cast<unsigned char>(a->text[bad]),
           bad);
    const auto tok = load_tokenizer(a->tokenizer);
    const auto ids = tok->encode(a->text);
    std::vector<std::string> pieces;
    for (int32_t id : ids) pieces.push_back(tok->id_to_piece(id));
    if (a->json) {
      // The byte tokenizer's pieces may be partial UTF-8: replace rather than throw.
      std::printf("%s\n", nlohmann::json({{"ids", ids}, {"pieces", pieces}})
                              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                              .c_str());
      return;
    }
    std::printf("%zu tokens (%s)\n", ids.size(), tok->describe().c_str());
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%6d  [%s]\n", ids[i], pieces[i].c_str());
  });
}

}  // namespace

void add_tokenizer(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenizer", "Train and try sentencepiece tokenizers (docs/TOKENIZER.md)");
  cmd->require_subcommand(1);
  add_tokenizer_train(*cmd);
  add_tokenizer_encode(*cmd);
}

}  // namespace kvs::cli
