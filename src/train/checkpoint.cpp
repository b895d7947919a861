#include "train/checkpoint.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>
#include <thread>

#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "train/checkpoint_manifest.h"

namespace kvs {
namespace {

namespace fs = std::filesystem;

constexpr const char* kConfig = "config.json";
constexpr const char* kModel = "model.safetensors";
constexpr const char* kOptimizer = "optimizer.safetensors";
constexpr const char* kTrainerState = "trainer_state.json";
constexpr const char* kRunConfig = "run_config.json";
constexpr const char* kLatest = "latest";
constexpr const char* kTmpPrefix = ".tmp-";

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

// Parses a canonical step directory name ("step_00000100"); false for anything else.
bool parse_step_name(const std::string& s, int64_t* step) {
  if (s.size() < 5 + 8 || s.compare(0, 5, "step_") != 0 || s.size() > 5 + 18) return false;
  int64_t v = 0;
  for (size_t i = 5; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  if (checkpoint_dir_name(v) != s) return false;
  *step = v;
  return true;
}

bool exists_file(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

void remove_all_quiet(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) spdlog::warn("could not remove {}: {}", path, ec.message());
}

// Removes what crashed saves leave behind: ".tmp-*" directories and "latest.tmp.*" files.
void remove_stale_temps(const std::string& root) {
  std::error_code ec;
  std::vector<std::string> stale;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(kTmpPrefix, 0) == 0 || name.rfind(std::string(kLatest) + ".tmp.", 0) == 0)
      stale.push_back(it->path().string());
  }
  if (ec) spdlog::warn("could not list {}: {}", root, ec.message());
  for (const auto& p : stale) {
    spdlog::info("removing leftover of an interrupted checkpoint save: {}", p);
    remove_all_quiet(p);
  }
}

// Keeps the newest `keep_last` step directories plus `latest_name`; deletes the rest.
void prune(const std::string& root, int keep_last, const std::string& latest_name) {
  if (keep_last <= 0) return;
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    int64_t step;
    const std::string name = it->path().filename().string();
    std::error_code ec2;
    if (parse_step_name(name, &step) && it->is_directory(ec2)) steps.emplace_back(step, name);
  }
  if (ec) {
    spdlog::warn("could not list {} for pruning: {}", root, ec.message());
    return;
  }
  std::sort(steps.begin(), steps.end(), std::greater<>());
  for (size_t i = static_cast<size_t>(keep_last); i < steps.size(); ++i) {
    if (steps[i].second == latest_name) continue;
    remove_all_quiet(join(root, steps[i].second));
  }
}

// Puts the complete directory `tmp` in place as `final_dir`, replacing an existing one
// of the same name without a moment where `final_dir` is missing when the file system
// supports an atomic exchange.
void install_dir(const std::string& root, const std::string& tmp, const std::string& final_dir,
                 const std::string& name) {
  std::error_code ec;
  if (!fs::exists(final_dir, ec)) {
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
      fail("{}: cannot rename {} into place: {}", final_dir, tmp, std::strerror(errno));
    fsync_path(root);
    return;
  }
  // KVS_NO_RENAME_EXCHANGE (tests only) forces the fallback path below.
  const bool try_exchange = std::getenv("KVS_NO_RENAME_EXCHANGE") == nullptr;
  if (try_exchange && ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    // `tmp` now holds the old checkpoint.
    fsync_path(root);
    remove_all_quiet(tmp);
    return;
  }
  if (try_exchange && errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    fail("{}: cannot replace with {}: {}", final_dir, tmp, std::strerror(errno));
  // No atomic exchange here: move the old one aside (still under ".tmp-", so a crash
  // leaves it for cleanup), move the new one in, then delete the old one.
  const std::string aside = join(root, fmt::format("{}old-{}-{}", kTmpPrefix, name, ::getpid()));
  remove_all_quiet(aside);
  if (::rename(final_dir.c_str(), aside.c_str()) != 0)
    fail("{}: cannot move the old checkpoint aside: {}", final_dir, std::strerror(errno));
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    int e = errno;
    ::rename(aside.c_str(), final_dir.c_str());  // best effort: restore the old one
    fail("{}: cannot rename {} into place: {}", final_dir, tmp, std::strerror(e));
  }
  fsync_path(root);
  remove_all_quiet(aside);
}

// KVS_FAULT_SAVE_PAUSE_S (the fault-injection harness only, scripts/fault_harness.py):
// sleep with every file but the manifest written, so a kill lands inside a save.
void pause_for_fault_injection() {
  const char* v = std::getenv("KVS_FAULT_SAVE_PAUSE_S");
  if (!v || !*v) return;
  const double s = std::atof(v);
  if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  KVS_CHECK(step >= 0, "checkpoint step must be non-negative, got {}", step);
  return fmt::format("step_{:08d}", step);
}

