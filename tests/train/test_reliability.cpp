// Surviving faults (docs/RELIABILITY.md): checkpoint manifests and their
// verification, --resume falling back to the newest checkpoint that verifies,
// retention, asynchronous checkpoints, stop signals and the slow-step report.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "build_paths.h"
#include "core/error.h"
#include "core/fs.h"
#include "dist/comm.h"
#include "model/config.h"
#include "test_util.h"
#include "tiny_induction.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/checkpoint_writer.h"
#include "train/metrics.h"
#include "train/model_io.h"
#include "train/resume_point.h"
#include "train/step_watch.h"
#include "train/stop_signals.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using kvs::Config;
using kvs::testing_util::error_of;
using kvs::testing_util::slurp;
using kvs::testing_util::spit;
using kvs::testing_util::TmpDir;

namespace {

Config tiny(int steps, int checkpoint_every) {
  return kvs::testing_util::tiny_induction(
      true, {{"steps", steps}, {"eval_every", 0}, {"checkpoint_every", checkpoint_every}});
}

std::set<std::string> step_dirs(const std::string& root) {
  std::set<std::string> s;
  for (auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().rfind("step_", 0) == 0) s.insert(e.path().filename().string());
  return s;
}

void flip_byte(const std::string& path, size_t from_end) {
  std::string b = slurp(path);
  b[b.size() - from_end] ^= 0x10;
  spit(path, b);
}

kvs::CheckpointData small_data() {
  kvs::CheckpointData d;
  d.hf_config = {{"model_type", "llama"}};
  std::vector<float> w(64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f * static_cast<float>(i);
  d.model = {kvs::make_f32_tensor("w", {8, 8}, w.data())};
  d.optimizer = {kvs::make_f32_tensor("exp_avg.w", {8, 8}, w.data())};
  d.trainer_state = {{"step", 1}};
  return d;
}

}  // namespace

TEST(CheckpointManifest, ListsEveryFileButTheRunConfig) {
  TmpDir tmp;
  auto d = small_data();
  d.run_config = {{"name", "x"}};
  const std::string dir = kvs::save_checkpoint(tmp / "ck", 1, d);
  const auto m = nlohmann::json::parse(slurp(dir + "/manifest.json"));
  EXPECT_EQ(m["hash"], "xxh3_64");
  std::set<std::string> listed;
  for (const auto& [name, e] : m["files"].items()) {
    listed.insert(name);
    EXPECT_EQ(e["bytes"].get<uint64_t>(), fs::file_size(dir + "/" + name)) << name;
    EXPECT_EQ(e["xxh3_64"].get<std::string>().size(), 16u) << name;
  }
  EXPECT_EQ(listed, (std::set<std::string>{"config.json", "model.safetensors", "optimizer.safetensors",
                                            "trainer_state.json"}));
  EXPECT_TRUE(kvs::load_checkpoint(dir).verified);
  // The run config may be edited (a moved tokenizer): still verified.
  spit(dir + "/run_config.json", "{\"name\": \"y\"}\n");
  EXPECT_TRUE(kvs::load_checkpoint(dir).verified);
}

TEST(CheckpointManifest, CorruptionIsAOneLineErrorNamingTheFile) {
  TmpDir tmp;
  const std::string dir = kvs::save_checkpoint(tmp / "ck", 1, small_data());
  const std::string model = dir + "/model.safetensors";
  const std::string good = slurp(model);
  flip_byte(model, 3);  // inside the tensor data: still parses
  EXPECT_KVS_ERROR(kvs::load_checkpoint(dir), model + ": checksum mismatch (xxh3_64 ", "the file is corrupt");
  spit(model, good);
  const std::string ts = dir + "/trainer_state.json";
  const std::string ts_good = slurp(ts);
  spit(ts, "{\"step\": 7}\n");  // valid JSON, another step and size: only the manifest notices
  EXPECT_EQ(error_of([&] { kvs::load_checkpoint(dir); }),
            ts + ": 12 bytes, the manifest says " + std::to_string(ts_good.size()) + " (truncated)");
  fs::remove(ts);
  EXPECT_EQ(error_of([&] { kvs::load_checkpoint(dir); }), ts + ": missing (listed in manifest.json)");
  spit(dir + "/manifest.json", "{\"format\": 1");
  EXPECT_KVS_ERROR(kvs::load_checkpoint(dir), dir + "/manifest.json: invalid JSON");
  spit(dir + "/manifest.json", "{\"format\": \"other\"}");
  EXPECT_KVS_ERROR(kvs::load_checkpoint(dir), dir + "/manifest.json: not a kvshift checkpoint manifest");
}

TEST(CheckpointManifest, OldCheckpointsWithoutOneStillLoad) {
  TmpDir tmp;
  const std::string dir = kvs::save_checkpoint(tmp / "ck", 1, small_data());
  fs::remove(dir + "/manifest.json");
  const auto d = kvs::load_checkpoint(dir);
  EXPECT_FALSE(d.verified);
  EXPECT_EQ(d.model.size(), 1u);
}

// A checkpoint that does not verify is skipped by --resume, which says so and
// continues from the previous one; the run still ends bit-identical to an
// uninterrupted one, because the data position is in the checkpoint.
TEST(ResumeFallback, SkipsACorruptNewestCheckpoint) {
  TmpDir tmp;
  const Config full = tiny(12, 4);
  const auto ref = kvs::train(full, {tmp / "ref", false, true});
  for (const std::string damage : {"flip", "truncate", "flip-moment", "no-latest", "bad-latest", "weights-only"}) {
    SCOPED_TRACE(damage);
    const std::string run = tmp / ("run_" + damage), root = run + "/checkpoints";
    kvs::train(tiny(8, 4), {run, false, true});
    ASSERT_EQ(step_dirs(root), (std::set<std::string>{"step_00000004", "step_00000008"}));
    int64_t expected_step = 4;
    if (damage == "flip") flip_byte(root + "/step_00000008/model.safetensors", 5);
    if (damage == "truncate") fs::resize_file(root + "/step_00000008/optimizer.safetensors", 100);
    // Inside an Adam moment's data: the file still parses, only its checksum can tell.
    if (damage == "flip-moment") flip_byte(root + "/step_00000008/optimizer.safetensors", 5);
    if (damage == "no-latest") {
      fs::remove(root + "/latest");
      expected_step = 8;
    }
    if (damage == "bad-latest") {
      spit(root + "/latest", "step_00000099\n");
      expected_step = 8;
    }
    // Weights only, and unverifiable (no manifest): nothing to continue training from; the older one is.
    if (damage == "weights-only")
      for (const char* f : {"optimizer.safetensors", "manifest.json"}) fs::remove(root + "/step_00000008/" + f);
    const kvs::OpenedCheckpoint ck = kvs::find_resume_checkpoint(root, *kvs::dist::make_single_process());
    EXPECT_EQ(ck.files.trainer_state["step"], expected_step);
    const auto rest = kvs::train(full, {run, true, true});
    ASSERT_EQ(rest.losses.size(), static_cast<size_t>(12 - expected_step));
    for (size_t i = 0; i < rest.losses.size(); ++i)
      EXPECT_EQ(rest.losses[i], ref.losses[static_cast<size_t>(expected_step) + i]) << "step " << expected_step + 1 + i;
    EXPECT_EQ(rest.final_eval.loss, ref.final_eval.loss);
    // metrics.jsonl holds each step once: the lines the abandoned steps 5-8 wrote are dropped.
    std::map<int, std::vector<double>> logged;
    std::istringstream lines(slurp(run + "/metrics.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["type"] == "train") logged[j["step"].get<int>()].push_back(j["loss"].get<double>());
    }
    ASSERT_EQ(logged.size(), 12u);
    for (const auto& [step, losses] : logged) {
      ASSERT_EQ(losses.size(), 1u) << "step " << step;
      EXPECT_EQ(losses[0], ref.losses[static_cast<size_t>(step - 1)]) << "step " << step;
    }
  }
}

TEST(ResumeFallback, NothingVerifiesIsAOneLineErrorWithTheNewestProblem) {
  TmpDir tmp;
  const std::string run = tmp / "run", root = run + "/checkpoints";
  kvs::train(tiny(4, 2), {run, false, true});
  flip_byte(root + "/step_00000002/model.safetensors", 5);
  flip_byte(root + "/step_00000004/model.safetensors", 5);
  EXPECT_KVS_ERROR(kvs::train(tiny(6, 2), {run, true, true}),
                   root + ": no checkpoint loads and verifies (2 tried); the newest: " + root +
                       "/step_00000004/model.safetensors: checksum mismatch");
  // Step directories without `latest` still count as checkpoints: a fresh run refuses the directory.
  fs::remove(root + "/latest");
  EXPECT_KVS_ERROR(kvs::train(tiny(6, 2), {run, false, true}), "already has checkpoints");
  EXPECT_TRUE(kvs::has_checkpoints(root));
  EXPECT_FALSE(kvs::has_checkpoints(tmp / "nowhere"));
}

// A purge of the step directories that spared `latest`: neither a fresh start
// ("already has checkpoints") nor --resume ("no checkpoint") says what is
// wrong unless it names the file that is left.
TEST(ResumeFallback, ALatestWithoutAnyStepDirectoryIsNamedAsSuch) {
  TmpDir tmp;
  const std::string run = tmp / "run", root = run + "/checkpoints";
  kvs::train(tiny(4, 2), {run, false, true});
  for (const std::string& s : step_dirs(root)) fs::remove_all(root + "/" + s);
  EXPECT_KVS_ERROR(kvs::train(tiny(4, 2), {run, false, true}),
                   root + "/latest is all that is left of the run's checkpoints (no step directory): remove it");
  EXPECT_KVS_ERROR(kvs::train(tiny(4, 2), {run, true, true}),
                   root + ": --resume given but there is no checkpoint to resume from; " + root +
                       "/latest: names step_00000004, but " + root + "/step_00000004 does not exist, and no step "
                       "directory is left");
  fs::remove(root + "/latest");
  kvs::train(tiny(4, 2), {run, false, true});  // a new run
}

// The model must be the checkpoint's, but model.initializer_range only says
// how a fresh run draws its weights: a resume has them already.
TEST(ResumeFallback, InitializerRangeIsNoModelChangeOnResume) {
  TmpDir tmp;
  const std::string run = tmp / "run";
  kvs::train(tiny(2, 2), {run, false, true});
  Config other = tiny(4, 2);
  other.model.initializer_range *= 3;
  EXPECT_EQ(kvs::train(other, {run, true, true}).losses.size(), 2u);
  other.model.intermediate_size *= 2;
  EXPECT_KVS_ERROR(kvs::train(other, {run, true, true}), "the checkpoint's model differs from the config's model "
                   "section: model.intermediate_size");
}

// seq_len and the data settings are compared through run_config.json, which
// the manifest does not list: without it (a copy made from the manifest's
// list) --resume refuses, unless the data change is allowed.
TEST(ResumeFallback, ACheckpointWithoutItsRunConfigIsNotResumedUnchecked) {
  TmpDir tmp;
  const std::string run = tmp / "run", root = run + "/checkpoints";
  kvs::train(tiny(4, 2), {run, false, true});
  fs::remove(root + "/step_00000004/run_config.json");
  Config other = tiny(6, 2);
  other.train.seq_len /= 2;
  EXPECT_KVS_ERROR(kvs::train(other, {run, true, true}),
                   root + "/step_00000004/run_config.json is missing: train.seq_len and the data settings cannot be "
                          "compared with the checkpoint's",
                   "--allow-data-change");
  // A hand edit that left the keys out is no better.
  spit(root + "/step_00000004/run_config.json", "{}");
  EXPECT_KVS_ERROR(kvs::train(other, {run, true, true}),
                   root + "/step_00000004/run_config.json has no train.seq_len or no data.type: train.seq_len and "
                          "the data settings cannot be compared");
  kvs::TrainOptions allowed{run, true, true};
  allowed.allow_data_change = true;
  EXPECT_EQ(kvs::train(tiny(6, 2), allowed).losses.size(), 2u);
}

TEST(Retention, KeepsTheNewestN) {
  TmpDir tmp;
  Config c = tiny(10, 2);
  c.train.keep_checkpoints = 2;
  kvs::train(c, {tmp / "run", false, true});
  EXPECT_EQ(step_dirs(tmp / "run/checkpoints"), (std::set<std::string>{"step_00000008", "step_00000010"}));
  // A save points `latest` at its own step before pruning: the step `latest`
  // named before (8) goes like any other, and keep 1 leaves the new one alone.
  const std::string root = tmp / "run/checkpoints";
  spit(root + "/latest", "step_00000008\n");
  kvs::CheckpointWriter w(root, 1, false);
  w.save(12, small_data());
  EXPECT_EQ(step_dirs(root), (std::set<std::string>{"step_00000012"}));
  EXPECT_EQ(slurp(root + "/latest"), "step_00000012\n");
}

// An asynchronous checkpoint holds the same bytes as a synchronous one, and
// training does not change: the same losses, the same files.
// So does one streamed through a buffer smaller than any tensor (train.checkpoint_buffer_gb).
TEST(AsyncCheckpoint, BitIdenticalToSynchronous) {
  TmpDir tmp;
  Config sync = tiny(9, 3), async = sync, small_buffer = sync;
  async.train.async_checkpoint = true;
  small_buffer.train.async_checkpoint = true;
  small_buffer.train.checkpoint_buffer_gb = 1e-9;  // one byte: one tensor queued at a time
  const auto a = kvs::train(sync, {tmp / "sync", false, true});
  for (const auto& [name, c] : {std::pair{"async", async}, {"small_buffer", small_buffer}}) {
    const auto b = kvs::train(c, {tmp / name, false, true});
    EXPECT_EQ(a.losses, b.losses) << name;
    EXPECT_EQ(b.last_checkpoint, tmp / (std::string(name) + "/checkpoints/step_00000009"));
    for (const char* step : {"step_00000003", "step_00000006", "step_00000009"})
      for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json",
                            "manifest.json"})
        EXPECT_EQ(slurp(tmp / ("sync/checkpoints/" + std::string(step) + "/" + f)),
                  slurp(tmp / (std::string(name) + "/checkpoints/" + step + "/" + f)))
            << name << " " << step << "/" << f;
  }
}

