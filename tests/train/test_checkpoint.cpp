// Checkpoint directory format (train/checkpoint.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"
#include "core/fs.h"
#include "core/safetensors.h"
#include "train/checkpoint.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using kvs::testing_util::error_of;
using kvs::testing_util::spit;
using kvs::testing_util::TmpDir;

kvs::CheckpointData make_data(float seed, bool full = true) {
  kvs::CheckpointData d;
  d.hf_config = {{"model_type", "llama"}, {"hidden_size", 16}, {"kv_shift", {{"window", 1}}}};
  std::vector<float> w(16 * 4), n(16), s(2 * 2);
  for (size_t i = 0; i < w.size(); ++i) w[i] = seed + 0.01f * i;
  for (size_t i = 0; i < n.size(); ++i) n[i] = seed * 2 + i;
  for (size_t i = 0; i < s.size(); ++i) s[i] = seed - i;
  d.model = {kvs::make_f32_tensor("model.embed_tokens.weight", {4, 16}, w.data()),
             kvs::make_f32_tensor("model.norm.weight", {16}, n.data()),
             kvs::make_f32_tensor("model.layers.0.self_attn.k_shift", {2, 2}, s.data())};
  if (full) {
    d.optimizer = {kvs::make_f32_tensor("exp_avg.model.norm.weight", {16}, n.data()),
                   kvs::make_f32_tensor("exp_avg_sq.model.norm.weight", {16}, n.data())};
    d.trainer_state = {{"step", 5}, {"rng", {{"seed", 42}}}, {"data_position", 1234}};
    d.run_config = {{"train", {{"lr", 0.001}}}};
  }
  return d;
}

void expect_same_tensors(const std::vector<kvs::StTensor>& a, const std::vector<kvs::StTensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].dtype, b[i].dtype);
    EXPECT_EQ(a[i].shape, b[i].shape);
    EXPECT_EQ(a[i].bytes, b[i].bytes) << a[i].name;
  }
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> s;
  for (auto& e : fs::directory_iterator(dir)) s.insert(e.path().filename().string());
  return s;
}

}  // namespace

TEST(Checkpoint, DirName) {
  EXPECT_EQ(kvs::checkpoint_dir_name(0), "step_00000000");
  EXPECT_EQ(kvs::checkpoint_dir_name(100), "step_00000100");
  EXPECT_EQ(kvs::checkpoint_dir_name(123456789), "step_123456789");
  EXPECT_THROW(kvs::checkpoint_dir_name(-1), kvs::Error);
}

TEST(Checkpoint, SaveLoadRoundTrip) {
  TmpDir tmp;
  const std::string root = tmp / "ckpt";  // created on demand
  auto d = make_data(1.5f);
  std::string dir = kvs::save_checkpoint(root, 5, d);
  EXPECT_EQ(dir, tmp / "ckpt/step_00000005");
  EXPECT_EQ(entries(dir), (std::set<std::string>{"config.json", "model.safetensors", "optimizer.safetensors",
                                                 "trainer_state.json", "run_config.json", "manifest.json"}));
  EXPECT_EQ(entries(root), (std::set<std::string>{"latest", "step_00000005"}));
  EXPECT_EQ(kvs::read_file(root + "/latest"), "step_00000005\n");
  EXPECT_EQ(kvs::latest_checkpoint(root), dir);
  // config.json is pretty-printed with a 2-space indent (Hugging Face style).
  EXPECT_EQ(kvs::read_file(dir + "/config.json"), d.hf_config.dump(2) + "\n");
  EXPECT_EQ(kvs::read_file(dir + "/config.json").substr(0, 4), "{\n  ");

  auto l = kvs::load_checkpoint(dir);
  EXPECT_EQ(l.hf_config, d.hf_config);
  expect_same_tensors(l.model, d.model);
  expect_same_tensors(l.optimizer, d.optimizer);
  EXPECT_EQ(l.trainer_state, d.trainer_state);
  EXPECT_EQ(l.run_config, d.run_config);
}

TEST(Checkpoint, OptionalPartsAreOptional) {
  TmpDir tmp;
  auto d = make_data(2.0f, /*full=*/false);
  std::string dir = kvs::save_checkpoint(tmp.str(), 7, d);
  EXPECT_EQ(entries(dir), (std::set<std::string>{"config.json", "model.safetensors", "manifest.json"}));
  auto l = kvs::load_checkpoint(dir);
  expect_same_tensors(l.model, d.model);
  EXPECT_TRUE(l.optimizer.empty());
  EXPECT_TRUE(l.trainer_state.is_null());
  EXPECT_TRUE(l.run_config.is_null());
}

