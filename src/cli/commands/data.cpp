// `kvshift data prepare`: text files -> token shards + manifest.json with a
// trained tokenizer (docs/DATA.md, "data prepare").
#include <fmt/format.h>

#include <cstdio>

#include "cli/commands/commands.h"
#include "core/error.h"
#include "data/prepare.h"
#include "data/text_input.h"

namespace kvs::cli {

namespace {

void add_data_prepare(CLI::App& parent) {
  auto* cmd = parent.add_subcommand("prepare", "Tokenize text files into train/val token shards with a manifest");
  struct Args {
    PrepareOptions o;
    std::string input_list, text_key = "text";
    bool quiet = false, jsonl = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--tokenizer", a->o.tokenizer, "Tokenizer directory (from `kvshift tokenizer train`)")->required();
  cmd->add_option("--input", a->o.inputs, "UTF-8 text (or, with --jsonl, JSON Lines) files, in this order (repeatable); names ending in .gz or .zst are "
                  "decompressed");
  cmd->add_option("--input-list", a->input_list, "A file listing input paths, one per line (added after --input)");
  cmd->add_option("--out", a->o.out, "Output directory (written whole under a temp name, then renamed)")->required();
  cmd->add_option("--val-fraction", a->o.val_fraction,
                  "Fraction of documents held out for validation: every (1/F)-th document, in input order")
      ->capture_default_str();
  cmd->add_option("--threads", a->o.threads, "Encoding threads (0 = every core this process may use: its CPU affinity, capped by a cgroup CPU quota); the output does not depend on it")
      ->capture_default_str();
  cmd->add_option("--doc-split", a->o.split.mode,
                  "What a document is: file (each file), blank-lines (paragraphs between empty lines) or lines "
                  "(each line)")
      ->capture_default_str();
  auto* delimiter = cmd->add_option("--doc-delimiter", a->o.split.delimiter,
                  "Documents are separated by lines equal to this text (e.g. '<|endoftext|>'); overrides --doc-split");
  cmd->add_flag("--jsonl", a->jsonl,
                "Inputs are JSON Lines (as Hugging Face datasets export them): every line is a JSON object and one "
                "document, its --text-key field");
  cmd->add_option("--text-key", a->text_key, "With --jsonl: the field that holds a document's text")
      ->capture_default_str();
  cmd->add_option("--shard-tokens", a->o.shard_tokens, "Tokens per shard file (the last one of a split is shorter)")
      ->capture_default_str();
  cmd->add_flag("--force", a->o.force, "Replace an existing --out directory");
  cmd->add_flag("--quiet", a->quiet, "No progress line");
  // Hidden, for tests: simulate a crash (no clean-up) after this many shards.
  cmd->add_option("--crash-after-shards", a->o.crash_after_shards)->group("");
  cmd->callback([a, delimiter]() {
    PrepareOptions o = a->o;
    o.progress = !a->quiet;
    KVS_CHECK(delimiter->count() == 0 || !o.split.delimiter.empty(),
              "--doc-delimiter: empty (to split documents at empty lines: --doc-split blank-lines)");
    KVS_CHECK(a->jsonl || a->text_key == "text", "--text-key: names a field of JSON Lines input: needs --jsonl");
    KVS_CHECK(!a->jsonl || !a->text_key.empty(), "--text-key: must name a field");
    if (a->jsonl) o.split.jsonl_key = a->text_key;
    if (!a->input_list.empty())
      for (auto& p : read_input_list(a->input_list)) o.inputs.push_back(p);
    KVS_CHECK(!o.inputs.empty(), "data prepare: give --input FILE... or --input-list FILE");
    const PrepareResult r = prepare_data(o);
    // Compressed inputs: the files' size, then their text's (the rate is the text's).
    const std::string text = r.text_bytes != r.bytes ? fmt::format(" ({:.1f} MB of text)", r.text_bytes / 1e6) : "";
    std::printf("%s: %lld train tokens (%lld docs), %lld val tokens (%lld docs), %zu shards from %.1f MB%s in %.1f "
                "s (%.2f MB/s)\n",
                o.out.c_str(), static_cast<long long>(r.train_tokens), static_cast<long long>(r.train_docs),
                static_cast<long long>(r.val_tokens), static_cast<long long>(r.val_docs), r.shards.size(),
                r.bytes / 1e6, text.c_str(), r.seconds, r.seconds > 0 ? r.text_bytes / 1e6 / r.seconds : 0.0);
  });
}

}  // namespace

void add_data(CLI::App& app) {
  auto* cmd = app.add_subcommand("data", "Prepare training data: text files -> token shards (docs/DATA.md)");
  cmd->require_subcommand(1);
  add_data_prepare(*cmd);
}

}  // namespace kvs::cli
