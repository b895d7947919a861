#include "data/shard_manifest_check.h"

#include <fnmatch.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/json_file.h"
#include "data/shards.h"

namespace kvs {
namespace {

namespace fs = std::filesystem;

// File name -> token count, as either manifest format records it:
// data prepare's {"splits": {"train": {"shards": [{"file", "tokens"}]}, ...}}
// or prepare_byte_shards.py's {"shards": {"train_000.bin": {"tokens"}}}.
std::map<std::string, uint64_t> listed_shards(const std::string& manifest) {
  const nlohmann::json m = read_json_file(manifest);
  std::map<std::string, uint64_t> out;
  auto add = [&](const std::string& file, const nlohmann::json& tokens) {
    KVS_CHECK(tokens.is_number_unsigned() || (tokens.is_number_integer() && tokens.get<int64_t>() >= 0),
              "{}: shard {}: \"tokens\" must be a non-negative integer", manifest, file);
    out[file] = tokens.get<uint64_t>();
  };
  if (m.contains("splits") && m["splits"].is_object())
    for (const auto& [split, s] : m["splits"].items())
      if (s.is_object() && s.contains("shards") && s["shards"].is_array())
        for (const auto& e : s["shards"])
          if (e.is_object() && e.contains("file") && e["file"].is_string() && e.contains("tokens"))
            add(e["file"].get<std::string>(), e["tokens"]);
  if (m.contains("shards") && m["shards"].is_object())
    for (const auto& [file, e] : m["shards"].items())
      if (e.is_object() && e.contains("tokens")) add(file, e["tokens"]);
  return out;
}

}  // namespace

void check_shards_against_manifests(const std::string& pattern, const std::vector<std::string>& matches,
                                    const std::string& key) {
  std::set<std::string> dirs;
  for (const std::string& f : matches) dirs.insert(fs::path(f).parent_path().string());
  const std::set<std::string> matched(matches.begin(), matches.end());
  for (const std::string& dir : dirs) {
    const std::string manifest = (fs::path(dir) / "manifest.json").string();
    if (!fs::exists(manifest)) continue;
    const std::map<std::string, uint64_t> listed = listed_shards(manifest);
    if (listed.empty()) continue;
    for (const auto& [file, tokens] : listed) {
      const std::string path = (fs::path(dir) / file).string();
      if (::fnmatch(pattern.c_str(), path.c_str(), FNM_PATHNAME) != 0) continue;  // not asked for
      KVS_CHECK(matched.count(path), "{}: {} is missing: {} lists it ({} tokens) among the shards \"{}\" matches "
                "(a partial copy?)", key, path, manifest, tokens, pattern);
      const ShardFile shard(path);
      KVS_CHECK(shard.size() == tokens, "{}: {} holds {} tokens, but {} records {}: the shard changed since data "
                "prepare wrote it", key, path, shard.size(), manifest, tokens);
    }
    std::vector<std::string> unlisted;
    for (const std::string& f : matches)
      if (fs::path(f).parent_path().string() == dir && !listed.count(fs::path(f).filename().string()))
        unlisted.push_back(fs::path(f).filename().string());
    if (!unlisted.empty())
      spdlog::warn("{}: {} of the files \"{}\" matches in {} ({}{}) are not in its manifest.json: from another data "
                   "prepare?",
                   key, unlisted.size(), pattern, dir, unlisted[0], unlisted.size() > 1 ? ", ..." : "");
  }
}

}  // namespace kvs
