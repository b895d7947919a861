// Corpus files as they are shipped: plain, gzip (".gz") or Zstandard (".zst"),
// read whole and decompressed by their name's suffix. The tokenizer trainer and
// `data prepare` read their inputs through this, so a Hugging Face export or a
// corpus like The Pile (.jsonl.zst) needs no decompressing first.
#pragma once
#include <string>

namespace kvs {

// The file's bytes, decompressed when its name ends in ".gz" or ".zst".
// Throws kvs::Error naming the file: unreadable, corrupt or truncated, or a
// compression this build has no library for (zlib, libzstd: optional at build
// time, installed by scripts/setup.sh).
std::string read_input_bytes(const std::string& path);

// Which compressions this build reads: "gzip, zstd", "gzip", ... or "none".
std::string input_compressions();

}  // namespace kvs
