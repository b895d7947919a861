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

struct Doc {
  size_t file;  // in the batch
  std::string_view text;
};

// What the encoding threads take: a whole document, or a piece of a long one.
struct Unit {
  std::string_view text;
  bool after_cut;   // not the document's first piece
  bool last_piece;  // the document ends here
  int64_t credit;   // this piece's share of its file's bytes, for the progress line
};

// A batch's documents as units, a window at a time, so that only a window's
// ids are ever held. A long document is cut where its tokenizer proves the
// ids unchanged (Tokenizer::safe_cuts); its pieces may span windows. Credits
// add up to each file's size, so the progress line moves inside a large file.
class UnitStream {
 public:
  UnitStream(const std::vector<Doc>& docs, std::vector<int64_t> file_bytes, const Tokenizer& tok, int64_t piece_bytes)
      : docs_(docs), file_bytes_(std::move(file_bytes)), file_text_(file_bytes_.size(), 0), tok_(tok),
        piece_bytes_(piece_bytes) {
    for (const Doc& d : docs_) file_text_[d.file] += static_cast<int64_t>(d.text.size());
  }
  // The next units, about window_bytes of text (at least one); false when none are left.
  bool next_window(int64_t window_bytes, std::vector<Unit>& units) {
    units.clear();
    int64_t window = 0;
    while (doc_ < docs_.size() && (units.empty() || window + next_size() <= window_bytes)) {
      window += next_size();
      units.push_back(take());
    }
    return !units.empty();
  }

 private:
  size_t piece_end() const { return piece_ < cuts_.size() ? cuts_[piece_] : docs_[doc_].text.size(); }
  int64_t next_size() {
    if (!cut_) {  // first visit of this document: where to cut it
      cuts_.clear();
      if (static_cast<int64_t>(docs_[doc_].text.size()) > piece_bytes_)
        cuts_ = tok_.safe_cuts(docs_[doc_].text, static_cast<size_t>(piece_bytes_));
      piece_ = 0;
      cut_ = true;
    }
    return static_cast<int64_t>(piece_end() - (piece_ == 0 ? 0 : cuts_[piece_ - 1]));
  }
  Unit take() {
    const Doc& d = docs_[doc_];
    if (d.file != file_) file_ = d.file, done_ = credited_ = 0;
    const size_t begin = piece_ == 0 ? 0 : cuts_[piece_ - 1], end = piece_end();
    done_ += static_cast<int64_t>(end - begin);
    const int64_t size = file_bytes_[d.file], text = file_text_[d.file];
    const int64_t upto = text > 0 ? static_cast<int64_t>(static_cast<__int128>(size) * done_ / text) : size;
    Unit u{d.text.substr(begin, end - begin), piece_ > 0, end == d.text.size(), upto - credited_};
    credited_ = upto;
    if (u.last_piece) {
      ++doc_;
      cut_ = false;
    } else {
      ++piece_;
    }
    return u;
  }
  const std::vector<Doc>& docs_;
  std::vector<int64_t> file_bytes_, file_text_;
  const Tokenizer& tok_;
  int64_t piece_bytes_;
  size_t doc_ = 0, piece_ = 0, file_ = SIZE_MAX;
  bool cut_ = false;  // cuts_ holds docs_[doc_]'s cuts
  std::vector<size_t> cuts_;
  int64_t done_ = 0, credited_ = 0;
};

struct FileCheck {
  std::string sha256;
  size_t bad_utf8 = std::string::npos;
};

}  // namespace

int64_t floor_times(int64_t x, double f) {
  KVS_CHECK(x >= 0 && f >= 0 && f < 1, "floor_times: x {} and f {} out of range", x, f);
  int exp = 0;
  const double frac = std::frexp(f, &exp);  // f = frac * 2^exp, frac in [0.5, 1) (0 for f = 0)
  const auto m = static_cast<uint64_t>(std::ldexp(frac, 53));  // exact: 53 significant bits
  const int k = 53 - exp;  // f = m / 2^k; exp <= 0, so k >= 53
  if (k >= 128) return 0;
  return static_cast<int64_t>((static_cast<unsigned __int128>(static_cast<uint64_t>(x)) * m) >> k);
}

