// Training-level tests: the loss goes down, runs are reproducible, resume is
// bit-identical, and bad input or a diverging run fails cleanly without
// touching the last good checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>

#include "core/dir_lock.h"
#include "core/error.h"
#include "model/config.h"
#include "train/checkpoint.h"
#include "train/model_io.h"
#include "train/trainer.h"
#include "test_util.h"
#include "nonfinite_gradient_run.h"
#include "tiny_induction.h"

namespace fs = std::filesystem;
using kvs::Config;

namespace {

using kvs::testing_util::tiny_induction;

std::string fresh_dir(const std::string& name) {
  const std::string d = testing::TempDir() + "kvs_train_" + name;
  fs::remove_all(d);
  return d;
}

// Trains `c` uninterrupted, then again in a fresh run directory stopped after
// `split` steps and resumed; every loss after the split and the final
// evaluation must be bit-identical. Returns the uninterrupted run and the
// resumed run's directory.
std::pair<kvs::TrainSummary, std::string> expect_resume_is_bit_identical(const Config& c, int split,
                                                                         const std::string& name) {
  auto full = kvs::train(c, {fresh_dir(name + "_full"), false, true});
  const std::string dir = fresh_dir(name + "_resumed");
  Config head = c;
  head.train.steps = split;
  kvs::train(head, {dir, false, true});
  auto rest = kvs::train(c, {dir, true, true});
  const size_t after = static_cast<size_t>(c.train.steps - split);
  EXPECT_EQ(rest.losses.size(), after);
  for (size_t i = 0; i < std::min(after, rest.losses.size()); ++i)
    EXPECT_EQ(rest.losses[i], full.losses[split + i]) << name << ": step " << split + 1 + i;
  EXPECT_EQ(rest.final_eval.loss, full.final_eval.loss) << name;
  return {full, dir};
}

}  // namespace

TEST(Train, LossDecreases) {
  Config c = tiny_induction(true);
  c.train.steps = 300;
  auto s = kvs::train(c, {fresh_dir("decrease"), false, true});
  ASSERT_EQ(s.losses.size(), 300u);
  // The targets are drawn from a pool of 8 tokens per sequence: a model that
  // only learns "predict a token of this context" already goes from about
  // ln(30) = 3.4 to ln(8) = 2.1. Require most of that drop.
  double first = (s.losses[0] + s.losses[1] + s.losses[2]) / 3, last = (s.losses[297] + s.losses[298] + s.losses[299]) / 3;
  EXPECT_GT(first, 3.2);
  EXPECT_LT(last, 2.5) << "first " << first << " last " << last;
}

TEST(Train, SameSeedSameLosses) {
  Config c = tiny_induction(true);
  auto a = kvs::train(c, {fresh_dir("seed_a"), false, true});
  auto b = kvs::train(c, {fresh_dir("seed_b"), false, true});
  ASSERT_EQ(a.losses, b.losses);  // bit-identical
  c.train.seed = 99;
  auto d = kvs::train(c, {fresh_dir("seed_c"), false, true});
  EXPECT_NE(a.losses, d.losses);
}

TEST(Train, ResumeIsBitIdentical) {
  for (bool shift : {true, false}) {
    const std::string dir = expect_resume_is_bit_identical(tiny_induction(shift), 5, shift ? "kv" : "va").second;
    // metrics.jsonl holds each step once.
    std::ifstream in(dir + "/metrics.jsonl");
    std::string line;
    int train_lines = 0;
    while (std::getline(in, line)) train_lines += nlohmann::json::parse(line)["type"] == "train";
    EXPECT_EQ(train_lines, 12);
  }
}