namespace {

void write_tensors(const std::string& path, const std::vector<StTensor>& tensors, TensorStream* stream) {
  if (!stream) return write_safetensors(path, tensors);
  write_safetensors_streamed(path, tensors, [&](size_t i, const auto& sink) {
    const StTensor t = stream->pop();
    KVS_CHECK(t.name == tensors[i].name && t.dtype == tensors[i].dtype && t.shape == tensors[i].shape,
              "{}: internal error: the stream brought tensor '{}' where '{}' belongs", path, t.name, tensors[i].name);
    sink(t.bytes.data(), t.bytes.size());
  });
}

std::string save_checkpoint_files(const std::string& root, int64_t step, const CheckpointData& data, int keep_last) {
  const std::string name = checkpoint_dir_name(step);
  KVS_CHECK(data.hf_config.is_object(), "{}: cannot save {}: the model config (config.json) must be a JSON object",
            root, name);
  make_dirs(root);
  remove_stale_temps(root);

  const std::string tmp = join(root, fmt::format("{}{}-{}", kTmpPrefix, name, ::getpid()));
  const std::string final_dir = join(root, name);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec) fail("{}: cannot create directory: {}", tmp, ec.message());
  try {
    std::vector<std::string> files = {kConfig, kModel};
    write_json_file(join(tmp, kConfig), data.hf_config);
    write_tensors(join(tmp, kModel), data.model, data.stream.get());
    if (!data.optimizer.empty()) {
      write_tensors(join(tmp, kOptimizer), data.optimizer, data.stream.get());
      files.push_back(kOptimizer);
    }
    if (!data.trainer_state.is_null()) {
      write_json_file(join(tmp, kTrainerState), data.trainer_state);
      files.push_back(kTrainerState);
    }
    // run_config.json stays out of the manifest: a copy of the run's config for
    // reference (and the tokenizer's path), which users may edit.
    if (!data.run_config.is_null()) write_json_file(join(tmp, kRunConfig), data.run_config);
    pause_for_fault_injection();
    // Hashed from the files as written, so the manifest vouches for the bytes on disk.
    write_manifest(tmp, files);
    fsync_path(tmp);  // every file above was fsynced by its atomic write
  } catch (const Error& e) {
    // The message names the file by the path it was being saved to: the
    // temporary directory it was written in is gone when the user reads it.
    remove_all_quiet(tmp);
    std::string what = e.what();
    for (size_t at = what.find(tmp); at != std::string::npos; at = what.find(tmp, at + final_dir.size()))
      what.replace(at, tmp.size(), final_dir);
    fail("{} (checkpoint {} not saved; the earlier ones are as they were)", what, name);
  } catch (...) {
    remove_all_quiet(tmp);
    throw;
  }
  try {
    install_dir(root, tmp, final_dir, name);
  } catch (...) {
    remove_all_quiet(tmp);
    throw;
  }
  atomic_write_file(join(root, kLatest), name + "\n");
  prune(root, keep_last, name);
  return final_dir;
}

}  // namespace

std::string save_checkpoint(const std::string& root, int64_t step, const CheckpointData& data, int keep_last) {
  try {
    return save_checkpoint_files(root, step, data, keep_last);
  } catch (...) {
    if (data.stream) data.stream->abort();  // the producer's pushes must not wait for a write that ended
    throw;
  }
}

std::string latest_checkpoint(const std::string& root) {
  const std::string path = join(root, kLatest);
  if (!exists_file(path)) return "";
  std::string s = read_file(path);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  int64_t step;
  if (!parse_step_name(s, &step)) {
    std::string shown;
    for (char c : s.substr(0, 64)) shown += (c >= 0x20 && c < 0x7f) ? c : '?';
    if (s.size() > 64) shown += "...";
    fail("{}: malformed: expected a checkpoint directory name like step_00000100, got '{}'", path, shown);
  }
  const std::string dir = join(root, s);
  std::error_code ec;
  KVS_CHECK(fs::is_directory(dir, ec), "{}: names {}, but {} does not exist", path, s, dir);
  return dir;
}

