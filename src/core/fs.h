// File-system helpers for crash-safe output: nothing is ever half-written
// under its final name.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace kvs {

// Writes `data` to `path` atomically: write `path.tmp.<pid>`, fsync it, rename
// over `path`, fsync the directory. Throws kvs::Error naming the path.
void atomic_write_file(const std::string& path, std::string_view data);
// Streaming variant with the same guarantees, for outputs too large to build in
// memory (model files): `produce` is called once with a `sink` that appends
// bytes to the temp file. If `produce` throws, the temp file is removed and the
// exception propagates; `path` is untouched.
using ByteSink = std::function<void(const void* data, size_t size)>;
void atomic_write_file_stream(const std::string& path, const std::function<void(const ByteSink& sink)>& produce);
// fsync a file or directory by path.
void fsync_path(const std::string& path);
// Whole file into a string; throws kvs::Error("<path>: cannot read: <reason>").
std::string read_file(const std::string& path);
// mkdir -p; throws on failure.
void make_dirs(const std::string& path);

}  // namespace kvs