TEST(Train, Window2TrainsAndResumesBitIdentically) {
  // The paper's longer shift window (section 4.7): initialised per footnote 14,
  // trained, checkpointed and resumed like window 1.
  Config c = tiny_induction(true);
  c.model.kv_shift.window = 2;
  c.train.steps = 200;
  kvs::validate(c, "tiny");
  const auto [full, dir] = expect_resume_is_bit_identical(c, 80, "w2");
  ASSERT_EQ(full.losses.size(), 200u);
  // As in LossDecreases: most of the drop from ln(30) towards ln(8).
  const double first = (full.losses[0] + full.losses[1] + full.losses[2]) / 3;
  const double last = (full.losses[197] + full.losses[198] + full.losses[199]) / 3;
  EXPECT_LT(last, 2.5) << "first " << first << " last " << last;
  // The checkpoint holds the [num_key_value_heads, 3] shift tensors.
  const auto ck = kvs::load_checkpoint(kvs::latest_checkpoint(dir + "/checkpoints"));
  EXPECT_EQ(ck.hf_config["kv_shift"]["window"], 2);
  int shift_tensors = 0;
  for (const auto& t : ck.model)
    if (t.name.find("_shift") != std::string::npos) {
      ++shift_tensors;
      EXPECT_EQ(t.shape, (std::vector<int64_t>{1, 3})) << t.name;
    }
  EXPECT_EQ(shift_tensors, 2);
}

TEST(Train, RefusesToOverwriteARun) {
  Config c = tiny_induction(true);
  c.train.steps = 2;
  const std::string dir = fresh_dir("overwrite");
  kvs::train(c, {dir, false, true});
  EXPECT_KVS_ERROR(kvs::train(c, {dir, false, true}), "--resume");
}

// A checkpoint every step: the step whose loss (here; the gradient norm:
// NonFiniteGradientStopsBeforeTheUpdate) is not finite stops the run before it
// saves, so the latest checkpoint is the step before it, and the message names
// that step and the non-finite value.
TEST(Train, DivergenceStopsAndKeepsCheckpoint) {
  Config c = tiny_induction(true);
  c.train.steps = 3;
  const std::string dir = fresh_dir("diverge");  // no "nan" or "inf" in the path the message names
  kvs::train(c, {dir, false, true});
  c.train.steps = 30;
  c.train.checkpoint_every = 1;
  c.train.lr = 1e30;
  c.train.warmup_steps = 0;
  c.train.grad_clip = 0;
  int failed_step = 0;
  try {
    kvs::train(c, {dir, true, true});
    FAIL() << "expected the run to stop on a non-finite loss";
  } catch (const kvs::Error& e) {
    const std::string msg = e.what();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(msg, m, std::regex("^step ([0-9]+): (loss|gradient norm) is -?(nan|inf) ")))
        << msg;
    failed_step = std::stoi(m[1]);
    EXPECT_NE(msg.find(kvs::latest_checkpoint(dir + "/checkpoints")), std::string::npos) << msg;
  }
  ASSERT_GT(failed_step, 4) << "the resumed run's first step (4) still starts from finite weights";
  const std::string latest = kvs::latest_checkpoint(dir + "/checkpoints");
  EXPECT_EQ(fs::path(latest).filename().string(), fmt::format("step_{:08d}", failed_step - 1));
  EXPECT_NO_THROW(kvs::load_checkpoint(latest));
}

// The gradient-norm branch (the lr 1e30 run above stops on its loss first):
// non-finite gradients under a finite loss at step 4 of 6.
TEST(Train, NonFiniteGradientStopsBeforeTheUpdate) {
  kvs::testing_util::expect_nonfinite_gradient_stops_cleanly(tiny_induction(true, {{"steps", 6}}), 4,
                                                       fresh_dir("bad_grad_full"), fresh_dir("bad_grad"));
}

TEST(Train, MissingOrCorruptCheckpointIsAClearError) {
  Config c = tiny_induction(true);
  c.train.steps = 2;
  const std::string dir = fresh_dir("corrupt");
  kvs::train(c, {dir, false, true});
  const std::string ck = kvs::latest_checkpoint(dir + "/checkpoints");
  c.train.steps = 4;
  {  // truncate the weights
    fs::resize_file(ck + "/model.safetensors", 100);
    EXPECT_KVS_ERROR(kvs::train(c, {dir, true, true}), "model.safetensors");
  }
  {
    fs::remove(ck + "/model.safetensors");
    EXPECT_KVS_ERROR(kvs::train(c, {dir, true, true}), "model.safetensors");
  }
}

