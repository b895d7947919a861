#include "train/checkpoint_manifest.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/checksum.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"

namespace kvs {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "kvshift-checkpoint-manifest";
constexpr const char* kHashKey = "xxh3_64";

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

}  // namespace

void write_manifest(const std::string& dir, const std::vector<std::string>& files) {
  nlohmann::json listed = nlohmann::json::object();
  for (const std::string& f : files) {
    const FileDigest d = digest_file(join(dir, f));
    listed[f] = {{"bytes", d.bytes}, {kHashKey, d.xxh3}};
  }
  const nlohmann::json m = {{"format", kFormat}, {"version", 1}, {"hash", kHashKey}, {"files", listed}};
  write_json_file(join(dir, kManifestFile), m);
}

ManifestStatus verify_manifest(const std::string& dir, const std::vector<std::string>& required,
                               const std::vector<std::string>& skip) {
  const std::string path = join(dir, kManifestFile);
  std::error_code ec;
  if (!fs::exists(path, ec)) return ManifestStatus::Absent;
  const nlohmann::json m = read_json_file(path);
  KVS_CHECK(m.is_object() && m.value("format", "") == kFormat && m.contains("files") && m["files"].is_object(),
            "{}: not a kvshift checkpoint manifest (expected \"format\": \"{}\" and a \"files\" object)", path,
            kFormat);
  KVS_CHECK(m.value("hash", "") == kHashKey, "{}: unknown hash '{}' (this kvshift checks {})", path,
            m.value("hash", ""), kHashKey);
  const auto& files = m["files"];
  for (const std::string& r : required)
    KVS_CHECK(files.contains(r), "{}: does not list {}", path, r);
  for (const auto& [name, entry] : files.items()) {
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    const std::string file = join(dir, name);
    KVS_CHECK(name.find('/') == std::string::npos && name != ".." && entry.is_object() &&
                  entry.contains("bytes") && entry["bytes"].is_number_unsigned() && entry.contains(kHashKey) &&
                  entry[kHashKey].is_string(),
              "{}: malformed entry for '{}'", path, name);
    if (!fs::exists(file, ec)) {
      // The manifest read a moment ago gone too: the directory was removed while it was read
      // (a running train's retention, train.keep_checkpoints), not a corrupt checkpoint.
      KVS_CHECK(fs::exists(path, ec),
                "{}: removed while it was read (a running train keeps only its newest train.keep_checkpoints "
                "checkpoints): read its newer one (run this again)",
                dir);
      fail("{}: missing (listed in {})", file, kManifestFile);
    }
    const uint64_t want = entry["bytes"].get<uint64_t>();
    const uint64_t size = fs::file_size(file, ec);
    if (ec) fail("{}: cannot read: {}", file, ec.message());
    KVS_CHECK(size == want, "{}: {} bytes, the manifest says {} ({})", file, size, want,
              size < want ? "truncated" : "corrupt");
    const FileDigest d = digest_file(file);
    KVS_CHECK(d.xxh3 == entry[kHashKey].get<std::string>(),
              "{}: checksum mismatch (xxh3_64 {}, the manifest says {}): the file is corrupt", file, d.xxh3,
              entry[kHashKey].get<std::string>());
  }
  return ManifestStatus::Verified;
}

}  // namespace kvs
