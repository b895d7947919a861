#include "hf/staged_dir.h"

#include <unistd.h>

#include <filesystem>
#include <spdlog/spdlog.h>

#include "core/atomic_dir.h"
#include "core/error.h"
#include "core/fs.h"

namespace kvs::hf {

namespace fs = std::filesystem;

StagedDir::StagedDir(std::string final_path, bool force, const std::vector<std::string>& inputs)
    : final_(std::move(final_path)) {
  KVS_CHECK(!final_.empty(), "--out: empty path");
  check_output_holds_no_input(final_, inputs);
  std::error_code ec;
  fs::path out = fs::weakly_canonical(fs::absolute(final_), ec);
  if (out.filename().empty()) out = out.parent_path();  // "out/" names "out", not a file inside it
  if (fs::exists(out, ec)) {
    KVS_CHECK(fs::is_directory(out, ec), "{}: exists and is not a directory", final_);
    KVS_CHECK(force || fs::is_empty(out, ec), "{}: exists and is not empty (use --force to replace it)", final_);
  }
  const fs::path parent = out.parent_path();
  make_dirs(parent.string());
  tmp_ = (parent / (".tmp-" + out.filename().string() + "-" + std::to_string(getpid()))).string();
  fs::remove_all(tmp_, ec);
  make_dirs(tmp_);
  final_ = out.string();
}

StagedDir::~StagedDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

void StagedDir::commit() {
  std::error_code ec;
  fsync_path(tmp_);
  std::string old;
  if (fs::exists(final_, ec)) {
    old = final_ + ".old-" + std::to_string(getpid());
    fs::rename(final_, old, ec);
    KVS_CHECK(!ec, "{}: cannot move the old directory aside: {}", final_, ec.message());
  }
  fs::rename(tmp_, final_, ec);
  if (ec) {
    if (!old.empty()) fs::rename(old, final_);
    fail("{}: cannot move {} into place: {}", final_, tmp_, ec.message());
  }
  committed_ = true;
  fsync_path(fs::path(final_).parent_path().string());
  if (!old.empty()) {
    fs::remove_all(old, ec);
    if (ec) spdlog::warn("could not remove {}: {}", old, ec.message());
  }
}

}  // namespace kvs::hf
