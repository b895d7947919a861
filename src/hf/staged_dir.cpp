#include "hf/staged_dir.h"

#include "core/atomic_dir.h"
#include "core/error.h"
#include "core/fs.h"

namespace kvs::hf {

// Both commands' outputs hold a config.json (an HF model directory, or
// import-hf's checkpoint): --force replaces only such a directory.
constexpr const char* kOutputMarker = "config.json";

StagedDir::StagedDir(std::string final_path, bool force, const std::vector<std::string>& inputs)
    : final_(std::move(final_path)), force_(force) {
  KVS_CHECK(!final_.empty(), "--out: empty path");
  check_output_holds_no_input(final_, inputs);
  check_atomic_target(final_, force_, kOutputMarker);
  tmp_ = begin_atomic_dir(final_);
}

StagedDir::~StagedDir() {
  if (!committed_) abandon_atomic_dir(tmp_);
}

void StagedDir::commit() {
  fsync_path(tmp_);
  commit_atomic_dir(tmp_, final_, force_, kOutputMarker);
  committed_ = true;
}

}  // namespace kvs::hf