TEST(Checkpoint, LatestFollowsSaves) {
  TmpDir tmp;
  EXPECT_EQ(kvs::latest_checkpoint(tmp / "does-not-exist"), "");
  EXPECT_EQ(kvs::latest_checkpoint(tmp.str()), "");
  kvs::save_checkpoint(tmp.str(), 10, make_data(1));
  EXPECT_EQ(kvs::latest_checkpoint(tmp.str()), tmp / "step_00000010");
  kvs::save_checkpoint(tmp.str(), 20, make_data(2));
  EXPECT_EQ(kvs::latest_checkpoint(tmp.str()), tmp / "step_00000020");
  // A save of an older step (a rollback) becomes `latest`.
  kvs::save_checkpoint(tmp.str(), 15, make_data(3));
  EXPECT_EQ(kvs::latest_checkpoint(tmp.str()), tmp / "step_00000015");
  EXPECT_EQ(entries(tmp.str()), (std::set<std::string>{"latest", "step_00000010", "step_00000015", "step_00000020"}));
}

TEST(Checkpoint, LatestErrors) {
  TmpDir tmp;
  const std::string latest = tmp / "latest";
  spit(latest, "step_00000042\n");
  EXPECT_KVS_ERROR(kvs::latest_checkpoint(tmp.str()), latest, "step_00000042", "does not exist");
  for (const std::string& bad : std::vector<std::string>{"", "\n", "garbage\n", "../step_00000001\n", "step_1\n", "step_00000001/x\n",
                                "step_0000000a\n", std::string("step_00000001\0", 14)}) {
    spit(latest, bad);
    EXPECT_KVS_ERROR(kvs::latest_checkpoint(tmp.str()), latest, "malformed");
  }
  // Trailing whitespace variations are accepted.
  fs::create_directory(tmp / "step_00000001");
  spit(latest, "step_00000001\r\n");
  EXPECT_EQ(kvs::latest_checkpoint(tmp.str()), tmp / "step_00000001");
  spit(latest, "step_00000001");
  EXPECT_EQ(kvs::latest_checkpoint(tmp.str()), tmp / "step_00000001");
}

TEST(Checkpoint, KeepLastPrunesOldest) {
  TmpDir tmp;
  const std::string r = tmp.str();
  for (int s = 1; s <= 5; ++s) kvs::save_checkpoint(r, s * 100, make_data(float(s)), /*keep_last=*/2);
  EXPECT_EQ(entries(r), (std::set<std::string>{"latest", "step_00000400", "step_00000500"}));
  // Saving an older step: the two newest stay, and so does the one `latest` names.
  kvs::save_checkpoint(r, 300, make_data(9), 2);
  EXPECT_EQ(entries(r), (std::set<std::string>{"latest", "step_00000300", "step_00000400", "step_00000500"}));
  EXPECT_EQ(kvs::latest_checkpoint(r), tmp / "step_00000300");
  kvs::save_checkpoint(r, 600, make_data(6), 2);
  EXPECT_EQ(entries(r), (std::set<std::string>{"latest", "step_00000500", "step_00000600"}));
  // keep_last = 1 keeps just the new one; unrelated entries are never touched.
  fs::create_directory(tmp / "notes");
  spit(tmp / "README", "x");
  kvs::save_checkpoint(r, 700, make_data(7), 1);
  EXPECT_EQ(entries(r), (std::set<std::string>{"README", "latest", "notes", "step_00000700"}));
  // keep_last = 0 keeps everything.
  for (int s = 8; s <= 10; ++s) kvs::save_checkpoint(r, s * 100, make_data(float(s)), 0);
  EXPECT_EQ(entries(r).size(), 7u);
}