// ... and the trainer's writes really are asynchronous (the test above passes
// on a trainer that ignores the flag): while step 3's write is held by the
// fault-injection pause, training goes on, so step 4's metrics line is
// written before step_00000003 exists. A synchronous run, the control,
// installs the directory first.
TEST(AsyncCheckpoint, TrainingGoesOnWhileAWriteIsHeld) {
  ASSERT_EQ(::setenv("KVS_FAULT_SAVE_PAUSE_S", "1", 1), 0);
  for (const bool async : {true, false}) {
    TmpDir tmp;
    Config c = tiny(4, 3);
    c.train.async_checkpoint = async;
    const std::string run = tmp / "run";
    std::atomic<int> step3_dir_at_step4{-1};  // -1: step 4's line never seen
    std::thread watcher([&] {
      for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
           std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(std::chrono::milliseconds(1))) {
        std::ifstream in(run + "/metrics.jsonl");
        for (std::string line; std::getline(in, line);) {
          const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);  // a line being written
          if (j.is_object() && j.value("type", "") == "train" && j.value("step", 0) == 4) {
            step3_dir_at_step4 = fs::exists(run + "/checkpoints/step_00000003") ? 1 : 0;
            return;
          }
        }
      }
    });
    const auto s = kvs::train(c, {run, false, true});
    watcher.join();
    EXPECT_EQ(s.steps_done, 4);
    EXPECT_EQ(step3_dir_at_step4.load(), async ? 0 : 1) << (async ? "async" : "sync");
    EXPECT_TRUE(fs::exists(run + "/checkpoints/step_00000003/manifest.json"));
  }
  ::unsetenv("KVS_FAULT_SAVE_PAUSE_S");
}

