// A checkpoint records the tokenizer it was trained with (trainer_state.json
// "tokenizer_sha256"), and everything that reads its ids later refuses
// another one: generate, export-hf, eval, train --resume and --init-from.
// The tokenizer is swapped at the same path, as `kvshift tokenizer train
// --force` would leave it, where nothing else could tell.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "build_paths.h"
#include "core/sha256.h"
#include "data/prepare.h"
#include "test_util.h"
#include "text_corpus_util.h"
#include "tokenizer/train.h"

namespace kvs {
namespace {

namespace fs = std::filesystem;
using testing_util::corpus_text;
using testing_util::run_kvshift;
using testing_util::shared_tokenizer_dir;
using testing_util::slurp;
using testing_util::spit;
using testing_util::TmpDir;

TEST(CheckpointTokenizer, AnotherTokenizerAtTheSamePathIsRefusedEverywhere) {
  TmpDir tmp;
  fs::copy(shared_tokenizer_dir(), tmp / "tok");
  spit(tmp / "a.txt", corpus_text(200, 5));
  PrepareOptions o;
  o.tokenizer = tmp / "tok";
  o.inputs = {tmp / "a.txt"};
  o.out = tmp / "shards";
  o.progress = false;
  o.split.mode = "lines";
  prepare_data(o);
  auto j = nlohmann::json::parse(slurp(std::string(test::source_dir()) + "/configs/toy/lm-small-kvshift.json"));
  j["data"] = {{"type", "shards"},
               {"tokenizer", tmp / "tok"},
               {"shards", {{"train", {tmp / "shards/train_*.bin"}}, {"val", {tmp / "shards/val_*.bin"}}}}};
  j["model"]["vocab_size"] = 512;
  j["model"]["num_hidden_layers"] = 1;
  j["train"] = {{"seq_len", 32}, {"micro_batch_size", 2}, {"steps", 2}, {"eval_every", 0}, {"eval_sequences", 2},
                {"threads", 1}};
  spit(tmp / "c.json", j.dump(2));
  const std::string run = tmp / "run", ck = tmp / "run/checkpoints/step_00000002";
  auto r = run_kvshift("train --quiet --config " + (tmp / "c.json") + " --run-dir " + run);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto state = nlohmann::json::parse(slurp(ck + "/trainer_state.json"));
  ASSERT_EQ(state.value("tokenizer_sha256", ""), sha256_file(tmp / "tok/tokenizer.model"));
  const std::string gen = "generate --prompt 'the model' --max-new-tokens 2 --temperature 0 --checkpoint " + run;
  r = run_kvshift(gen);
  ASSERT_EQ(r.code, 0) << r.out;

  // Retrained in place on other text; the shards' manifest goes too, so only the checkpoint can tell.
  spit(tmp / "b.txt", corpus_text(600, 9));
  TokenizerTrainOptions t;
  t.inputs = {tmp / "b.txt"};
  t.vocab_size = 400;
  t.out = tmp / "tok";
  t.force = true;
  train_tokenizer(t);
  fs::remove(tmp / "shards/manifest.json");
  const std::string why = "not the tokenizer checkpoint";
  auto refused = [&](const std::string& args, const std::string& checkpoint) {
    const auto res = run_kvshift(args);
    EXPECT_NE(res.code, 0) << args << "\n" << res.out;
    EXPECT_NE(res.out.find((tmp / "tok") + ": " + why + " " + checkpoint + " was trained with"), std::string::npos)
        << args << "\n" << res.out;
  };
  refused(gen, ck);
  refused(gen + " --tokenizer " + (tmp / "tok"), ck);
  refused("export-hf --checkpoint " + ck + " --out " + (tmp / "hf"), ck);
  EXPECT_FALSE(fs::exists(tmp / "hf"));
  refused("eval --checkpoint " + ck, ck);
  refused("train --quiet --resume --config " + (tmp / "c.json") + " --run-dir " + run + " --set train.steps=3", ck);
  refused("train --quiet --config " + (tmp / "c.json") + " --run-dir " + (tmp / "ft") + " --init-from " + ck, ck);
  // The tokenizer it was trained with is still accepted, wherever it lies.
  r = run_kvshift(gen + " --tokenizer " + shared_tokenizer_dir());
  EXPECT_EQ(r.code, 0) << r.out;
}

}  // namespace
}  // namespace kvs
