// Shards against the manifest.json that `kvshift data prepare` (or
// scripts/prepare_byte_shards.py) wrote beside them: a partial copy (an
// rsync cut short, a shard deleted) or a shard rewritten since would
// otherwise train silently on other data. Cheap: names and token counts,
// not the sha256s (those would read every byte of a corpus at every start).
#pragma once
#include <string>
#include <vector>

namespace kvs {

// `pattern` (already resolved against the config's directory) matched
// `matches`. For each directory holding a manifest: a shard it lists that the
// pattern would match but that is missing, or a listed shard whose token
// count differs, is a one-line error naming the file and `key`; a matched
// .bin file the manifest does not list is a warning. Directories without a
// manifest are not checked.
void check_shards_against_manifests(const std::string& pattern, const std::vector<std::string>& matches,
                                    const std::string& key);

}  // namespace kvs
