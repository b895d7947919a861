#include "data/shard_manifest_check.h"

#include <fnmatch.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "data/shards.h"

namespace kvs {
namespace {

namespace fs = std::filesystem;

}  // namespace

// File name -> its record, as either manifest format holds it: data
// prepare's {"splits": {"train": {"shards": [{"file", "tokens", "sha256"}]}, ...}}
// or prepare_byte_shards.py's {"shards": {"train_000.bin": {"tokens", "sha256"}}}.
std::map<std::string, ListedShard> listed_shards(const std::string& manifest) {
  const nlohmann::json m = read_json_file(manifest);
  std::map<std::string, ListedShard> out;
  auto add = [&](const std::string& file, const nlohmann::json& e, const std::string& split) {
    const nlohmann::json& tokens = e["tokens"];
    KVS_CHECK(tokens.is_number_unsigned() || (tokens.is_number_integer() && tokens.get<int64_t>() >= 0),
              "{}: shard {}: \"tokens\" must be a non-negative integer", manifest, file);
    const nlohmann::json sha = e.value("sha256", nlohmann::json());
    out[file] = {tokens.get<uint64_t>(), sha.is_string() ? sha.get<std::string>() : "", split};
  };
  if (m.contains("splits") && m["splits"].is_object())
    for (const auto& [split, s] : m["splits"].items())
      if (s.is_object() && s.contains("shards") && s["shards"].is_array())
        for (const auto& e : s["shards"])
          if (e.is_object() && e.contains("file") && e["file"].is_string() && e.contains("tokens"))
            add(e["file"].get<std::string>(), e, split);
  if (m.contains("shards") && m["shards"].is_object())
    for (const auto& [file, e] : m["shards"].items())
      if (e.is_object() && e.contains("tokens")) add(file, e, file.rfind("val", 0) == 0 ? "val" : "train");
  return out;
}

std::map<std::string, ListedShard> manifest_records(const std::vector<std::string>& paths) {
  std::map<std::string, std::map<std::string, ListedShard>> by_dir;
  std::map<std::string, ListedShard> out;
  for (const std::string& p : paths) {
    const std::string dir = fs::path(p).parent_path().string();
    auto it = by_dir.find(dir);
    if (it == by_dir.end()) {
      const std::string manifest = (fs::path(dir) / "manifest.json").string();
      it = by_dir.emplace(dir, fs::exists(manifest) ? listed_shards(manifest)
                                                    : std::map<std::string, ListedShard>{}).first;
    }
    if (const auto f = it->second.find(fs::path(p).filename().string()); f != it->second.end()) out[p] = f->second;
  }
  return out;
}

void check_shards_against_manifests(const std::string& pattern, const std::vector<std::string>& matches,
                                    const std::string& key) {
  std::set<std::string> dirs;
  for (const std::string& f : matches) dirs.insert(fs::path(f).parent_path().string());
  const std::set<std::string> matched(matches.begin(), matches.end());
  for (const std::string& dir : dirs) {
    const std::string manifest = (fs::path(dir) / "manifest.json").string();
    if (!fs::exists(manifest)) continue;
    const std::map<std::string, ListedShard> listed = listed_shards(manifest);
    if (listed.empty()) continue;
    for (const auto& [file, record] : listed) {
      const uint64_t tokens = record.tokens;
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
    if (!unlisted.empty() && logs_for_the_world())
      spdlog::warn("{}: {} of the files \"{}\" matches in {} ({}{}) are not in its manifest.json: from another data "
                   "prepare?",
                   key, unlisted.size(), pattern, dir, unlisted[0], unlisted.size() > 1 ? ", ..." : "");
  }
}

}  // namespace kvs