TEST(Checkpoint, CrashLeftoversAreIgnoredThenCleaned) {
  TmpDir tmp;
  const std::string r = tmp.str();
  auto d1 = make_data(1);
  kvs::save_checkpoint(r, 1, d1);
  // A save of step 2 that crashed mid-way: partial temp dir, and a half-written
  // `latest` temp file that never got renamed.
  fs::create_directory(tmp / ".tmp-step_00000002-99999");
  spit(tmp / ".tmp-step_00000002-99999/config.json", "{\"hidden_");
  spit(tmp / ".tmp-step_00000002-99999/model.safetensors", std::string(5, '\x07'));
  spit(tmp / ".tmp-step_00000002-99999/model.safetensors.tmp.99999", "junk");
  spit(tmp / "latest.tmp.99999", "step_00000002\n");
  // A crash between moving a finished dir into place and updating `latest`.
  kvs::save_checkpoint(tmp / "other", 3, make_data(3));
  fs::rename(tmp / "other/step_00000003", tmp / "step_00000003");

  EXPECT_EQ(kvs::latest_checkpoint(r), tmp / "step_00000001");
  auto l = kvs::load_checkpoint(kvs::latest_checkpoint(r));
  expect_same_tensors(l.model, d1.model);

  fs::remove_all(tmp / "other");
  kvs::save_checkpoint(r, 2, make_data(2));
  EXPECT_EQ(entries(r), (std::set<std::string>{"latest", "step_00000001", "step_00000002", "step_00000003"}));
  EXPECT_EQ(kvs::latest_checkpoint(r), tmp / "step_00000002");
  expect_same_tensors(kvs::load_checkpoint(tmp / "step_00000002").model, make_data(2).model);
}

TEST(Checkpoint, SavingTheSameStepTwiceReplacesIt) {
  TmpDir tmp;
  const std::string r = tmp.str();
  kvs::save_checkpoint(r, 4, make_data(1));
  auto d2 = make_data(2, /*full=*/false);
  std::string dir = kvs::save_checkpoint(r, 4, d2);
  EXPECT_EQ(entries(r), (std::set<std::string>{"latest", "step_00000004"}));
  EXPECT_EQ(entries(dir), (std::set<std::string>{"config.json", "model.safetensors", "manifest.json"}));  // no stale optimizer file
  auto l = kvs::load_checkpoint(kvs::latest_checkpoint(r));
  expect_same_tensors(l.model, d2.model);
  EXPECT_TRUE(l.optimizer.empty());
}

TEST(Checkpoint, SavingTheSameStepTwiceWithoutRenameExchange) {
  // The fallback for file systems without renameat2(RENAME_EXCHANGE).
  TmpDir tmp;
  const std::string r = tmp.str();
  ::setenv("KVS_NO_RENAME_EXCHANGE", "1", 1);
  kvs::save_checkpoint(r, 4, make_data(1));
  auto d2 = make_data(2);
  kvs::save_checkpoint(r, 4, d2);
  ::unsetenv("KVS_NO_RENAME_EXCHANGE");
  EXPECT_EQ(entries(r), (std::set<std::string>{"latest", "step_00000004"}));
  auto l = kvs::load_checkpoint(kvs::latest_checkpoint(r));
  expect_same_tensors(l.model, d2.model);
  expect_same_tensors(l.optimizer, d2.optimizer);
}

TEST(Checkpoint, FailedSaveLeavesPreviousIntact) {
  TmpDir tmp;
  const std::string r = tmp.str();
  auto d1 = make_data(1);
  kvs::save_checkpoint(r, 1, d1);
  auto bad = make_data(2);
  bad.model[1].bytes.resize(3);  // inconsistent with its shape: the writer refuses
  EXPECT_KVS_ERROR(kvs::save_checkpoint(r, 2, bad), "model.safetensors", "model.norm.weight");
  EXPECT_KVS_ERROR(kvs::save_checkpoint(r, 1, bad), "model.safetensors");  // same step: old one must survive
  EXPECT_EQ(entries(r), (std::set<std::string>{"latest", "step_00000001"}));
  expect_same_tensors(kvs::load_checkpoint(kvs::latest_checkpoint(r)).model, d1.model);
  auto no_cfg = make_data(3);
  no_cfg.hf_config = json();
  EXPECT_KVS_ERROR(kvs::save_checkpoint(r, 3, no_cfg), "config.json", "JSON object");
}

