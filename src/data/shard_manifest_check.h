// Shards against the manifest.json that `kvshift data prepare` (or
// scripts/prepare_byte_shards.py) wrote beside them: a partial copy (an
// rsync cut short, a shard deleted) or a shard rewritten since would
// otherwise train silently on other data. Cheap: names and token counts,
// not the sha256s (those would read every byte of a corpus at every start).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvs {

// What a manifest says of one shard: its tokens, its sha256 ("" if not
// recorded) and its split ("train", "val"; prepare_byte_shards.py's format
// has no splits: its val_* files count as "val").
struct ListedShard {
  uint64_t tokens = 0;
  std::string sha256;
  std::string split;
};

// The records of `manifest` (a manifest.json path), by file name.
std::map<std::string, ListedShard> listed_shards(const std::string& manifest);

// The record of each of `paths` that the manifest.json beside it lists (each
// directory's manifest read once); paths without one are left out.
std::map<std::string, ListedShard> manifest_records(const std::vector<std::string>& paths);

// `pattern` (already resolved against the config's directory) matched
// `matches`. For each directory holding a manifest: a shard it lists that the
// pattern would match but that is missing, or a listed shard whose token
// count differs, is a one-line error naming the file and `key`; a matched
// .bin file the manifest does not list is a warning. Directories without a
// manifest are not checked.
void check_shards_against_manifests(const std::string& pattern, const std::vector<std::string>& matches,
                                    const std::string& key);

}  // namespace kvs
