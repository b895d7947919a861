#include "train/resume_point.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "train/checkpoint.h"
#include "train/rank_agreement.h"

namespace kvs {
namespace fs = std::filesystem;

bool has_checkpoints(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return false;
  return fs::exists(fs::path(root) / "latest", ec) || !list_checkpoints(root).empty();
}

namespace {

OpenedCheckpoint choose(const std::string& root, bool report) {
  std::error_code ec;
  const std::vector<std::pair<int64_t, std::string>> dirs =
      fs::is_directory(root, ec) ? list_checkpoints(root) : std::vector<std::pair<int64_t, std::string>>{};
  std::string latest, latest_problem;
  try {
    latest = latest_checkpoint(root);
    if (latest.empty() && !dirs.empty()) latest_problem = root + "/latest is missing";
  } catch (const Error& e) {
    latest_problem = e.what();
  }
  // Candidates: `latest`, then every step directory older than it (all of them without a usable `latest`).
  std::vector<std::string> candidates;
  int64_t below = INT64_MAX;
  if (!latest.empty()) {
    candidates.push_back(latest);
    for (const auto& [step, dir] : dirs)
      if (fs::equivalent(dir, latest, ec)) below = step;
  }
  for (const auto& [step, dir] : dirs)
    if (step < below) candidates.push_back(dir);
  KVS_CHECK(!candidates.empty(), "{}: --resume given but there is no checkpoint to resume from{}", root,
            latest_problem.empty() ? ""
                                   : "; " + latest_problem + ", and no step directory is left (remove " + root +
                                         "/latest to start a new run there)");
  if (!latest_problem.empty() && report)
    spdlog::warn("{}; looking for the newest step directory that verifies", latest_problem);

  std::string first_error;
  for (const std::string& dir : candidates) {
    try {
      OpenedCheckpoint ck = open_model_checkpoint(dir);
      // A weights-only directory (no optimizer or trainer state) cannot continue training: an older one may.
      KVS_CHECK(ck.files.optimizer && !ck.files.trainer_state.is_null(),
                "{}: no optimizer or trainer state: cannot resume training from it", dir);
      if (!ck.files.verified && report)
        spdlog::warn("{}: no manifest.json (an older or hand-made checkpoint): resuming without verifying its files",
                     dir);
      if ((!first_error.empty() || !latest_problem.empty()) && report)
        spdlog::warn("resuming from {}, the newest checkpoint that verifies", dir);
      return ck;
    } catch (const Error& e) {
      if (report) spdlog::warn("skipping checkpoint {}: {}", dir, e.what());
      if (first_error.empty()) first_error = e.what();
    }
  }
  fail("{}: no checkpoint loads and verifies ({} tried); the newest: {}", root, candidates.size(), first_error);
}

}  // namespace

OpenedCheckpoint find_resume_checkpoint(const std::string& root, dist::Communicator& comm) {
  OpenedCheckpoint ck = choose(root, comm.rank() == 0);
  if (comm.size() == 1) return ck;
  const auto& ts = ck.files.trainer_state;
  const double step = ts.is_object() && ts.contains("step") && ts["step"].is_number() ? ts["step"].get<double>() : -1;
  double range[2] = {step, -step};  // max, -min
  comm.all_reduce(range, 2, dist::DType::F64, dist::ReduceOp::Max);
  KVS_CHECK(range[0] == -range[1],
            "{}: the ranks chose different checkpoints to resume from (steps {} to {}; this rank {}): do they see "
            "the same files?",
            root, -range[1], range[0], ck.dir);
  // The same step is not the same checkpoint: per-node run directories may hold different runs.
  KVS_CHECK(same_on_every_rank(checkpoint_identity(ck.dir), comm),
            "{}: the ranks chose checkpoints of the same step {} with different contents (this rank {}): do they "
            "see the same files?",
            root, range[0], ck.dir);
  return ck;
}

}  // namespace kvs