TEST(Train, ResumeRejectsADifferentModel) {
  Config c = tiny_induction(true);
  c.train.steps = 2;
  const std::string dir = fresh_dir("mismatch");
  kvs::train(c, {dir, false, true});
  Config other = tiny_induction(false);
  other.train.steps = 4;
  EXPECT_KVS_ERROR(kvs::train(other, {dir, true, true}),
                   "the checkpoint's model differs from the config's model section: model.kv_shift.enabled: true vs "
                   "false (checkpoint vs config)");
  other = c;
  other.train.steps = 4;
  other.model.intermediate_size = 48;
  EXPECT_KVS_ERROR(kvs::train(other, {dir, true, true}), ": model.intermediate_size: 32 vs 48 (checkpoint vs config)");
  // The key the user changed, not head_dim, which follows from it (it sorts first).
  other = c;
  other.train.steps = 4;
  other.model.hidden_size = 32;
  EXPECT_KVS_ERROR(kvs::train(other, {dir, true, true}), ": model.hidden_size: 16 vs 32 (checkpoint vs config)");
  // The data stream: positions are sequence indices of this seed, window length and source.
  Config reseeded = c;
  reseeded.train.steps = 4;
  reseeded.train.seed = 4321;
  EXPECT_KVS_ERROR(kvs::train(reseeded, {dir, true, true}), "train.seed");
  Config shorter = c;
  shorter.train.steps = 4;
  shorter.train.seq_len = 8;
  EXPECT_KVS_ERROR(kvs::train(shorter, {dir, true, true}), "train.seq_len changed (checkpoint 16, config 8)");
  Config other_data = c;
  other_data.train.steps = 4;
  other_data.data.type = kvs::DatasetType::Ngram;
  other_data.data.ngram.token_hi = 32;
  kvs::validate(other_data, "tiny");
  EXPECT_KVS_ERROR(kvs::train(other_data, {dir, true, true}), "data.type changed (checkpoint \"induction\"");
  // Fewer steps than the checkpoint's: nothing to train, and not "done".
  Config fewer = c;
  fewer.train.steps = 1;
  EXPECT_KVS_ERROR(kvs::train(fewer, {dir, true, true}),
                   "the checkpoint is at step 2, past train.steps (1); raise train.steps to train on");
}

// A run resumed when it is already complete trains nothing and evaluates, but
// adds nothing to metrics.jsonl: each step's lines appear once.
TEST(Train, ResumeOfACompleteRunAddsNoMetrics) {
  Config c = tiny_induction(true, {{"steps", 2}, {"eval_every", 1}});
  const std::string dir = fresh_dir("complete");
  const auto done = kvs::train(c, {dir, false, true});
  const std::string before = kvs::testing_util::slurp(dir + "/metrics.jsonl");
  const auto again = kvs::train(c, {dir, true, true});
  EXPECT_TRUE(again.losses.empty());
  EXPECT_EQ(again.final_eval.loss, done.final_eval.loss);
  EXPECT_EQ(kvs::testing_util::slurp(dir + "/metrics.jsonl"), before);
}

// A run that fails before writing anything (here: its data files do not
// exist) removes the run directory it created, and leaves one that existed.
TEST(Train, AFailedStartLeavesNoEmptyRunDirectory) {
  Config c = tiny_induction(true, {{"steps", 1}});
  c.data.type = kvs::DatasetType::Shards;
  c.data.shards.train = {fresh_dir("no_such_shards") + "/train_*.bin"};
  const std::string dir = fresh_dir("failed_start");
  EXPECT_KVS_ERROR(kvs::train(c, {dir, false, true}), "no file matches");
  EXPECT_FALSE(fs::exists(dir));
  fs::create_directories(dir);
  EXPECT_KVS_ERROR(kvs::train(c, {dir, false, true}), "no file matches");
  EXPECT_TRUE(fs::is_directory(dir));
  // The parents it created for a nested --run-dir go too, not those that were there.
  EXPECT_KVS_ERROR(kvs::train(c, {dir + "/a/b/c/", false, true}), "no file matches");
  EXPECT_FALSE(fs::exists(dir + "/a"));
  EXPECT_TRUE(fs::is_directory(dir));
}

