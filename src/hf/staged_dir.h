// An output directory that appears complete or not at all (core/atomic_dir.h):
// files are written into a temp sibling, which replaces the final path on
// commit(). Without commit() (an error) the temp directory is removed and
// `final` is untouched.
#pragma once
#include <string>
#include <vector>

namespace kvs::hf {

class StagedDir {
 public:
  // Refuses an existing non-empty `final` unless `force` (and then one that
  // holds no config.json: not an earlier output), and a `final` that is or
  // contains one of `inputs` (--force must never delete what we read).
  StagedDir(std::string final_path, bool force, const std::vector<std::string>& inputs);
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  const std::string& path() const { return tmp_; }  // where to write
  std::string file(const std::string& name) const { return tmp_ + "/" + name; }
  void commit();

 private:
  std::string final_, tmp_;
  bool force_ = false;
  bool committed_ = false;
};

}  // namespace kvs::hf