CheckpointFiles open_checkpoint(const std::string& dir, bool with_optimizer) {
  std::error_code ec;
  KVS_CHECK(fs::is_directory(dir, ec), "{}: {}", dir,
            fs::exists(dir, ec) ? "a file, not a checkpoint directory" : "checkpoint directory does not exist");
  for (const char* req : {kConfig, kModel})
    KVS_CHECK(exists_file(join(dir, req)), "{}: missing {} (not a kvshift checkpoint?)", dir, req);
  CheckpointFiles f;
  const std::string cfg = join(dir, kConfig);
  f.hf_config = read_json_file(cfg);
  KVS_CHECK(f.hf_config.is_object(), "{}: expected a JSON object, got {}", cfg, f.hf_config.type_name());
  f.model.emplace(join(dir, kModel));
  if (with_optimizer && exists_file(join(dir, kOptimizer))) f.optimizer.emplace(join(dir, kOptimizer));
  if (exists_file(join(dir, kTrainerState))) f.trainer_state = read_json_file(join(dir, kTrainerState));
  if (exists_file(join(dir, kRunConfig))) {
    try {
      f.run_config = read_json_file(join(dir, kRunConfig));
    } catch (const Error& e) {
      f.run_config_error = e.what();
    }
  }
  // After parsing: a file that does not parse gets its reader's more precise
  // message; the manifest catches what parses but changed (a flipped bit).
  f.verified = verify_manifest(dir, {kConfig, kModel}, with_optimizer ? std::vector<std::string>{}
                                                                       : std::vector<std::string>{kOptimizer}) ==
               ManifestStatus::Verified;
  return f;
}

CheckpointData load_checkpoint(const std::string& dir, bool with_optimizer) {
  CheckpointFiles f = open_checkpoint(dir, with_optimizer);
  CheckpointData d;
  d.hf_config = std::move(f.hf_config);
  d.model = f.model->read_all();
  if (f.optimizer) d.optimizer = f.optimizer->read_all();
  d.trainer_state = std::move(f.trainer_state);
  d.run_config = std::move(f.run_config);
  d.run_config_error = std::move(f.run_config_error);
  d.verified = f.verified;
  return d;
}

void check_checkpoint_root_writable(const std::string& root) {
  make_dirs(root);
  // The deepest path a save writes, made as a save makes it: its temporary
  // step directory (a step of 10 digits) and the optimizer file's temporary
  // copy. A root that is writable but too long for those paths fails here,
  // not at the first save (a ~4000-character run directory trained and then
  // lost its first checkpoint). A crash leaves a ".tmp-" directory the next
  // save removes.
  const std::string dir = join(root, fmt::format("{}step_{:010d}-{}", kTmpPrefix, 0, ::getpid()));
  const std::string probe = join(dir, fmt::format("{}.tmp.{}", kOptimizer, ::getpid()));
  auto refuse = [&](int err) {
    if (err == ENAMETOOLONG)
      fail("{}: cannot write checkpoints there: their files' paths would be too long for the file system ({} "
           "characters, such as {}); use a shorter run directory",
           root, probe.size(), probe);
    fail("{}: cannot write checkpoints there: {}", root, std::strerror(err));
  };
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) refuse(errno);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    ::rmdir(dir.c_str());
    refuse(err);
  }
  ::close(fd);
  ::unlink(probe.c_str());
  ::rmdir(dir.c_str());
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    int64_t step;
    std::error_code ec2;
    if (parse_step_name(it->path().filename().string(), &step) && it->is_directory(ec2))
      steps.emplace_back(step, it->path().string());
  }
  std::sort(steps.begin(), steps.end(), std::greater<>());
  return steps;
}

void validate_model_tensors(const std::vector<StTensor>& got,
                            const std::vector<std::pair<std::string, std::vector<int64_t>>>& expected,
                            const std::string& file) {
  std::vector<std::string> problems;
  std::map<std::string, const StTensor*> by_name;
  for (const StTensor& t : got)
    if (!by_name.emplace(t.name, &t).second) problems.push_back(fmt::format("duplicate tensor '{}'", t.name));
  std::set<std::string> wanted;
  for (const auto& [name, shape] : expected) {
    wanted.insert(name);
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      problems.push_back(fmt::format("missing tensor '{}'", name));
      continue;
    }
    const StTensor& t = *it->second;
    if (t.shape != shape)
      problems.push_back(fmt::format("tensor '{}' has shape [{}], expected [{}]", name, fmt::join(t.shape, ", "),
                                     fmt::join(shape, ", ")));
    if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F64)
      problems.push_back(
          fmt::format("tensor '{}' has dtype {}, expected F32, BF16, F16 or F64", name, dtype_name(t.dtype)));
  }
  for (const StTensor& t : got)
    if (!wanted.count(t.name)) problems.push_back(fmt::format("unexpected tensor '{}'", t.name));
  if (problems.empty()) return;
  const size_t more = problems.size() - 1;
  if (more == 0) fail("{}: {}", file, problems[0]);
  fail("{}: {} (and {} more problem{})", file, problems[0], more, more == 1 ? "" : "s");
}

void validate_layout_tensors(const std::vector<StTensor>& got, const ParamLayout& layout,
                             const std::vector<std::string>& prefixes, const std::string& file) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
  for (const std::string& prefix : prefixes)
    for (const ParamTensor& t : layout.tensors) expected.emplace_back(prefix + t.name, t.shape);
  validate_model_tensors(got, expected, file);
}

}  // namespace kvs