// A fresh run writes config.json and metrics.jsonl into --run-dir: a
// directory holding a checkpoint or a Hugging Face model (a path meant for
// --init-from) or another program's config.json is refused and left as it was.
// An earlier run that stopped before its first checkpoint is started again,
// and its metrics and config are kept beside the new run's, never overwritten.
TEST(Train, RefusesARunDirectoryHoldingAModel) {
  Config c = tiny_induction(true, {{"steps", 1}});
  const std::string src = fresh_dir("holds_model_src");
  kvs::train(c, {src, false, true});
  const std::string ck = kvs::latest_checkpoint(src + "/checkpoints");
  const std::string config_before = kvs::testing_util::slurp(ck + "/config.json");
  EXPECT_KVS_ERROR(kvs::train(c, {ck, false, true}), ck + ": holds model weights (",
                   "use another --run-dir (--init-from " + ck + " starts a run from those weights)");
  EXPECT_EQ(kvs::testing_util::slurp(ck + "/config.json"), config_before);
  EXPECT_FALSE(fs::exists(ck + "/metrics.jsonl"));

  const std::string foreign = fresh_dir("holds_foreign_config");
  fs::create_directories(foreign);
  kvs::testing_util::spit(foreign + "/config.json", "{\"hidden_size\": 64}\n");
  EXPECT_KVS_ERROR(kvs::train(c, {foreign, false, true}), foreign + "/config.json: not a kvshift run's config");
  EXPECT_EQ(kvs::testing_util::slurp(foreign + "/config.json"), "{\"hidden_size\": 64}\n");

  const std::string earlier = fresh_dir("earlier_run");  // stopped before its first checkpoint
  kvs::train(c, {earlier, false, true});
  fs::remove_all(earlier + "/checkpoints");
  const std::string metrics_first = kvs::testing_util::slurp(earlier + "/metrics.jsonl");
  const std::string config_first = kvs::testing_util::slurp(earlier + "/config.json");
  c.train.steps = 2;  // the second run differs, so each file tells which run wrote it
  kvs::train(c, {earlier, false, true});
  EXPECT_EQ(kvs::testing_util::slurp(earlier + "/metrics.earlier-1.jsonl"), metrics_first);
  EXPECT_EQ(kvs::testing_util::slurp(earlier + "/config.earlier-1.json"), config_first);
  const std::string metrics_second = kvs::testing_util::slurp(earlier + "/metrics.jsonl");
  EXPECT_NE(metrics_second, metrics_first);
  EXPECT_NE(kvs::testing_util::slurp(earlier + "/config.json"), config_first);
  fs::remove_all(earlier + "/checkpoints");
  kvs::train(c, {earlier, false, true});  // a third start keeps the second's as number 2
  EXPECT_EQ(kvs::testing_util::slurp(earlier + "/metrics.earlier-1.jsonl"), metrics_first);
  EXPECT_EQ(kvs::testing_util::slurp(earlier + "/metrics.earlier-2.jsonl"), metrics_second);
  // A failed start's file (no training line yet) is replaced.
  fs::remove_all(earlier + "/checkpoints");
  kvs::testing_util::spit(earlier + "/metrics.jsonl", "");
  kvs::train(c, {earlier, false, true});
  EXPECT_FALSE(fs::exists(earlier + "/metrics.earlier-3.jsonl"));
}