PrepareResult prepare_data(const PrepareOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  KVS_CHECK(!o.inputs.empty(), "data prepare: no --input files");
  warn_repeated_inputs(o.inputs, "data prepare");
  KVS_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, "--val-fraction must be in [0, 1) (got {})", o.val_fraction);
  KVS_CHECK(o.shard_tokens > 0, "--shard-tokens must be positive (got {})", o.shard_tokens);
  KVS_CHECK(o.threads >= 0, "--threads must be >= 0 (got {})", o.threads);
  KVS_CHECK(o.piece_bytes > 0 && o.window_bytes > 0, "data prepare: piece and window sizes must be positive");
  validate_doc_split(o.split);
  std::vector<std::string> read = o.inputs;
  read.push_back(o.tokenizer);
  check_output_holds_no_input(o.out, read);
  check_atomic_target(o.out, o.force, "manifest.json");  // and removes what a killed run left beside it
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
  int shards_written = 0;
  try {
    SplitWriter train(tmp, "train", o.shard_tokens, token_bytes, o.crash_after_shards, &shards_written);
    SplitWriter val(tmp, "val", o.shard_tokens, token_bytes, o.crash_after_shards, &shards_written);
    PrepareProgress progress(total_bytes, o.progress);
    int64_t doc_index = 0;
    const double f = o.val_fraction;
    SplitWriter* writer = nullptr;  // the split of the document being written

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
      std::vector<Doc> docs;
      std::vector<std::vector<std::string>> decoded(texts.size());  // --jsonl: the documents docs point into
      const std::vector<int64_t> file_bytes(sizes.begin() + static_cast<std::ptrdiff_t>(first),
                                            sizes.begin() + static_cast<std::ptrdiff_t>(end));
      for (size_t i = 0; i < texts.size(); ++i) {
        const std::string& path = o.inputs[first + i];
        if (checks[i].bad_utf8 != std::string::npos)
          fail("{}: not UTF-8 text: invalid byte 0x{:02x} at byte offset {}", path,
               static_cast<unsigned char>(texts[i][checks[i].bad_utf8]), checks[i].bad_utf8);
        size_t count = 0;
        const size_t text_bytes = texts[i].size();
        r.text_bytes += static_cast<int64_t>(text_bytes);
        if (!o.split.jsonl_key.empty()) {
          decoded[i] = jsonl_documents(texts[i], o.split.jsonl_key, path);
          for (const std::string& d : decoded[i]) docs.push_back({i, d});
          count = decoded[i].size();
          std::string().swap(texts[i]);  // the documents are copies: the file's bytes are no longer needed
        } else {
          const auto split = split_documents(texts[i], o.split);
          for (auto d : split) docs.push_back({i, d});
          count = split.size();
          if (delimiter_only_inside_lines(texts[i], o.split.delimiter))
            spdlog::warn("{}: --doc-delimiter \"{}\" occurs in the text but never as a line of its own: nothing is "
                         "split there (the file is {} document{}); the delimiter must be a whole line",
                         path, o.split.delimiter, count, count == 1 ? "" : "s");
        }
        sources.push_back({{"path", path},
                           {"bytes", text_bytes},
                           {"sha256", checks[i].sha256},
                           {"documents", count}});
        if (count == 0) progress.add(sizes[first + i], 0);
      }

      UnitStream stream(docs, file_bytes, *tok, o.piece_bytes);
      for (std::vector<Unit> units; stream.next_window(o.window_bytes, units);) {
        // A window of about window_bytes of text: encoded in parallel, then written in order.
        std::vector<std::vector<int32_t>> ids(units.size());
        std::vector<std::exception_ptr> errors(units.size());
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (size_t k = 0; k < units.size(); ++k) {
          const Unit& unit = units[k];
          try {
            ids[k] = unit.after_cut ? tok->encode_after_cut(unit.text) : tok->encode(unit.text);
          } catch (...) {
            errors[k] = std::current_exception();
          }
          progress.add(unit.credit, unit.last_piece ? 1 : 0);
        }
        for (size_t k = 0; k < units.size(); ++k) {
          if (errors[k]) std::rethrow_exception(errors[k]);
          const Unit& unit = units[k];
          if (!unit.after_cut) {  // a document starts: its split, and BOS
            const bool to_val = floor_times(doc_index + 1, f) > floor_times(doc_index, f);
            ++doc_index;
            writer = to_val ? &val : &train;
            ++writer->docs;
            if (bos >= 0) writer->append(static_cast<uint32_t>(bos));
          }
          for (int32_t t : ids[k]) writer->append(static_cast<uint32_t>(t));
          if (unit.last_piece && eos >= 0) writer->append(static_cast<uint32_t>(eos));
          std::vector<int32_t>().swap(ids[k]);  // written: free as we go
        }
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
        {"val_rule", "document g (0-based, input order) is val iff floor((g+1)*f) > floor(g*f), computed exactly on "
                     "the double f (Python: fractions.Fraction(f))"},
        {"shard_tokens", o.shard_tokens},
        {"splits",
         {{"train", {{"tokens", r.train_tokens}, {"documents", r.train_docs}, {"shards", train.shards}}},
          {"val", {{"tokens", r.val_tokens}, {"documents", r.val_docs}, {"shards", val.shards}}}}},
        {"sources", sources},
    };
    write_json_file(tmp + "/manifest.json", manifest);  // last: the directory is now complete
    commit_atomic_dir(tmp, o.out, o.force, "manifest.json");
  } catch (...) {
    abandon_atomic_dir(tmp);
    throw;
  }
  if (o.val_fraction > 0 && r.val_docs == 0)
    spdlog::warn("data prepare: --val-fraction {} but only {} document(s): the val split is empty", o.val_fraction,
                 r.train_docs);
  // A run maps every shard it reads; the kernel allows about 65530 mappings a
  // process (vm.max_map_count): say so now, not when training fails to start.
  if (shards_written > 60000)
    spdlog::warn("data prepare: {} shards: train maps each one, and the kernel allows about 65530 mappings a process "
                 "by default (vm.max_map_count): a larger --shard-tokens writes fewer",
                 shards_written);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kvs
