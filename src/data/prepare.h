// `kvshift data prepare`: text files -> token shards (docs/DATA.md).
//   - Documents: each input file is cut into documents (DocSplit); each
//     document becomes BOS + its tokens + EOS (no framing for tokenizers
//     without BOS/EOS, e.g. bytes).
//   - Split: document g (0-based, in input order, empty ones dropped) goes to
//     val iff floor((g+1)*f) > floor(g*f): every (1/f)-th document, no RNG.
//   - Shards: each split is one token stream cut every `shard_tokens` tokens
//     into OUT/{train,val}_NNNNNN.bin (u16 if vocab_size <= 65536, else u32).
//   - Parallel: documents (long ones in pieces the tokenizer proves give the
//     same ids) are encoded on `threads` threads, a window of text at a time,
//     and appended in input order, so the output is byte-identical for any
//     thread count and memory holds a window's ids, not a file's.
//   - Atomic: everything is written under OUT.tmp.<pid> (shards each written
//     to a temp name and renamed, manifest.json last) and the directory is
//     renamed to OUT at the end: OUT is complete or absent.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/text_input.h"

namespace kvs {

struct PrepareOptions {
  std::string tokenizer;            // tokenizer directory
  std::vector<std::string> inputs;  // UTF-8 text files, in this order
  std::string out;                  // output directory (created whole)
  double val_fraction = 0.05;
  int threads = 0;                  // 0 = every core
  int64_t shard_tokens = int64_t(1) << 25;
  DocSplit split;
  bool force = false;               // replace an existing `out`
  bool progress = true;
  int crash_after_shards = -1;      // tests: _Exit(3) once this many shards are written (a simulated crash)
  int64_t batch_bytes = 8 << 20;    // tests: files are read in batches of about this many bytes
  int64_t piece_bytes = 64 << 10;   // tests: a longer document is encoded in pieces of about this (Tokenizer::safe_cuts)
  int64_t window_bytes = 32 << 20;  // tests: text encoded between two writes, bounding the ids held at once
};

struct PrepareResult {
  int64_t bytes = 0;       // of the input files as stored
  int64_t text_bytes = 0;  // of their text (.gz and .zst decompressed)
  int64_t train_tokens = 0, val_tokens = 0, train_docs = 0, val_docs = 0;
  std::vector<std::string> shards;  // file names, train then val
  double seconds = 0;
};

PrepareResult prepare_data(const PrepareOptions& o);

// floor(x * f) computed exactly, f (in [0, 1)) taken as the double it is
// (m / 2^k): the val split's rule, so that anyone can rebuild it exactly
// (Python: (x * fractions.Fraction(f)).__floor__()), whatever the float
// precision of their arithmetic.
int64_t floor_times(int64_t x, double f);

// "train_000042.bin": a split's shard `index`, six digits so that glob order
// is stream order; a millionth shard is an error (raise --shard-tokens).
std::string shard_file_name(const std::string& split, size_t index, int64_t shard_tokens);
// Bytes per token in the shards: 2 (u16) if every id fits, else 4 (u32).
inline uint32_t shard_token_bytes(int vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

}  // namespace kvs
