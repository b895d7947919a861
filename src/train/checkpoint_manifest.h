// manifest.json of a checkpoint directory: the size and XXH3-64 of every file
// but run_config.json (docs/FORMATS.md "Checkpoint manifest"). Written last into the
// temp directory of a save, so a checkpoint that has one was written whole;
// verified whenever a checkpoint is loaded, so a flipped bit or a truncated
// file is a one-line error naming the file instead of wrong weights.
#pragma once
#include <string>
#include <vector>

namespace kvs {

inline constexpr const char* kManifestFile = "manifest.json";

// Hashes `files` (names inside `dir`) and writes dir/manifest.json atomically.
void write_manifest(const std::string& dir, const std::vector<std::string>& files);

enum class ManifestStatus { Verified, Absent };

// Checks every file the manifest lists (size first, then checksum) and that
// each of `required` is listed. Absent: the directory has no manifest (a
// checkpoint from before manifests; the caller warns). Throws one line naming
// the file: "<dir>/model.safetensors: 1000 bytes, the manifest says 4096 (truncated?)".
// Files named in `skip` are not checked (a reader that does not use them).
ManifestStatus verify_manifest(const std::string& dir, const std::vector<std::string>& required,
                               const std::vector<std::string>& skip = {});

}  // namespace kvs
