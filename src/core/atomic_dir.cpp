#include "core/atomic_dir.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/fs.h"

namespace kvs {
namespace fs = std::filesystem;

namespace {

// A link given as the target (data/corpus -> /bigdisk/corpus) stands for
// the directory it names: that one is built beside and replaced, the link kept.
fs::path absolute_target(const std::string& target) {
  fs::path p = fs::absolute(target).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "out/" -> "out"
  std::error_code ec;
  if (fs::is_symlink(p, ec)) p = fs::weakly_canonical(p, ec);
  return p;
}

// What a training run directory or a checkpoint holds and no command's
// output does. A run directory and every step directory hold a config.json
// (export-hf's and import-hf's marker) and a step directory a manifest.json
// (data prepare's), so the marker alone does not tell them apart.
constexpr const char* kTrainingFiles[] = {"checkpoints", "metrics.jsonl", "trainer_state.json", "run_config.json",
                                          "optimizer.safetensors"};

// --force replaces only what looks like this command's earlier output (it
// holds `marker` and nothing of a training run's) or an empty directory:
// never a file, nor a directory of other things that a mistyped --out
// happens to name.
void check_replaceable(const std::string& target, const fs::path& t, const char* marker) {
  std::error_code ec;
  KVS_CHECK(fs::is_directory(t, ec), "{}: exists and is not a directory; --force replaces only an earlier output",
            target);
  for (const char* f : kTrainingFiles)
    KVS_CHECK(!fs::exists(t / f, ec), "{}: holds {}: a training run or a checkpoint, not an earlier output of this "
              "command, so --force does not replace it (remove it yourself, or choose another --out)", target, f);
  if (marker == nullptr || fs::exists(t / marker, ec)) return;
  KVS_CHECK(fs::directory_iterator(t, ec) == fs::directory_iterator(),
            "{}: holds files but no {}: not an earlier output of this command, so --force does not replace it "
            "(remove it yourself, or choose another --out)",
            target, marker);
}

bool process_alive(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

// "<name>.tmp.<pid>" / "<name>.old.<pid>" siblings left by runs that died.
void remove_stale(const fs::path& target) {
  std::error_code ec;
  const fs::path parent = target.parent_path();
  if (!fs::is_directory(parent, ec)) return;
  const std::string name = target.filename().string();
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string f = e.path().filename().string();
    for (const char* tag : {".tmp.", ".old."}) {
      const std::string prefix = name + tag;
      if (f.size() <= prefix.size() || f.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string pid = f.substr(prefix.size());
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      if (!process_alive(std::stol(pid))) fs::remove_all(e.path(), ec);
    }
  }
}

}  // namespace

std::string begin_atomic_dir(const std::string& target) {
  const fs::path t = absolute_target(target);
  remove_stale(t);
  const std::string tmp = t.string() + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  make_dirs(tmp);
  return tmp;
}

// An existing `t` may be replaced: an empty directory always (nothing is
// lost), anything else with `force` and as check_replaceable allows.
void check_may_replace(const std::string& target, const fs::path& t, bool force, const char* marker) {
  std::error_code ec;
  if (fs::is_directory(t, ec) && fs::is_empty(t, ec)) return;
  KVS_CHECK(force, "{}: already exists; pass --force to replace it", target);
  check_replaceable(target, t, marker);
}

void check_atomic_target(const std::string& target, bool force, const char* marker) {
  const fs::path t = absolute_target(target);
  remove_stale(t);
  std::error_code ec;
  if (fs::exists(t, ec)) check_may_replace(target, t, force, marker);
}

void commit_atomic_dir(const std::string& tmp, const std::string& target, bool force, const char* marker) {
  const fs::path t = absolute_target(target);
  std::string old;
  if (fs::exists(t)) {
    check_may_replace(target, t, force, marker);
    old = t.string() + ".old." + std::to_string(::getpid());
    if (::rename(t.c_str(), old.c_str()) != 0) fail("{}: cannot move the old directory aside: {}", target, std::strerror(errno));
  }
  if (::rename(tmp.c_str(), t.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    if (!old.empty()) ::rename(old.c_str(), t.c_str());  // the old output back in place
    fail("{}: cannot rename {} into place: {}", target, tmp, why);
  }
  fsync_path(t.parent_path().string());
  std::error_code ec;
  if (!old.empty()) fs::remove_all(old, ec);
}

void abandon_atomic_dir(const std::string& tmp) {
  std::error_code ec;
  fs::remove_all(tmp, ec);
}

namespace {

// `inner` is `outer` or lies below it (both made absolute, links resolved).
bool path_within(const std::string& inner, const std::string& outer) {
  // A path that cannot be resolved (a pipe: /dev/stdin names "pipe:[...]")
  // is taken as written, never as the empty path, which every path lies in.
  auto normal = [](const std::string& s) {
    std::error_code ec;
    fs::path q = fs::weakly_canonical(fs::absolute(s), ec);
    if (ec || q.empty()) q = fs::absolute(s).lexically_normal();
    return q.filename().empty() ? q.parent_path() : q;  // "dir/" -> "dir"
  };
  const fs::path p = normal(inner), o = normal(outer);
  if (o.empty()) return false;
  auto i = p.begin();
  for (auto j = o.begin(); j != o.end(); ++j, ++i)
    if (i == p.end() || *i != *j) return false;
  return true;
}

}  // namespace

void check_output_holds_no_input(const std::string& out, const std::vector<std::string>& inputs,
                                 const std::string& flag) {
  for (const std::string& in : inputs)
    KVS_CHECK(!path_within(in, out), "{}: {} must not be (or contain) the input {}", out, flag, in);
}

void check_output_file_apart_from_inputs(const std::string& out, const std::vector<std::string>& inputs,
                                         const std::string& flag) {
  for (const std::string& in : inputs)
    KVS_CHECK(!path_within(out, in), "{}: {} must not be (or lie inside) the input {}", out, flag, in);
}

}  // namespace kvs