// A save that fails names the file by the checkpoint's own path, not by the
// temporary directory it was written in (removed by the time the message is
// read), and says the earlier checkpoints are untouched.
TEST(CheckpointSave, AFailedSaveNamesTheCheckpointsPathNotItsTemporaryOne) {
  TmpDir tmp;
  const std::string root = tmp / "ck";
  kvs::save_checkpoint(root, 1, small_data(), 0);
  auto bad = small_data();
  bad.model[0].bytes.resize(3);
  try {
    kvs::save_checkpoint(root, 2, bad, 0);
    FAIL() << "the save did not fail";
  } catch (const kvs::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(root + "/step_00000002/model.safetensors"), std::string::npos) << what;
    EXPECT_NE(what.find("(checkpoint step_00000002 not saved; the earlier ones are as they were)"), std::string::npos)
        << what;
    EXPECT_EQ(what.find(".tmp-"), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(root + "/step_00000002"));
  EXPECT_EQ(kvs::latest_checkpoint(root), root + "/step_00000001");
}

// The check before the first step makes a save's deepest path: a root that
// can be created but leaves no room for a checkpoint's file paths is refused
// then (it trained and failed its first save), and a good root keeps no probe.
TEST(CheckpointSave, ARootTooDeepForASavesPathsIsRefusedBeforeTraining) {
  TmpDir tmp;
  const std::string good = tmp / "ck";
  kvs::check_checkpoint_root_writable(good);
  EXPECT_TRUE(fs::is_empty(good));
  std::string deep = tmp.str();
  while (deep.size() < 4040) {
    const size_t n = std::min<size_t>(200, 4040 - deep.size());
    deep.push_back('/');
    deep.append(n, 'd');
  }
  ASSERT_NO_THROW(fs::create_directories(deep));
  try {
    kvs::check_checkpoint_root_writable(deep);
    FAIL() << "a root of " << deep.size() << " characters was accepted";
  } catch (const kvs::Error& e) {
    EXPECT_NE(std::string(e.what()).find("their files' paths would be too long for the file system"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::is_empty(deep));
}

// A failed asynchronous write (a full disk) is logged at the next save, which
// then writes its own step before returning: one failed write does not cost
// the next checkpoint (before, that save threw and the run ended with the
// previous one); a second failure in a row is the error, `latest` untouched.
TEST(AsyncCheckpoint, AFailedWriteIsLoggedAndTheNextSaveWritesBeforeGoingOn) {
  TmpDir tmp;
  const std::string root = tmp / "ck";
  kvs::CheckpointWriter w(root, 0, true);
  w.save(1, small_data());
  EXPECT_EQ(w.wait(), root + "/step_00000001");
  auto bad = small_data();
  bad.model[0].bytes.resize(3);  // the safetensors writer refuses it, on the writer thread
  w.save(2, bad);
  w.save(3, small_data());  // step 2's error is logged; step 3 is written before this returns
  EXPECT_EQ(kvs::latest_checkpoint(root), root + "/step_00000003");
  w.save(4, bad);
  EXPECT_KVS_ERROR(w.save(5, bad), "model.safetensors");  // two in a row
  EXPECT_EQ(kvs::latest_checkpoint(root), root + "/step_00000003");
  w.save(6, small_data());
  EXPECT_EQ(w.wait(), root + "/step_00000006");

  // The trainer's streamed saves alike: after a failed write, end_stream waits for the next one.
  auto streamed = [&](int64_t step, bool broken) {
    kvs::CheckpointData d = small_data();
    const kvs::CheckpointData full = d;
    for (auto* v : {&d.model, &d.optimizer})
      for (auto& t : *v) t.bytes.clear();
    auto stream = w.save_streamed(step, d, 1 << 20);
    for (const auto* v : {&full.model, &full.optimizer})
      for (kvs::StTensor t : *v) {
        if (broken) t.bytes.resize(3);
        stream->push(std::move(t));
      }
    w.end_stream(*stream);
  };
  streamed(7, true);
  streamed(8, false);
  EXPECT_EQ(kvs::latest_checkpoint(root), root + "/step_00000008");
  streamed(9, true);
  EXPECT_KVS_ERROR(streamed(10, true), "model.safetensors");
  EXPECT_EQ(kvs::latest_checkpoint(root), root + "/step_00000008");
}

// A stop signal in the middle of training: the step finishes, a checkpoint is
// written, train() returns early, and resuming gives the uninterrupted losses.
TEST(StopSignal, SigtermCheckpointsAndResumesBitIdentically) {
  TmpDir tmp;
  const Config c = tiny(200, 0);
  const auto ref = kvs::train(c, {tmp / "ref", false, true});
  const std::string run = tmp / "run";
  std::thread killer([&] {
    // Only once the handler is installed (the first metrics line is written after it).
    while (!fs::exists(run + "/metrics.jsonl") || fs::file_size(run + "/metrics.jsonl") == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ::kill(::getpid(), SIGTERM);
  });
  const auto stopped = kvs::train(c, {run, false, true});
  killer.join();
  EXPECT_EQ(stopped.stopped_by, "SIGTERM");
  ASSERT_GT(stopped.steps_done, 0);
  ASSERT_LT(stopped.steps_done, 200);
  EXPECT_EQ(stopped.last_checkpoint, run + "/checkpoints/" + kvs::checkpoint_dir_name(stopped.steps_done));
  const auto rest = kvs::train(c, {run, true, true});
  ASSERT_EQ(rest.losses.size() + stopped.losses.size(), 200u);
  for (size_t i = 0; i < rest.losses.size(); ++i)
    EXPECT_EQ(rest.losses[i], ref.losses[stopped.losses.size() + i]);
  EXPECT_EQ(rest.final_eval.loss, ref.final_eval.loss);
  // The default disposition is back after train().
  struct sigaction sa {};
  ::sigaction(SIGTERM, nullptr, &sa);
  EXPECT_EQ(sa.sa_handler, SIG_DFL);
}

// A stop signal does not wait for an evaluation (a long one would outlast
// SLURM's grace time and lose the checkpoint): it is abandoned at its next
// micro-batch, the step's checkpoint written, and no eval line recorded. After
// the last step that makes the run stopped, not complete: the resume then
// evaluates that step and records it.
TEST(StopSignal, AbandonsAnEvaluationAndTheResumeRecordsTheFinalOne) {
  for (const int steps : {2, 1}) {  // the signal in step 1's evaluation: not the last step, then the last
    SCOPED_TRACE(steps);
    TmpDir tmp;
    // An evaluation of 200,000 sequences takes seconds; a step, a millisecond.
    // log_every 1000: the line of step 1 is due only as the step a stop ends the run after.
    const Config c = kvs::testing_util::tiny_induction(
        true, {{"steps", steps}, {"eval_every", 1}, {"eval_sequences", 200000}, {"checkpoint_every", 0},
               {"log_every", 1000}});
    Config short_eval = c;  // the same training, quicker evaluations
    short_eval.train.eval_sequences = 64;
    const auto ref = kvs::train(short_eval, {tmp / "ref", false, true});
    const std::string run = tmp / "run";
    std::thread killer([&] {
      // metrics.jsonl is opened after the handlers are installed; step 1 takes a millisecond,
      // its evaluation seconds: a signal now or within them stops the run after step 1.
      while (!fs::exists(run + "/metrics.jsonl"))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ::kill(::getpid(), SIGTERM);
    });
    const auto t0 = std::chrono::steady_clock::now();
    const auto stopped = kvs::train(c, {run, false, true});
    const double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    killer.join();
    EXPECT_EQ(stopped.stopped_by, "SIGTERM");
    EXPECT_EQ(stopped.steps_done, 1);
    EXPECT_TRUE(stopped.final_eval.abandoned);
    EXPECT_EQ(stopped.last_checkpoint, run + "/checkpoints/" + kvs::checkpoint_dir_name(1));
    EXPECT_EQ(slurp(run + "/metrics.jsonl").find("\"type\":\"eval\""), std::string::npos)
        << slurp(run + "/metrics.jsonl");
    // The step the run stopped after has its train line, as a run's last step has.
    EXPECT_EQ(kvs::metrics_steps(run + "/metrics.jsonl").last, 1) << slurp(run + "/metrics.jsonl");
    EXPECT_LT(stop_s, 20.0);
    const auto rest = kvs::train(short_eval, {run, true, true});
    EXPECT_TRUE(rest.stopped_by.empty());
    ASSERT_EQ(rest.steps_done, steps);
    for (size_t i = 0; i < rest.losses.size(); ++i) EXPECT_EQ(rest.losses[i], ref.losses[1 + i]);
    // The last step's evaluation, recorded once, by whichever call made it.
    EXPECT_EQ(kvs::metrics_steps(run + "/metrics.jsonl").last_eval, steps);
    const std::string metrics = slurp(run + "/metrics.jsonl");
    const std::string last_eval = fmt::format("\"step\":{},\"type\":\"eval\"", steps);
    EXPECT_EQ(metrics.find(last_eval), metrics.rfind(last_eval)) << metrics;
    EXPECT_EQ(rest.final_eval.sequences, 64);
    EXPECT_EQ(rest.final_eval.loss, ref.final_eval.loss);
  }
}

namespace {

struct Child {
  pid_t pid;
  std::string out_path;
};

// kvshift started in the background, output to a file.
Child spawn_kvshift(const std::vector<std::string>& args, const std::string& out_path,
                    const std::vector<std::string>& env = {}) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv = {const_cast<char*>(kvs::test::cli_binary())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(kvs::test::cli_binary(), argv.data());
    ::_exit(127);
  }
  return {pid, out_path};
}

int wait_exit(pid_t pid, int timeout_s) {
  for (int i = 0; i < timeout_s * 100; ++i) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

bool wait_for(const std::function<bool()>& cond, int timeout_s) {
  for (int i = 0; i < timeout_s * 1000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

std::string write_config(const TmpDir& tmp, const Config& c) {
  const std::string p = tmp / "c.json";
  spit(p, kvs::to_json(c).dump());
  return p;
}

}  // namespace

TEST(StopSignal, CliExitsWithItsCodeAndNamesTheCheckpoint) {
  TmpDir tmp;
  const std::string cfg = write_config(tmp, tiny(100000, 0)), run = tmp / "run";
  const Child ch = spawn_kvshift({"train", "--quiet", "--config", cfg, "--run-dir", run}, tmp / "out.txt");
  ASSERT_TRUE(wait_for([&] { return fs::exists(run + "/metrics.jsonl") && fs::file_size(run + "/metrics.jsonl") > 0; },
                       60));
  ::kill(ch.pid, SIGUSR1);  // train.stop_signal's default
  EXPECT_EQ(wait_exit(ch.pid, 60), 75);
  const std::string out = slurp(ch.out_path);
  const std::string latest = kvs::latest_checkpoint(run + "/checkpoints");
  ASSERT_FALSE(latest.empty()) << out;
  EXPECT_NE(out.find("kvshift: SIGUSR1 received: finishing this step, then writing a checkpoint (send SIGTERM to "
                     "exit at once)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("kvshift: stopped by SIGUSR1 after step "), std::string::npos) << out;
  EXPECT_NE(out.find("; checkpoint " + latest + " (continue with --resume)"), std::string::npos) << out;
}

// A second SIGTERM during a checkpoint write exits at once: the interrupted
// save leaves only its temp directory, `latest` still names the previous checkpoint.
TEST(StopSignal, SecondSigtermExitsAtOnceWithoutTouchingLatest) {
  TmpDir tmp;
  const std::string cfg = write_config(tmp, tiny(100000, 5)), run = tmp / "run";
  const Child ch = spawn_kvshift({"train", "--quiet", "--config", cfg, "--run-dir", run}, tmp / "out.txt",
                                 {"KVS_FAULT_SAVE_PAUSE_S=2"});
  const std::string root = run + "/checkpoints";
  auto saving = [&] {
    if (!fs::exists(root + "/latest")) return false;  // the first save is complete, the second under way
    for (auto& e : fs::directory_iterator(root))
      if (e.path().filename().string().rfind(".tmp-step_", 0) == 0) return true;
    return false;
  };
  ASSERT_TRUE(wait_for(saving, 60)) << slurp(ch.out_path);
  const std::string before = slurp(root + "/latest");
  ::kill(ch.pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // past the 250 ms in which a repeat is the same request
  ::kill(ch.pid, SIGTERM);
  EXPECT_EQ(wait_exit(ch.pid, 10), 128 + SIGTERM);
  EXPECT_NE(slurp(ch.out_path).find("kvshift: second SIGTERM: exiting now; the last complete checkpoint is untouched"),
            std::string::npos);
  EXPECT_EQ(slurp(root + "/latest"), before);
  EXPECT_TRUE(kvs::load_checkpoint(kvs::latest_checkpoint(root)).verified);
}

// GNU timeout sends SIGTERM to the child and then to its process group, and
// torchrun sends SIGTERM to workers the terminal's SIGINT already reached:
// one request, delivered twice at once. It stops gracefully, with one line.
TEST(StopSignal, TheSameRequestDeliveredTwiceAtOnceIsOneStop) {
  for (const int second : {SIGTERM, SIGINT}) {
    TmpDir tmp;
    const std::string cfg = write_config(tmp, tiny(100000, 0)), run = tmp / "run";
    const Child ch = spawn_kvshift({"train", "--quiet", "--config", cfg, "--run-dir", run}, tmp / "out.txt");
    ASSERT_TRUE(wait_for(
        [&] { return fs::exists(run + "/metrics.jsonl") && fs::file_size(run + "/metrics.jsonl") > 0; }, 60));
    ::kill(ch.pid, SIGTERM);
    ::kill(ch.pid, second);
    EXPECT_EQ(wait_exit(ch.pid, 60), kvs::kExitStopped) << slurp(ch.out_path);
    const std::string out = slurp(ch.out_path);
    EXPECT_FALSE(kvs::latest_checkpoint(run + "/checkpoints").empty()) << out;
    EXPECT_EQ(out.find("second SIG"), std::string::npos) << out;
    // One line, naming whichever copy arrived first (the kernel delivers pending SIGINT before SIGTERM).
    const std::string line = " received: finishing this step, then writing a checkpoint";
    ASSERT_NE(out.find(line), std::string::npos) << out;
    EXPECT_EQ(out.find(line, out.find(line) + 1), std::string::npos) << out;
  }
}

TEST(StopSignal, ConfigKeyNamesTheSignal) {
  Config c = tiny(1, 0);
  EXPECT_EQ(c.train.stop_signal, kvs::StopSignal::Usr1);
  nlohmann::json j = kvs::to_json(c);
  j["train"]["stop_signal"] = "SIGKILL";
  EXPECT_EQ(error_of([&] { kvs::config_from_json(j, "x.json"); }),
            "x.json: train.stop_signal: must be \"SIGUSR1\", \"SIGUSR2\", \"SIGHUP\" or \"none\", got \"SIGKILL\"");
}

// The slow-step report: a step much slower than the median of recent steps
// gets a metrics line; a step still running past it gets the watchdog's line.
TEST(StepWatch, ReportsSlowStepsInMetrics) {
  TmpDir tmp;
  const std::string path = tmp / "metrics.jsonl";
  {
    kvs::MetricsWriter m;
    m.open(path);
    auto comm = kvs::dist::make_single_process();
    kvs::StepWatch w(*comm, 3.0, &m);
    for (int s = 1; s <= 10; ++s) {
      w.begin(s);
      w.end(0.01);
      EXPECT_EQ(w.boundary(s), 0);
    }
    w.begin(11);
    w.end(0.5);
    w.boundary(11);
    w.begin(12);
    std::this_thread::sleep_for(std::chrono::milliseconds(1700));  // the watchdog looks every 0.5 s, past 1 s
    w.end(1.7);
    w.boundary(12);
  }
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_GE(lines.size(), 3u) << slurp(path);
  EXPECT_EQ(lines[0]["type"], "straggler");
  EXPECT_EQ(lines[0]["step"], 11);
  EXPECT_EQ(lines[0]["step_time_s"], 0.5);
  EXPECT_EQ(lines[0]["median_step_s"], 0.01);
  EXPECT_EQ(lines[1]["step"], 12);
  EXPECT_TRUE(lines[1].contains("running_s")) << lines[1];
  EXPECT_EQ(lines[2]["step"], 12);
  EXPECT_EQ(lines[2]["step_time_s"], 1.7);
}

// Resuming drops the lines past the checkpoint's step and a line cut by a
// crash, and keeps the others as they were: a hand-added note, a "step" that
// is no number (it used to stop the resume with nlohmann's type error).
// A write that fails part-way (a full disk: here a file-size limit lets half
// the line through) loses that line whole: before, the next line continued the
// cut one, and the file no longer parsed.
TEST(MetricsWriter, AFailedWriteLosesItsLineWholeAndTheNextOneIsWritten) {
  TmpDir tmp;
  const std::string path = tmp / "metrics.jsonl";
  const std::string first = R"({"step":1,"type":"train"})" "\n";
  const std::string third = R"({"step":3,"type":"train"})" "\n";
  const auto old_xfsz = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal, as kvshift runs
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  {
    kvs::MetricsWriter m;
    m.open(path);
    m.write({{"type", "train"}, {"step", 1}});
    rlimit small = old_limit;
    small.rlim_cur = first.size() + 10;  // the second line gets 10 bytes through
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    m.write({{"type", "train"}, {"step", 2}});
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
    m.write({{"type", "train"}, {"step", 3}});
    EXPECT_EQ(m.lost_lines(), 1);
  }
  std::signal(SIGXFSZ, old_xfsz);
  EXPECT_EQ(kvs::testing_util::slurp(path), first + third);
}

TEST(MetricsWriter, ResumeDropsLaterStepsAndKeepsForeignLines) {
  TmpDir tmp;
  const std::string path = tmp / "metrics.jsonl";
  const std::string kept = R"({"type":"train","step":1})" "\n" R"({"type":"train","step":"x"})" "\n"
                          R"({"note":"by hand"})" "\n";
  kvs::testing_util::spit(path, kept + R"({"type":"train","step":3})" "\n" R"({"type":"tra)");
  {
    kvs::MetricsWriter m;
    m.open(path, 2);
    m.write({{"type", "train"}, {"step", 3}});
  }
  EXPECT_EQ(kvs::testing_util::slurp(path), kept + R"({"step":3,"type":"train"})" "\n");
  // metrics.jsonl as a link to a file elsewhere: that file is rewritten, the link stays.
  const std::string elsewhere = tmp / "dashboard.jsonl", linked = tmp / "linked.jsonl";
  kvs::testing_util::spit(elsewhere, kept + R"({"type":"train","step":3})" "\n");
  std::filesystem::create_symlink(elsewhere, linked);
  {
    kvs::MetricsWriter m;
    m.open(linked, 2);
    m.write({{"type", "train"}, {"step", 3}});
  }
  EXPECT_TRUE(std::filesystem::is_symlink(linked));
  EXPECT_EQ(kvs::testing_util::slurp(elsewhere), kept + R"({"step":3,"type":"train"})" "\n");
}
