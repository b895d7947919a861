#include "data/prepare.h"

#include "data/compressed_input.h"

#include <omp.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/atomic_dir.h"
#include "core/cpu_budget.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "core/log.h"
#include "core/sha256.h"
#include "core/version.h"
#include "data/prepare_progress.h"
#include "data/shards.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_meta.h"

namespace kvs {
namespace {

namespace fs = std::filesystem;

int64_t input_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("{}: cannot read: {}", path, std::strerror(errno));
  KVS_CHECK(S_ISREG(st.st_mode), "{}: cannot read: not a regular file", path);
  return static_cast<int64_t>(st.st_size);
}

}  // namespace

std::string shard_file_name(const std::string& split, size_t index, int64_t shard_tokens) {
  // Six digits keep glob order (lexicographic) the stream order; a seventh would not.
  constexpr size_t kMaxShards = 1000000;
  KVS_CHECK(index < kMaxShards,
            "data prepare: the {} split needs more than {} shards of {} tokens: their names would no longer sort "
            "in stream order; raise --shard-tokens",
            split, kMaxShards, shard_tokens);
  return fmt::format("{}_{:06d}.bin", split, index);
}

namespace {

// One split's token stream, cut into shards of exactly shard_tokens (the last shorter).
class SplitWriter {
 public:
  SplitWriter(std::string dir, std::string split, int64_t shard_tokens, uint32_t token_bytes, int crash_after,
              int* shards_written)
      : dir_(std::move(dir)), split_(std::move(split)), shard_tokens_(shard_tokens), token_bytes_(token_bytes),
        crash_after_(crash_after), shards_written_(shards_written) {}
  void append(uint32_t t) {
    buf_.push_back(t);
    ++tokens_;
    if (static_cast<int64_t>(buf_.size()) == shard_tokens_) flush();
  }
  void finish() {
    if (!buf_.empty()) flush();
  }
  int64_t tokens() const { return tokens_; }
  int64_t docs = 0;
  nlohmann::json shards = nlohmann::json::array();

 private:
  void flush() {
    const std::string name = shard_file_name(split_, shards.size(), shard_tokens_);
    const std::string path = dir_ + "/" + name;
    write_shard(path, buf_, token_bytes_);  // temp name + rename (shards.h)
    shards.push_back({{"file", name}, {"tokens", buf_.size()}, {"sha256", sha256_file(path)}});
    buf_.clear();
    if (++*shards_written_ == crash_after_) std::_Exit(3);
  }
  std::string dir_, split_;
  int64_t shard_tokens_;
  uint32_t token_bytes_;
  int crash_after_;
  int* shards_written_;
  std::vector<uint32_t> buf_;
  int64_t tokens_ = 0;
};

struct FileCheck {
  std::string sha256;
  size_t bad_utf8 = std::string::npos;
};

}  // namespace