TEST(Checkpoint, MissingOrCorruptFilesNameTheFile) {
  TmpDir tmp;
  const std::string r = tmp.str();
  EXPECT_KVS_ERROR(kvs::load_checkpoint(tmp / "nope"), tmp / "nope", "does not exist");
  auto fresh = [&] {
    fs::remove_all(tmp / "step_00000001");
    return kvs::save_checkpoint(r, 1, make_data(1));
  };

  std::string dir = fresh();
  fs::remove(dir + "/config.json");
  EXPECT_EQ(error_of([&] { kvs::load_checkpoint(dir); }), dir + ": missing config.json (not a kvshift checkpoint?)");

  dir = fresh();
  fs::remove(dir + "/model.safetensors");
  EXPECT_EQ(error_of([&] { kvs::load_checkpoint(dir); }),
            dir + ": missing model.safetensors (not a kvshift checkpoint?)");

  dir = fresh();
  spit(dir + "/config.json", "{\n  \"hidden_size\": 16,\n  oops\n}\n");
  EXPECT_KVS_ERROR(kvs::load_checkpoint(dir), dir + "/config.json", "invalid JSON", "line 3");

  dir = fresh();
  spit(dir + "/config.json", "[1]");
  EXPECT_KVS_ERROR(kvs::load_checkpoint(dir), dir + "/config.json", "object");

  dir = fresh();
  spit(dir + "/trainer_state.json", "{\"step\": ");
  EXPECT_KVS_ERROR(kvs::load_checkpoint(dir), dir + "/trainer_state.json", "invalid JSON");

  // run_config.json (outside the manifest, may be edited): its error is kept for
  // the readers that need the file, and the checkpoint loads.
  dir = fresh();
  spit(dir + "/run_config.json", "");
  {
    const kvs::CheckpointData d = kvs::load_checkpoint(dir);
    EXPECT_TRUE(d.run_config.is_null());
    EXPECT_NE(d.run_config_error.find(dir + "/run_config.json: invalid JSON"), std::string::npos) << d.run_config_error;
  }

  dir = fresh();
  {
    std::string m = kvs::read_file(dir + "/model.safetensors");
    spit(dir + "/model.safetensors", m.substr(0, m.size() - 10));
  }
  EXPECT_KVS_ERROR(kvs::load_checkpoint(dir), dir + "/model.safetensors", "tensor '");

  dir = fresh();
  spit(dir + "/optimizer.safetensors", "xx");
  EXPECT_KVS_ERROR(kvs::load_checkpoint(dir), dir + "/optimizer.safetensors");
}

TEST(Checkpoint, ValidateModelTensors) {
  auto d = make_data(1);
  const std::string f = "DIR/model.safetensors";
  std::vector<std::pair<std::string, std::vector<int64_t>>> exp = {
      {"model.embed_tokens.weight", {4, 16}},
      {"model.norm.weight", {16}},
      {"model.layers.0.self_attn.k_shift", {2, 2}}};
  kvs::validate_model_tensors(d.model, exp, f);  // ok

  // Reduced-precision float dtypes are accepted.
  std::vector<float> n(16, 1.0f);
  auto bf = d.model;
  bf[1] = kvs::make_bf16_tensor("model.norm.weight", {16}, n.data());
  kvs::validate_model_tensors(bf, exp, f);

  auto wrong = exp;
  wrong[1].second = {8};
  EXPECT_EQ(error_of([&] { kvs::validate_model_tensors(d.model, wrong, f); }),
            "DIR/model.safetensors: tensor 'model.norm.weight' has shape [16], expected [8]");

  auto more = exp;
  more.push_back({"lm_head.weight", {4, 16}});
  EXPECT_EQ(error_of([&] { kvs::validate_model_tensors(d.model, more, f); }),
            "DIR/model.safetensors: missing tensor 'lm_head.weight'");

  auto extra = d.model;
  extra.push_back(kvs::make_f32_tensor("foo", {1}, n.data()));
  EXPECT_EQ(error_of([&] { kvs::validate_model_tensors(extra, exp, f); }),
            "DIR/model.safetensors: unexpected tensor 'foo'");

  auto ints = d.model;
  std::vector<int32_t> iv(16, 0);
  ints[1] = kvs::make_i32_tensor("model.norm.weight", {16}, iv.data());
  EXPECT_KVS_ERROR(kvs::validate_model_tensors(ints, exp, f), f, "'model.norm.weight'", "dtype I32");

  EXPECT_KVS_ERROR(kvs::validate_model_tensors(extra, more, f), f, "missing tensor 'lm_head.weight'", "and 1 more problem");
}