// A run directory another trainer holds (core/dir_lock) is refused, fresh or
// resumed, and nothing in it changes; a finished run leaves no lock file.
TEST(Train, RefusesARunDirectoryAnotherTrainerHolds) {
  Config c = tiny_induction(true, {{"steps", 2}, {"checkpoint_every", 1}});
  const std::string dir = fresh_dir("held_by_another");
  kvs::train(c, {dir, false, true});
  EXPECT_FALSE(fs::exists(dir + "/" + kvs::DirLock::kFileName));
  const std::string metrics_before = kvs::testing_util::slurp(dir + "/metrics.jsonl");
  {
    const kvs::DirLock other(dir);
    c.train.steps = 4;
    EXPECT_KVS_ERROR(kvs::train(c, {dir, true, true}), dir + ": another kvshift train (pid ");
    EXPECT_KVS_ERROR(kvs::train(c, {dir, false, true}), dir + ": another kvshift train (pid ");
    EXPECT_EQ(kvs::testing_util::slurp(dir + "/metrics.jsonl"), metrics_before);
  }
  EXPECT_EQ(kvs::train(c, {dir, true, true}).losses.size(), 2u);  // steps 3 and 4
}

TEST(Train, ShiftVariantsTrainAndResumeBitIdentically) {
  // QKV shifting (appendix J) and the section 4.6 parametrisations: each trains
  // without NaN and resumes from a checkpoint bit-identically.
  struct Variant {
    const char* name;
    bool shift_q;
    kvs::ShiftParametrization parametrization;
  };
  using P = kvs::ShiftParametrization;
  for (const Variant& v : {Variant{"qkv", true, P::Free}, Variant{"gate", false, P::SigmoidGate},
                           Variant{"clamp", false, P::Clamp01}, Variant{"qkv_gate", true, P::SigmoidGate}}) {
    SCOPED_TRACE(v.name);
    Config c = tiny_induction(true);
    c.model.kv_shift.shift_q = v.shift_q;
    c.model.kv_shift.parametrization = v.parametrization;
    kvs::validate(c, "tiny");
    const auto full = expect_resume_is_bit_identical(c, 5, std::string("var_") + v.name).first;
    ASSERT_EQ(full.losses.size(), 12u);
    for (double l : full.losses) ASSERT_TRUE(std::isfinite(l));
    EXPECT_LT(full.losses.back(), full.losses.front());
  }
}

// --init-from: a fresh run (step 0, fresh optimizer) starts from a
// checkpoint's weights. With lr 0 the first step changes nothing, so its
// checkpoint holds exactly the source weights; a different model is an error.
TEST(Train, InitFromStartsFromTheCheckpointWeights) {
  Config c = tiny_induction(true);
  c.train.steps = 3;
  const std::string src = fresh_dir("init_src");
  kvs::train(c, {src, false, true});
  const std::string ck = kvs::latest_checkpoint(src + "/checkpoints");
  Config d = c;
  d.train.steps = 1;
  d.train.lr = 0;
  d.train.min_lr = 0;
  d.train.weight_decay = 0;
  d.train.seed = c.train.seed + 1;  // a different seed: the weights must come from the checkpoint
  const std::string dst = fresh_dir("init_dst");
  kvs::TrainOptions o{dst, false, true};
  o.init_from = ck;
  kvs::train(d, o);
  const auto a = kvs::read_checkpoint(ck), b = kvs::read_checkpoint(kvs::latest_checkpoint(dst + "/checkpoints"));
  ASSERT_EQ(a.data.model.size(), b.data.model.size());
  for (size_t i = 0; i < a.data.model.size(); ++i)
    EXPECT_EQ(kvs::tensor_to_f32(a.data.model[i]), kvs::tensor_to_f32(b.data.model[i])) << a.data.model[i].name;
  EXPECT_EQ(b.data.trainer_state["step"], 1);

  Config other = d;
  other.model.kv_shift.enabled = false;
  kvs::TrainOptions o2{fresh_dir("init_bad"), false, true};
  o2.init_from = ck;
  EXPECT_KVS_ERROR(kvs::train(other, o2), {"--init-from", ck, "differs from the config's model"});
}