PrepareResult prepare_data(const PrepareOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  KVS_CHECK(!o.inputs.empty(), "data prepare: no --input files");
  KVS_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, "--val-fraction must be in [0, 1) (got {})", o.val_fraction);
  KVS_CHECK(o.shard_tokens > 0, "--shard-tokens must be positive (got {})", o.shard_tokens);
  KVS_CHECK(o.threads >= 0, "--threads must be >= 0 (got {})", o.threads);
  validate_doc_split(o.split);
  check_atomic_target(o.out, o.force);  // and removes what a killed run left beside it
  std::vector<std::string> read = o.inputs;
  read.push_back(o.tokenizer);
  check_output_holds_no_input(o.out, read);
  const int threads = resolve_threads(o.threads);

  const TokenizerMeta meta = read_tokenizer_meta(o.tokenizer);
  const auto tok = load_tokenizer(o.tokenizer);
  const uint32_t token_bytes = shard_token_bytes(tok->vocab_size());
  const int bos = tok->bos_id(), eos = tok->eos_id();

  std::vector<int64_t> sizes;
  int64_t total_bytes = 0;
  for (const auto& f : o.inputs) total_bytes += sizes.emplace_back(input_size(f));  // unreadable: fail early

  const std::string tmp = begin_atomic_dir(o.out);
  PrepareResult r;
  nlohmann::json sources = nlohmann::json::array();
  try {
    int shards_written = 0;
    SplitWriter train(tmp, "train", o.shard_tokens, token_bytes, o.crash_after_shards, &shards_written);
    SplitWriter val(tmp, "val", o.shard_tokens, token_bytes, o.crash_after_shards, &shards_written);
    PrepareProgress progress(total_bytes, o.progress);
    int64_t doc_index = 0;
    const long double f = o.val_fraction;

    for (size_t first = 0; first < o.inputs.size();) {
      // A batch of whole files (at least one) of about o.batch_bytes: bounded memory, and enough documents per
      // batch to keep every thread busy.
      size_t end = first;
      int64_t batch_bytes = 0;
      while (end < o.inputs.size() && (end == first || batch_bytes + sizes[end] <= o.batch_bytes))
        batch_bytes += sizes[end++];
      std::vector<std::string> texts;
      for (size_t i = first; i < end; ++i) texts.push_back(read_input_bytes(o.inputs[i]));  // .gz, .zst decompressed

      std::vector<FileCheck> checks(texts.size());
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
      for (size_t i = 0; i < texts.size(); ++i) {
        checks[i].sha256 = sha256_hex(texts[i]);
        checks[i].bad_utf8 = first_invalid_utf8(texts[i]);
      }
      struct Doc {
        size_t file;
        std::string_view text;
      };
      std::vector<Doc> docs;
      std::vector<std::vector<std::string>> decoded(texts.size());  // --jsonl: the documents docs point into
      for (size_t i = 0; i < texts.size(); ++i) {
        const std::string& path = o.inputs[first + i];
        if (checks[i].bad_utf8 != std::string::npos)
          fail("{}: not UTF-8 text: invalid byte 0x{:02x} at byte offset {}", path,
               static_cast<unsigned char>(texts[i][checks[i].bad_utf8]), checks[i].bad_utf8);
        size_t count = 0;
        if (!o.split.jsonl_key.empty()) {
          decoded[i] = jsonl_documents(texts[i], o.split.jsonl_key, path);
          for (const std::string& d : decoded[i]) docs.push_back({i, d});
          count = decoded[i].size();
        } else {
          const auto split = split_documents(texts[i], o.split);
          for (auto d : split) docs.push_back({i, d});
          count = split.size();
        }
        sources.push_back({{"path", path},
                           {"bytes", texts[i].size()},
                           {"sha256", checks[i].sha256},
                           {"documents", count}});
        if (count == 0) progress.add(sizes[first + i], 0);
      }

      std::vector<std::vector<int32_t>> ids(docs.size());
      std::vector<std::exception_ptr> errors(docs.size());
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
      for (size_t d = 0; d < docs.size(); ++d) {
        try {
          ids[d] = tok->encode(docs[d].text);
        } catch (...) {
          errors[d] = std::current_exception();
        }
        // Bytes of the file are credited with its last document, so 100% = all bytes.
        const bool last_of_file = d + 1 == docs.size() || docs[d + 1].file != docs[d].file;
        progress.add(last_of_file ? sizes[first + docs[d].file] : 0, 1);
      }
      for (size_t d = 0; d < docs.size(); ++d) {
        if (errors[d]) std::rethrow_exception(errors[d]);
        const bool to_val = std::floor((doc_index + 1) * f) > std::floor(doc_index * f);
        ++doc_index;
        SplitWriter& w = to_val ? val : train;
        ++w.docs;
        if (bos >= 0) w.append(static_cast<uint32_t>(bos));
        for (int32_t t : ids[d]) w.append(static_cast<uint32_t>(t));
        if (eos >= 0) w.append(static_cast<uint32_t>(eos));
      }
      r.bytes += batch_bytes;
      first = end;
    }
    KVS_CHECK(doc_index > 0, "data prepare: empty corpus: the {} input file(s) hold no text (first: {})",
              o.inputs.size(), o.inputs[0]);
    train.finish();
    val.finish();
    progress.finish();

    r.train_tokens = train.tokens();
    r.val_tokens = val.tokens();
    r.train_docs = train.docs;
    r.val_docs = val.docs;
    for (const auto* w : {&train, &val})
      for (const auto& s : w->shards) r.shards.push_back(s["file"]);
    nlohmann::json manifest = {
        {"format", "kvshift token shards (docs/DATA.md)"},
        {"kvshift", {{"commit", git_commit()}}},
        {"tokenizer",
         {{"dir", fs::absolute(o.tokenizer).lexically_normal().string()},
          {"type", meta.type},
          {"vocab_size", tok->vocab_size()},
          {"sha256", meta.sha256}}},
        {"token_bytes", token_bytes},
        {"framing",
         {{"bos_id", bos},
          {"eos_id", eos},
          {"document", bos >= 0 ? "<bos> tokens <eos>, documents back to back" : "tokens, documents back to back"}}},
        {"doc_split", !o.split.jsonl_key.empty()
                          ? nlohmann::json{{"mode", "jsonl"}, {"text_key", o.split.jsonl_key}}
                          : nlohmann::json{{"mode", o.split.delimiter.empty() ? o.split.mode : "delimiter"},
                                           {"delimiter", o.split.delimiter}}},
        {"val_fraction", o.val_fraction},
        {"val_rule", "document g (0-based, input order) is val iff floor((g+1)*f) > floor(g*f)"},
        {"shard_tokens", o.shard_tokens},
        {"splits",
         {{"train", {{"tokens", r.train_tokens}, {"documents", r.train_docs}, {"shards", train.shards}}},
          {"val", {{"tokens", r.val_tokens}, {"documents", r.val_docs}, {"shards", val.shards}}}}},
        {"sources", sources},
    };
    write_json_file(tmp + "/manifest.json", manifest);  // last: the directory is now complete
    commit_atomic_dir(tmp, o.out, o.force);
  } catch (...) {
    abandon_atomic_dir(tmp);
    throw;
  }
  if (o.val_fraction > 0 && r.val_docs == 0)
    spdlog::warn("data prepare: --val-fraction {} but only {} document(s): the val split is empty", o.val_fraction,
                 r.train_docs);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kvs
