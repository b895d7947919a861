// File-system helpers for crash-safe output: nothing is ever half-written
// under its final name.
#pragma once
#include <string>
#include <string_view>

namespace kvs {

// Writes `data` to `path` atomically: write `path.tmp.<pid>`, fsync it, rename
// over `path`, fsync the directory. Throws kvs::Error naming the path.
void atomic_write_file(const std::string& path, std::string_view data);
// fsync a file or directory by path.
void fsync_path(const std::string& path);
// Whole file into a string; throws kvs::Error("<path>: cannot read: <reason>").
std::string read_file(const std::string& path);
// mkdir -p; throws on failure.
void make_dirs(const std::string& path);

}  // namespace kvs
