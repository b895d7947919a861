// `data prepare`: framing, the val split rule, shard cutting, determinism across
// runs and thread counts, input errors, the crash guarantee, document splitting,
// UTF-8 validation, and the data.tokenizer config key.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "build_paths.h"
#include "core/sha256.h"
#include "data/dataset.h"
#include "data/prepare.h"
#include "data/shards.h"
#include "data/text_input.h"
#include "data/tokenizer_check.h"
#include "model/config.h"
#include "test_util.h"
#include "text_corpus_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_meta.h"
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

std::vector<uint32_t> read_tokens(const std::string& path) {
  ShardFile f(path);
  std::vector<uint32_t> v(f.size());
  for (uint64_t i = 0; i < f.size(); ++i) v[i] = f.token(i);
  return v;
}

// Every token of a split, shards in order.
std::vector<uint32_t> split_stream(const std::string& dir, const std::string& split) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(split + "_", 0) == 0) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<uint32_t> all;
  for (const auto& f : files) {
    const auto t = read_tokens(f);
    all.insert(all.end(), t.begin(), t.end());
  }
  return all;
}

std::vector<uint32_t> framed(const Tokenizer& tok, const std::vector<std::string>& docs) {
  std::vector<uint32_t> out;
  for (const auto& d : docs) {
    out.push_back(1);
    for (int32_t id : tok.encode(d)) out.push_back(static_cast<uint32_t>(id));
    out.push_back(2);
  }
  return out;
}

PrepareOptions options(const TmpDir& tmp, std::vector<std::string> inputs, const std::string& out) {
  PrepareOptions o;
  o.tokenizer = shared_tokenizer_dir();
  o.inputs = std::move(inputs);
  o.out = tmp / out;
  o.progress = false;
  return o;
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename());
  std::sort(v.begin(), v.end());
  return v;
}

TEST(DataPrepare, FramesEveryDocumentWithBosAndEos) {
  TmpDir tmp;
  spit(tmp / "a.txt", "the model learns.\n");
  spit(tmp / "b.txt", "café naïve 1234\n\nsecond paragraph\n");
  auto o = options(tmp, {tmp / "a.txt", tmp / "b.txt"}, "out");
  o.val_fraction = 0;
  const auto r = prepare_data(o);
  const auto tok = load_tokenizer(o.tokenizer);
  // One document per file (the file's last line break is not part of it).
  const auto expected = framed(*tok, {"the model learns.", "café naïve 1234\n\nsecond paragraph"});
  EXPECT_EQ(split_stream(o.out, "train"), expected);
  EXPECT_EQ(r.train_tokens, static_cast<int64_t>(expected.size()));
  EXPECT_EQ(r.train_docs, 2);
  EXPECT_EQ(r.val_docs, 0);
  EXPECT_EQ(names_in(o.out), (std::vector<std::string>{"manifest.json", "train_000000.bin"}));

  // blank-lines: the second file holds two documents.
  o.out = tmp / "para";
  o.split.mode = "blank-lines";
  prepare_data(o);
  EXPECT_EQ(split_stream(o.out, "train"),
            framed(*tok, {"the model learns.", "café naïve 1234", "second paragraph"}));
}

TEST(DataPrepare, ValIsEveryOneOverFthDocumentAndManifestCounts) {
  TmpDir tmp;
  std::string text;
  std::vector<std::string> docs;
  for (int i = 0; i < 20; ++i) {
    docs.push_back("document number " + std::to_string(i) + " of the corpus");
    text += docs.back() + "\n";
  }
  spit(tmp / "docs.txt", text);
  auto o = options(tmp, {tmp / "docs.txt"}, "out");
  o.split.mode = "lines";
  o.val_fraction = 0.1;  // g = 9 and g = 19
  const auto r = prepare_data(o);
  const auto tok = load_tokenizer(o.tokenizer);
  std::vector<std::string> train_docs, val_docs;
  for (int i = 0; i < 20; ++i) (i == 9 || i == 19 ? val_docs : train_docs).push_back(docs[i]);
  EXPECT_EQ(split_stream(o.out, "train"), framed(*tok, train_docs));
  EXPECT_EQ(split_stream(o.out, "val"), framed(*tok, val_docs));

  const auto m = nlohmann::json::parse(slurp(o.out + "/manifest.json"));
  EXPECT_EQ(m["splits"]["train"]["documents"], 18);
  EXPECT_EQ(m["splits"]["val"]["documents"], 2);
  EXPECT_EQ(m["splits"]["train"]["tokens"], r.train_tokens);
  EXPECT_EQ(m["splits"]["val"]["tokens"], r.val_tokens);
  EXPECT_EQ(m["tokenizer"]["sha256"], sha256_file(o.tokenizer + "/tokenizer.model"));
  EXPECT_EQ(m["token_bytes"], 2);
  EXPECT_EQ(m["framing"]["bos_id"], 1);
  EXPECT_EQ(m["framing"]["eos_id"], 2);
  ASSERT_EQ(m["sources"].size(), 1u);
  EXPECT_EQ(m["sources"][0]["path"], tmp / "docs.txt");
  EXPECT_EQ(m["sources"][0]["bytes"], text.size());
  EXPECT_EQ(m["sources"][0]["sha256"], sha256_hex(text));
  EXPECT_EQ(m["sources"][0]["documents"], 20);

  // The same documents over 4 files, read in batches of one file each (batch_bytes 1) and all in one batch (the
  // default 8 MiB): g counts across batches, so both give the streams above and byte-identical shards and manifests.
  std::vector<std::string> parts;
  for (int k = 0; k < 4; ++k) {
    std::string part;
    for (int i = 5 * k; i < 5 * k + 5; ++i) part += docs[i] + "\n";
    parts.push_back(tmp / ("part" + std::to_string(k) + ".txt"));
    spit(parts.back(), part);
  }
  o.inputs = parts;
  o.out = tmp / "one_batch";
  prepare_data(o);
  o.out = tmp / "batches";
  o.batch_bytes = 1;
  const auto rb = prepare_data(o);
  EXPECT_EQ(rb.val_docs, 2);
  EXPECT_EQ(split_stream(o.out, "train"), framed(*tok, train_docs));
  EXPECT_EQ(split_stream(o.out, "val"), framed(*tok, val_docs));
  const auto files = names_in(tmp / "one_batch");
  ASSERT_EQ(names_in(o.out), files);
  for (const auto& f : files) EXPECT_EQ(slurp(o.out + "/" + f), slurp(tmp / "one_batch/" + f)) << f;
}

TEST(DataPrepare, ShardsAreCutEveryShardTokens) {
  TmpDir tmp;
  spit(tmp / "a.txt", corpus_text(120, 11));
  auto o = options(tmp, {tmp / "a.txt"}, "out");
  o.split.mode = "lines";
  o.val_fraction = 0;
  prepare_data(o);
  const auto whole = split_stream(o.out, "train");
  o.out = tmp / "cut";
  o.shard_tokens = 100;
  const auto r = prepare_data(o);
  const auto m = nlohmann::json::parse(slurp(o.out + "/manifest.json"));
  const auto& shards = m["splits"]["train"]["shards"];
  ASSERT_EQ(shards.size(), (whole.size() + 99) / 100);
  ASSERT_GT(shards.size(), 3u);
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string path = o.out + "/" + shards[i]["file"].get<std::string>();
    EXPECT_EQ(shards[i]["file"], fmt::format("train_{:06d}.bin", i));
    EXPECT_EQ(shards[i]["tokens"], i + 1 < shards.size() ? 100u : whole.size() - 100 * i);
    EXPECT_EQ(shards[i]["sha256"], sha256_file(path));
    EXPECT_EQ(slurp(path).substr(12, 4), std::string("\x02\0\0\0", 4)) << "u16 shards";
  }
  EXPECT_EQ(split_stream(o.out, "train"), whole);
  EXPECT_EQ(r.shards.size(), shards.size());
  EXPECT_EQ(shard_token_bytes(65536), 2u);
  EXPECT_EQ(shard_token_bytes(65537), 4u);
}

TEST(DataPrepare, ByteIdenticalAcrossRunsAndThreadCounts) {
  TmpDir tmp;
  spit(tmp / "a.txt", corpus_text(300, 21));
  spit(tmp / "b.txt", corpus_text(200, 22));
  spit(tmp / "c.txt", corpus_text(5, 23));
  auto o = options(tmp, {tmp / "a.txt", tmp / "b.txt", tmp / "c.txt"}, "t1");
  o.split.mode = "blank-lines";
  o.val_fraction = 0.2;
  o.shard_tokens = 700;
  o.threads = 1;
  prepare_data(o);
  for (const auto& [name, threads] : std::vector<std::pair<std::string, int>>{{"t2", 2}, {"t2b", 2}, {"t3", 3}}) {
    o.out = tmp / name;
    o.threads = threads;
    prepare_data(o);
    const auto files = names_in(tmp / "t1");
    ASSERT_EQ(names_in(o.out), files);
    ASSERT_GT(files.size(), 4u);  // several train and val shards
    for (const auto& f : files) EXPECT_EQ(slurp(o.out + "/" + f), slurp(tmp / "t1/" + f)) << name << "/" << f;
  }
}

TEST(DataPrepare, LongDocumentsInPiecesAndWindowsGiveTheSameShards) {
  // Long documents are encoded in pieces (Tokenizer::safe_cuts) a window at a
  // time: the shards must be those of encoding every document whole at once.
  TmpDir tmp;
  std::string one_line = corpus_text(400, 32);
  std::replace(one_line.begin(), one_line.end(), '\n', ' ');
  spit(tmp / "long.txt", corpus_text(600, 31));  // one document of ~25 KB (--doc-split file)
  spit(tmp / "short.txt", "a short one\n");
  spit(tmp / "line.txt", one_line);  // one line: cut before words
  spit(tmp / "docs.jsonl", nlohmann::json{{"text", corpus_text(300, 33)}}.dump() + "\n" +
                               nlohmann::json{{"text", "tiny"}}.dump() + "\n" +
                               nlohmann::json{{"text", corpus_text(300, 34)}}.dump() + "\n");
  fs::create_directories(tmp / "bytes");
  spit(tmp / "bytes/kvshift_tokenizer.json", R"({"type": "bytes"})");
  for (const std::string& tokenizer : {shared_tokenizer_dir(), tmp / "bytes"}) {
    for (const bool jsonl : {false, true}) {
      const std::string tag = (tokenizer == shared_tokenizer_dir() ? "sp" : "bytes") + std::string(jsonl ? "_jsonl" : "");
      auto o = options(tmp, jsonl ? std::vector<std::string>{tmp / "docs.jsonl"}
                                  : std::vector<std::string>{tmp / "long.txt", tmp / "short.txt", tmp / "line.txt"},
                       tag + "_whole");
      o.tokenizer = tokenizer;
      if (jsonl) o.split.jsonl_key = "text";
      o.val_fraction = 0.34;
      o.shard_tokens = 5000;
      o.piece_bytes = int64_t(1) << 40;  // every document whole, in one window
      o.window_bytes = int64_t(1) << 40;
      prepare_data(o);
      const auto tok = load_tokenizer(tokenizer);
      EXPECT_GT(tok->safe_cuts(jsonl ? corpus_text(300, 33) : one_line, 300).size(), 20u) << tag;
      for (const auto& [piece, window, threads] : std::vector<std::tuple<int64_t, int64_t, int>>{
               {300, 1000, 2}, {300, 1, 1}, {4096, 100000, 2}}) {
        auto p = o;
        p.out = tmp / fmt::format("{}_{}_{}_{}", tag, piece, window, threads);
        p.piece_bytes = piece;
        p.window_bytes = window;
        p.threads = threads;
        prepare_data(p);
        const auto files = names_in(o.out);
        ASSERT_EQ(names_in(p.out), files) << p.out;
        ASSERT_GE(files.size(), 3u) << p.out;  // train and val shards and the manifest
        for (const auto& f : files) EXPECT_EQ(slurp(p.out + "/" + f), slurp(o.out + "/" + f)) << p.out << "/" << f;
      }
    }
  }
}

TEST(DataPrepare, BadInputIsOneLineNamingTheFileAndLeavesNothing) {
  TmpDir tmp;
  spit(tmp / "good.txt", "fine text\n");
  spit(tmp / "bad.txt", "caf\xc3\xa9 ok, then \xc3\x28 broken\n");
  spit(tmp / "empty.txt", "");
  spit(tmp / "blank.txt", " \n\n\t\n");
  fs::create_directories(tmp / "adir");
  auto o = options(tmp, {tmp / "good.txt", tmp / "bad.txt"}, "out");
  EXPECT_KVS_ERROR(prepare_data(o), tmp / "bad.txt", "not UTF-8", "0xc3", "byte offset 15");
  o.inputs = {tmp / "good.txt", tmp / "missing.txt"};
  EXPECT_KVS_ERROR(prepare_data(o), tmp / "missing.txt", "cannot read", "No such file");
  o.inputs = {tmp / "adir"};
  EXPECT_KVS_ERROR(prepare_data(o), tmp / "adir", "not a regular file");
  o.inputs = {tmp / "empty.txt", tmp / "blank.txt"};
  EXPECT_KVS_ERROR(prepare_data(o), "empty corpus", tmp / "empty.txt");
  o.inputs = {tmp / "good.txt"};
  o.val_fraction = 1.0;
  EXPECT_KVS_ERROR(prepare_data(o), "--val-fraction");
  o.val_fraction = 0;
  o.split.mode = "paragraphs";
  EXPECT_KVS_ERROR(prepare_data(o), "--doc-split", "paragraphs");
  o.split.mode = "file";
  o.tokenizer = tmp / "adir";
  EXPECT_KVS_ERROR(prepare_data(o), tmp / "adir/kvshift_tokenizer.json", "missing");
  // Nothing was created: no output, no temp directory.
  EXPECT_EQ(names_in(tmp.str()),
            (std::vector<std::string>{"adir", "bad.txt", "blank.txt", "empty.txt", "good.txt"}));
  // An existing output needs --force (an empty directory does not).
  o.tokenizer = shared_tokenizer_dir();
  fs::create_directories(tmp / "out");
  spit(tmp / "out/x", "");
  EXPECT_KVS_ERROR(prepare_data(o), tmp / "out", "already exists", "--force");
}

// --force replaces an output directory, never one that is or holds an input:
// prepare's text files or tokenizer, the tokenizer trainer's text (both
// deleted what they were about to read). Refused before any work, inputs intact.
TEST(DataPrepare, ForceNeverDeletesAnInput) {
  TmpDir tmp;
  fs::create_directories(tmp / "corpus");
  spit(tmp / "corpus/a.txt", corpus_text(50, 3));
  auto o = options(tmp, {tmp / "corpus/a.txt"}, "corpus");
  o.force = true;
  EXPECT_KVS_ERROR(prepare_data(o), tmp / "corpus", "--out must not be (or contain) the input", tmp / "corpus/a.txt");
  o.out = tmp.str();
  EXPECT_KVS_ERROR(prepare_data(o), "--out must not be (or contain) the input");
  o.out = tmp / "corpus/";
  EXPECT_KVS_ERROR(prepare_data(o), "--out must not be (or contain) the input");
  const std::string tok_copy = tmp / "tok";
  fs::copy(shared_tokenizer_dir(), tok_copy);
  o.tokenizer = tok_copy;
  o.out = tok_copy;
  EXPECT_KVS_ERROR(prepare_data(o), "--out must not be (or contain) the input", tok_copy);
  kvs::TokenizerTrainOptions t;
  t.inputs = {tmp / "corpus/a.txt"};
  t.out = tmp / "corpus";
  t.vocab_size = 300;
  t.force = true;
  EXPECT_KVS_ERROR(kvs::train_tokenizer(t), "--out must not be (or contain) the input", tmp / "corpus/a.txt");
  EXPECT_EQ(slurp(tmp / "corpus/a.txt"), corpus_text(50, 3));
  EXPECT_EQ(names_in(tok_copy), names_in(shared_tokenizer_dir()));
}

// --force replaces an earlier output of the same command (or an empty
// directory), never a file or a directory of other things; an --out that is a
// symbolic link writes where it points (the link kept), not over the link.
TEST(DataPrepare, ForceReplacesOnlyAnEarlierOutputAndFollowsALink) {
  TmpDir tmp;
  spit(tmp / "a.txt", corpus_text(50, 3));
  auto o = options(tmp, {tmp / "a.txt"}, "notes");
  o.force = true;
  fs::create_directories(tmp / "notes/sub");
  spit(tmp / "notes/sub/keep.txt", "mine");
  EXPECT_KVS_ERROR(prepare_data(o), tmp / "notes", "holds files but no manifest.json",
                   "--force does not replace it");
  EXPECT_EQ(slurp(tmp / "notes/sub/keep.txt"), "mine");
  spit(tmp / "file", "x");
  o.out = tmp / "file";
  EXPECT_KVS_ERROR(prepare_data(o), "exists and is not a directory");
  fs::create_directories(tmp / "empty");
  o.out = tmp / "empty";
  prepare_data(o);
  EXPECT_TRUE(fs::exists(tmp / "empty/manifest.json"));
  prepare_data(o);  // an earlier output: replaced
  fs::create_directories(tmp / "big/real");
  fs::create_symlink(tmp / "big/real", tmp / "link");
  o.out = tmp / "link";
  prepare_data(o);
  EXPECT_TRUE(fs::is_symlink(tmp / "link"));
  EXPECT_TRUE(fs::exists(tmp / "big/real/manifest.json"));
  prepare_data(o);  // again through the link: still a link, the output beside its target
  EXPECT_TRUE(fs::is_symlink(tmp / "link"));
  EXPECT_EQ(names_in(tmp / "big"), (std::vector<std::string>{"real"}));
  kvs::TokenizerTrainOptions t;
  t.inputs = {tmp / "a.txt"};
  t.out = tmp / "notes";
  t.vocab_size = 300;
  t.force = true;
  EXPECT_KVS_ERROR(kvs::train_tokenizer(t), "holds files but no kvshift_tokenizer.json");
  EXPECT_EQ(slurp(tmp / "notes/sub/keep.txt"), "mine");
  // A checkpoint's manifest.json lists its files: the checkpoint is no earlier output.
  fs::create_directories(tmp / "step_00000010");
  for (const char* f : {"manifest.json", "trainer_state.json", "model.safetensors"})
    spit(tmp / "step_00000010" + "/" + f, "{}");
  o.out = tmp / "step_00000010";
  EXPECT_KVS_ERROR(prepare_data(o), "holds trainer_state.json: a training run or a checkpoint");
  EXPECT_EQ(slurp(tmp / "step_00000010/model.safetensors"), "{}");
}

// A run killed after writing a shard (no clean-up at all) leaves the output
// absent (or the previous complete one), never shards without a manifest.
TEST(DataPrepare, CrashLeavesNoCompleteLookingOutput) {
  TmpDir tmp;
  spit(tmp / "a.txt", corpus_text(300, 31));
  const std::string tok = shared_tokenizer_dir();
  const std::string args = "data prepare --quiet --tokenizer " + tok + " --input " + (tmp / "a.txt") +
                           " --doc-split lines --shard-tokens 200 --out " + (tmp / "out");
  auto r = run_kvshift(args + " --crash-after-shards 2");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_FALSE(fs::exists(tmp / "out"));
  std::vector<std::string> names = names_in(tmp.str());
  ASSERT_EQ(names.size(), 2u) << ::testing::PrintToString(names);
  const std::string partial = tmp / names[1];
  EXPECT_EQ(names[1].rfind("out.tmp.", 0), 0u) << names[1];
  EXPECT_EQ(names_in(partial), (std::vector<std::string>{"train_000000.bin", "train_000001.bin"}));

  // The next run succeeds and removes the dead run's temp directory.
  r = run_kvshift(args);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(names_in(tmp.str()), (std::vector<std::string>{"a.txt", "out"}));
  const std::string manifest = slurp(tmp / "out/manifest.json");
  ASSERT_FALSE(manifest.empty());

  // A crashing --force run keeps the previous complete output untouched.
  spit(tmp / "a.txt", corpus_text(300, 32));
  r = run_kvshift(args + " --force --crash-after-shards 1");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_EQ(slurp(tmp / "out/manifest.json"), manifest);
  // A run without --force refuses the complete output, and still removes the dead run's temp directory.
  EXPECT_EQ(names_in(tmp.str()).size(), 3u);
  r = run_kvshift(args);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("out: already exists; pass --force to replace it"), std::string::npos) << r.out;
  EXPECT_EQ(names_in(tmp.str()), (std::vector<std::string>{"a.txt", "out"}));
  r = run_kvshift(args + " --force");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(slurp(tmp / "out/manifest.json"), manifest);
  EXPECT_EQ(names_in(tmp.str()), (std::vector<std::string>{"a.txt", "out"}));

  // A file-size limit (ulimit -f) is a write error naming the file, not a kill by SIGXFSZ.
  r = run_kvshift("data prepare --quiet --tokenizer " + tok + " --input " + (tmp / "a.txt") +
                  " --doc-split lines --out " + (tmp / "limited"), "bash -c 'ulimit -f 1; exec \"$0\" \"$@\"' ");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("File too large"), std::string::npos) << r.out;
  EXPECT_EQ(names_in(tmp.str()), (std::vector<std::string>{"a.txt", "out"}));
}

TEST(DataPrepare, RepeatedInputsAreWarnedAbout) {
  TmpDir tmp;
  spit(tmp / "a.txt", corpus_text(50, 3));
  spit(tmp / "b.txt", corpus_text(50, 4));
  fs::create_symlink(tmp / "a.txt", tmp / "link.txt");
  const std::string a = tmp / "a.txt";
  const std::string inputs = " --input " + a + " " + (tmp / "b.txt") + " " + (tmp / "link.txt") + " " +
                             (tmp.str() + "/./a.txt");
  auto r = run_kvshift("data prepare --quiet --tokenizer " + shared_tokenizer_dir() + inputs + " --out " + (tmp / "out"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("data prepare: " + a + " is given 3 times: its text counts 3 times"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("b.txt is given"), std::string::npos) << r.out;
  r = run_kvshift("tokenizer train --vocab-size 320" + inputs + " --out " + (tmp / "tok"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("tokenizer train: " + a + " is given 3 times"), std::string::npos) << r.out;
  // Each file once: no warning.
  r = run_kvshift("data prepare --quiet --tokenizer " + shared_tokenizer_dir() + " --input " + a + " " +
                  (tmp / "b.txt") + " --out " + (tmp / "out2"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("given"), std::string::npos) << r.out;
}

TEST(DataPrepare, CliErrorsAndHelp) {
  TmpDir tmp;
  spit(tmp / "bad.txt", std::string("ok\n\xff\n"));
  auto r = run_kvshift("data prepare --tokenizer " + shared_tokenizer_dir() + " --input " + (tmp / "bad.txt") +
                       " --out " + (tmp / "out"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "kvshift: error: " + (tmp / "bad.txt") + ": not UTF-8 text: invalid byte 0xff at byte offset 3\n");
  r = run_kvshift("tokenizer train --input " + (tmp / "bad.txt") + " --out " + (tmp / "tok"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "kvshift: error: " + (tmp / "bad.txt") + ": not UTF-8 text: invalid byte 0xff at byte offset 3\n");
  // The progress line (stderr is not a terminal here: plain lines, the final one always).
  spit(tmp / "good.txt", corpus_text(50, 3));
  r = run_kvshift("data prepare --tokenizer " + shared_tokenizer_dir() + " --input " + (tmp / "good.txt") + " --out " +
                  (tmp / "out"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("prepare: 0.0/0.0 MB (100%) | 1 docs |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" MB/s | took "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(tmp / "out" + ": "), std::string::npos) << r.out;
  r = run_kvshift("data prepare --help");
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"--tokenizer", "--input", "--input-list", "--out", "--val-fraction", "--threads",
                           "--doc-split", "--doc-delimiter", "--jsonl", "--text-key", "--shard-tokens", "--force",
                           "--quiet"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  EXPECT_EQ(r.out.find("crash"), std::string::npos) << "the test hook stays hidden";
  r = run_kvshift("tokenizer train --help");
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"--input", "--vocab-size", "--out", "--max-sentences", "--character-coverage", "--jsonl",
                           "--text-key", "--force"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  // --text-key means nothing without --jsonl; a JSON Lines error names the file and line.
  for (const std::string& cmd : {"data prepare --tokenizer " + shared_tokenizer_dir() + " --out " + (tmp / "o2"),
                                "tokenizer train --out " + (tmp / "t2")}) {
    r = run_kvshift(cmd + " --input " + (tmp / "good.txt") + " --text-key body");
    EXPECT_EQ(r.out, "kvshift: error: --text-key: names a field of JSON Lines input: needs --jsonl\n") << cmd;
    r = run_kvshift(cmd + " --input " + (tmp / "good.txt") + " --jsonl");
    EXPECT_EQ(r.code, 1) << cmd;
    EXPECT_EQ(r.out.rfind("kvshift: error: " + (tmp / "good.txt") + ":1: not JSON (", 0), 0u) << cmd << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(tmp / "o2"));
  EXPECT_FALSE(fs::exists(tmp / "t2"));
}

// The val rule's floor(x f), exact on the double f: the same as exact
// rational arithmetic on it (Python's Fraction(f)), where float64 products
// round (f = 0.3: 10 x f is 3.0 in float64, 2.99999... exactly).
TEST(DataPrepareSplit, ValRuleIsExactOnTheDouble) {
  EXPECT_EQ(floor_times(10, 0.3), 2);  // 10 x 0.29999999999999998889... = 2.99999...
  EXPECT_EQ(floor_times(20, 0.05), 1);
  EXPECT_EQ(floor_times(0, 0.7), 0);
  EXPECT_EQ(floor_times(123456789, 0.0), 0);
  EXPECT_EQ(floor_times(int64_t{1} << 62, 0.5), int64_t{1} << 61);
  // Against 64-bit integer arithmetic on f's exact value m / 2^k, for many x and f.
  for (double f : {0.3, 0.7, 0.05, 0.02, 0.1, 1.0 / 3, 0.999999}) {
    int exp = 0;
    const double frac = std::frexp(f, &exp);
    const auto m = static_cast<unsigned __int128>(std::ldexp(frac, 53));
    for (int64_t x : {1, 3, 9, 10, 19, 20, 99, 100, 1000003, 3000000}) {
      const auto want = static_cast<int64_t>((m * static_cast<unsigned __int128>(x)) >> (53 - exp));
      EXPECT_EQ(floor_times(x, f), want) << x << " x " << f;
    }
  }
}

TEST(DataPrepareSplit, DocumentModes) {
  using V = std::vector<std::string_view>;
  const std::string text = "a b\nc\n\n\n  \nd\r\n\r\ne\n<|endoftext|>\nf\n";
  DocSplit s;
  EXPECT_EQ(split_documents(text, s), V{"a b\nc\n\n\n  \nd\r\n\r\ne\n<|endoftext|>\nf"});
  s.mode = "blank-lines";
  EXPECT_EQ(split_documents(text, s), (V{"a b\nc", "d\r", "e\n<|endoftext|>\nf"}));
  s.mode = "lines";
  EXPECT_EQ(split_documents(text, s), (V{"a b", "c", "d\r", "e", "<|endoftext|>", "f"}));
  s.delimiter = "<|endoftext|>";
  EXPECT_EQ(split_documents(text, s), (V{"a b\nc\n\n\n  \nd\r\n\r\ne", "f"}));
  EXPECT_EQ(split_documents(" \n\t\n", DocSplit{}), V{});
  EXPECT_EQ(split_documents("x", DocSplit{"lines", "", ""}), V{"x"});
  EXPECT_KVS_ERROR(validate_doc_split(DocSplit{"words", "", ""}), "--doc-split", "words");
}

// A leading UTF-8 byte-order mark is not text (an editor's, a Windows export's):
// the documents are those of the file without it, as JSON Lines' parser reads
// them. A delimiter glued to the text (GPT-2 style dumps) splits nothing: said.
TEST(DataPrepareSplit, ByteOrderMarkAndADelimiterInsideLines) {
  using V = std::vector<std::string_view>;
  const std::string bom = "\xEF\xBB\xBF";
  for (const char* mode : {"file", "lines", "blank-lines"}) {
    const DocSplit s{mode, "", ""};
    EXPECT_EQ(split_documents(bom + "one\n\ntwo\n", s), split_documents("one\n\ntwo\n", s)) << mode;
  }
  EXPECT_EQ(split_documents(bom, DocSplit{}), V{});
  EXPECT_EQ(split_documents("a\xEF\xBB\xBF", DocSplit{}), V{"a\xEF\xBB\xBF"});  // only a leading one
  EXPECT_TRUE(delimiter_only_inside_lines("doc one.<|endoftext|>doc two.<|endoftext|>\n", "<|endoftext|>"));
  EXPECT_FALSE(delimiter_only_inside_lines("doc one.\n<|endoftext|>\r\ndoc <|endoftext|> two\n", "<|endoftext|>"));
  EXPECT_FALSE(delimiter_only_inside_lines("no delimiter here\n", "<|endoftext|>"));
  EXPECT_FALSE(delimiter_only_inside_lines("x<|endoftext|>y", ""));
  // data prepare: a BOM file gives the shards of the file without it.
  TmpDir tmp;
  spit(tmp / "plain.txt", corpus_text(20, 5));
  spit(tmp / "bom.txt", bom + corpus_text(20, 5));
  auto o = options(tmp, {tmp / "plain.txt"}, "plain");
  prepare_data(o);
  o = options(tmp, {tmp / "bom.txt"}, "bom");
  prepare_data(o);
  EXPECT_EQ(slurp(tmp / "bom/train_000000.bin"), slurp(tmp / "plain/train_000000.bin"));
}

// JSON Lines: one object per line, the document its "text" (or --text-key) field with the escapes
// decoded; blank lines skipped, empty documents dropped, CRLF endings fine; each error names the
// file, the line and what is wrong.
TEST(DataPrepareSplit, JsonlDocuments) {
  using V = std::vector<std::string>;
  const std::string text =
      "{\"text\": \"a b\\nc\", \"id\": 1}\n\n  \n{\"meta\": {\"x\": [1]}, \"text\": \"caf\\u00e9 \\ud83d\\ude00\\t\"}\r\n"
      "{\"text\": \"  \"}\n{\"text\": \"\\\"quoted\\\"\", \"body\": \"other\"}";
  EXPECT_EQ(jsonl_documents(text, "text", "f.jsonl"), (V{"a b\nc", "caf\u00e9 \U0001F600\t", "\"quoted\""}));
  EXPECT_EQ(jsonl_documents("{\"body\": \"x\"}\n", "body", "f.jsonl"), V{"x"});
  EXPECT_EQ(jsonl_documents("\n \n", "text", "f.jsonl"), V{});
  EXPECT_KVS_ERROR(jsonl_documents("{\"text\": \"a\"}\n{\"text\": \"b\"\n", "text", "f.jsonl"), "f.jsonl:2:", "not JSON");
  EXPECT_KVS_ERROR(jsonl_documents("[\"a\"]\n", "text", "f.jsonl"), "f.jsonl:1:", "array", "not an object");
  EXPECT_KVS_ERROR(jsonl_documents("{\"txt\": \"a\"}\n", "text", "f.jsonl"), "f.jsonl:1:", "no field \"text\"",
                   "--text-key");
  EXPECT_KVS_ERROR(jsonl_documents("{\"text\": 5}\n", "text", "f.jsonl"), "f.jsonl:1:", "\"text\"", "number",
                   "not a string");
  EXPECT_KVS_ERROR(validate_doc_split(DocSplit{"file", "<|endoftext|>", "text"}), "--jsonl", "--doc-delimiter");
  EXPECT_KVS_ERROR(validate_doc_split(DocSplit{"lines", "", "text"}), "--jsonl", "--doc-split");
}

// The same documents as JSON Lines or as delimited text give the same shards (the manifest says
// which), and a tokenizer trained on the JSON Lines is the one trained on the documents' lines.
TEST(DataPrepare, JsonlGivesWhatTheSameDocumentsAsTextGive) {
  TmpDir tmp;
  const std::vector<std::string> docs = {"the model learns.\nsecond line", "café naïve 1234",
                                         "a \"quoted\" word\n\nand a paragraph", "last\tone"};
  std::string jsonl, delimited, lines;
  for (const std::string& d : docs) {
    jsonl += nlohmann::json({{"id", jsonl.size()}, {"text", d}}).dump() + "\n";
    delimited += d + "\n<|endoftext|>\n";
    lines += d + "\n";
  }
  spit(tmp / "c.jsonl", jsonl);
  spit(tmp / "c.txt", delimited);
  auto o = options(tmp, {tmp / "c.jsonl"}, "from_jsonl");
  o.val_fraction = 0.25;
  o.split.jsonl_key = "text";
  const auto a = prepare_data(o);
  auto t = options(tmp, {tmp / "c.txt"}, "from_text");
  t.val_fraction = 0.25;
  t.split.delimiter = "<|endoftext|>";
  const auto b = prepare_data(t);
  EXPECT_EQ(a.train_docs, 3);
  EXPECT_EQ(a.val_docs, 1);
  for (const char* split : {"train", "val"}) EXPECT_EQ(split_stream(o.out, split), split_stream(t.out, split)) << split;
  const auto manifest = nlohmann::json::parse(slurp(o.out + "/manifest.json"));
  EXPECT_EQ(manifest["doc_split"], (nlohmann::json{{"mode", "jsonl"}, {"text_key", "text"}}));
  EXPECT_EQ(manifest["sources"][0]["documents"], 4);

  spit(tmp / "lines.txt", lines);
  TokenizerTrainOptions from_jsonl, from_lines;
  from_jsonl.inputs = {tmp / "c.jsonl"};
  from_jsonl.jsonl_key = "text";
  from_lines.inputs = {tmp / "lines.txt"};
  for (TokenizerTrainOptions* k : {&from_jsonl, &from_lines}) k->vocab_size = 300;
  from_jsonl.out = tmp / "tok_jsonl";
  from_lines.out = tmp / "tok_lines";
  const auto rj = train_tokenizer(from_jsonl), rl = train_tokenizer(from_lines);
  EXPECT_EQ(rj.sentences_total, rl.sentences_total);
  EXPECT_EQ(rj.sha256, rl.sha256);
}

TEST(DataPrepareSplit, InputList) {
  TmpDir tmp;
  spit(tmp / "list.txt", "# the corpus\na.txt\n\n \t \n/abs/b.txt\r\n  c d.txt\n");
  EXPECT_EQ(read_input_list(tmp / "list.txt"), (std::vector<std::string>{"a.txt", "/abs/b.txt", "  c d.txt"}));
  spit(tmp / "empty.txt", "# nothing\n\n   \n");
  EXPECT_KVS_ERROR(read_input_list(tmp / "empty.txt"), tmp / "empty.txt", "names no files");
  EXPECT_KVS_ERROR(read_input_list(tmp / "missing.txt"), tmp / "missing.txt", "cannot read");
}

TEST(DataPrepare, ByteTokenizerHasNoFraming) {
  TmpDir tmp;
  fs::create_directories(tmp / "bytes");
  spit(tmp / "bytes/kvshift_tokenizer.json", R"({"type": "bytes"})");
  spit(tmp / "a.txt", "héllo\n");
  spit(tmp / "b.txt", "x");
  auto o = options(tmp, {tmp / "a.txt", tmp / "b.txt"}, "out");
  o.tokenizer = tmp / "bytes";
  o.val_fraction = 0;
  prepare_data(o);
  // Bytes as they are, documents back to back (each without its final line break).
  EXPECT_EQ(split_stream(o.out, "train"), (std::vector<uint32_t>{'h', 0xc3, 0xa9, 'l', 'l', 'o', 'x'}));
  const auto m = nlohmann::json::parse(slurp(o.out + "/manifest.json"));
  EXPECT_EQ(m["framing"]["bos_id"], -1);
  EXPECT_EQ(m["tokenizer"]["type"], "bytes");
}

TEST(DataPrepareSplit, Utf8Validation) {
  const auto npos = std::string_view::npos;
  EXPECT_EQ(first_invalid_utf8("plain ascii"), npos);
  EXPECT_EQ(first_invalid_utf8("é 日本 🦀 \xf4\x8f\xbf\xbf"), npos);  // up to U+10FFFF
  EXPECT_EQ(first_invalid_utf8("ab\xc0\x80"), 2u);                  // overlong NUL
  EXPECT_EQ(first_invalid_utf8("ab\xe0\x80\x80"), 2u);              // overlong 3-byte
  EXPECT_EQ(first_invalid_utf8("a\xed\xa0\x80"), 1u);               // surrogate U+D800
  EXPECT_EQ(first_invalid_utf8("\xf4\x90\x80\x80"), 0u);            // above U+10FFFF
  EXPECT_EQ(first_invalid_utf8("ok\x80"), 2u);                      // lone continuation
  EXPECT_EQ(first_invalid_utf8("ok\xe6\x97"), 2u);                  // truncated at the end
  EXPECT_EQ(first_invalid_utf8("\xe6\x97x"), 0u);                   // bad continuation
  EXPECT_EQ(first_invalid_utf8("a \xf0\x9f\xa6\x80"), npos);        // U+1F980 (crab), every byte checked
  EXPECT_EQ(first_invalid_utf8("\xf0\x9f\xa6x"), 0u);               // bad 4th byte
  EXPECT_EQ(first_invalid_utf8("\xf0\x80\x80\x80"), 0u);            // overlong 4-byte NUL
  EXPECT_EQ(first_invalid_utf8("\xf0\x8f\xbf\xbf"), 0u);            // overlong U+FFFF
  EXPECT_EQ(first_invalid_utf8("ok\xf0\x9f\xa6"), 2u);              // 4-byte sequence truncated at the end
}

// data.tokenizer: relative to the config file, checked when the data is opened
// (so configs load before the data is prepared), stored absolute in runs.
TEST(DataPrepareConfig, TokenizerKey) {
  TmpDir tmp;
  auto j =
      nlohmann::json::parse(slurp(std::string(kvs::test::source_dir()) + "/configs/toy/induction-1l-kvshift.json"));
  fs::create_directories(tmp / "cfg");
  fs::copy(shared_tokenizer_dir(), tmp / "tok");
  auto load = [&](const nlohmann::json& tokenizer, int vocab) {
    j["data"]["tokenizer"] = tokenizer;
    j["model"]["vocab_size"] = vocab;
    spit(tmp / "cfg/c.json", j.dump(2));
    return load_config(tmp / "cfg/c.json");
  };
  auto open = [&](const Config& c) { return make_dataset(c.data, 64, c.model.vocab_size, 1, tmp / "cfg"); };
  EXPECT_EQ(load("../tok", 512).data.tokenizer, "../tok");
  EXPECT_NO_THROW(open(load("../tok", 512)));  // 500 pieces <= 512
  EXPECT_NO_THROW(open(load(tmp / "tok", 512)));  // absolute
  const Config small = load("../tok", 499);  // loads: the directory is checked when the data is opened
  EXPECT_KVS_ERROR(open(small), "data.tokenizer:", "vocab_size 500", "model.vocab_size 499");
  EXPECT_KVS_ERROR(open(load("tok", 512)), "data.tokenizer:", tmp / "cfg/tok", "not a directory");
  fs::create_directories(tmp / "cfg/empty");
  EXPECT_KVS_ERROR(open(load("empty", 512)), "data.tokenizer:", "kvshift_tokenizer.json", "missing");
  EXPECT_KVS_ERROR(load(5, 512), tmp / "cfg/c.json", "data.tokenizer");
  // Written out only when set: configs without one round-trip unchanged.
  EXPECT_FALSE(to_json(load("", 512))["data"].contains("tokenizer"));
  EXPECT_EQ(to_json(load("../tok", 512))["data"]["tokenizer"], "../tok");

  // A run stores it absolute (run config and checkpoints work from anywhere),
  // and refuses to start with a bad one.
  load("../tok", 512);
  const std::string cfg = tmp / "cfg/c.json";
  const std::string run = " --set train.steps=1 --set train.eval_every=0 --set train.checkpoint_every=0 --run-dir ";
  auto r = run_kvshift("train --quiet --config " + cfg + run + (tmp / "run"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto saved = nlohmann::json::parse(slurp(tmp / "run/config.json"));
  EXPECT_EQ(saved["data"]["tokenizer"], (fs::path(tmp.str()) / "tok").string());
  r = run_kvshift("train --quiet --config " + cfg + " --set model.vocab_size=300" + run + (tmp / "run2"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("kvshift: error: data.tokenizer: the tokenizer's vocab_size 500 exceeds model.vocab_size 300"),
            std::string::npos)
      << r.out;
}

// Glob order is stream order only while the names have six digits.
TEST(DataPrepare, AMillionthShardIsAnErrorNotAnOutOfOrderName) {
  EXPECT_EQ(shard_file_name("train", 0, 100), "train_000000.bin");
  EXPECT_EQ(shard_file_name("val", 999999, 100), "val_999999.bin");
  EXPECT_KVS_ERROR(shard_file_name("train", 1000000, 100), "the train split needs more than 1000000 shards of 100",
                   "raise --shard-tokens");
}

// Shards whose manifest records another tokenizer than data.tokenizer (one
// retrained in place with --force, or another directory) are refused when the
// data is opened, naming the manifest; hand-made shards without one are not checked.
TEST(DataPrepareConfig, ShardsMadeWithAnotherTokenizerAreRefused) {
  TmpDir tmp;
  fs::copy(shared_tokenizer_dir(), tmp / "tok");
  spit(tmp / "a.txt", corpus_text(120, 11));
  PrepareOptions o = options(tmp, {tmp / "a.txt"}, "shards");
  o.tokenizer = tmp / "tok";
  o.split.mode = "lines";  // documents for the val split too
  o.force = true;
  prepare_data(o);
  auto j =
      nlohmann::json::parse(slurp(std::string(kvs::test::source_dir()) + "/configs/toy/induction-1l-kvshift.json"));
  j["data"] = {{"type", "shards"},
               {"tokenizer", "../tok"},
               {"shards", {{"train", {"../shards/train_*.bin"}}, {"val", {"../shards/val_*.bin"}}}}};
  j["model"]["vocab_size"] = 512;
  fs::create_directories(tmp / "cfg");
  spit(tmp / "cfg/c.json", j.dump(2));
  const Config c = load_config(tmp / "cfg/c.json");
  auto open = [&] { return make_dataset(c.data, 16, c.model.vocab_size, 1, tmp / "cfg"); };
  EXPECT_NO_THROW(open());
  auto m = nlohmann::json::parse(slurp(tmp / "shards/manifest.json"));
  m["tokenizer"]["sha256"] = std::string(64, 'a');
  spit(tmp / "shards/manifest.json", m.dump(2));
  EXPECT_KVS_ERROR(open(), tmp / "shards/manifest.json", "made with another tokenizer (sentencepiece (sha256 aaaaaaaaaaaa...)",
                   "than data.tokenizer " + (tmp / "tok"), "kvshift data prepare");
  fs::remove(tmp / "shards/manifest.json");
  EXPECT_NO_THROW(open());

  // A shard the manifest does not list: one warning per start, though the tokenizer check globs the shards too.
  fs::remove_all(tmp / "shards");  // without its manifest, --force no longer takes it for an earlier output
  prepare_data(o);                  // a fresh manifest
  fs::copy_file(tmp / "shards/train_000000.bin", tmp / "shards/train_000099.bin");
  const auto r = run_kvshift("train --quiet --config " + (tmp / "cfg/c.json") +
                             " --set train.steps=1 --set train.eval_every=0 --set train.checkpoint_every=0 "
                             "--set train.seq_len=16 --run-dir " + (tmp / "run"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string warning = "are not in its manifest.json";
  const size_t first = r.out.find(warning);
  EXPECT_NE(first, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(warning, first + 1), std::string::npos) << r.out;
}

}  // namespace
// model.document_boundaries splits documents at model.bos_token_id: it must
// be the BOS the data was framed with (data.tokenizer's), and byte-level data
// has none.
TEST(DataTokenizerCheck, DocumentBoundariesNeedTheTokenizersBos) {
  const std::string tok = shared_tokenizer_dir();
  const int bos = read_tokenizer_meta(tok).bos_id;
  ASSERT_GE(bos, 0);
  EXPECT_EQ(check_data_tokenizer(tok, 65536, "", bos), tok);
  EXPECT_EQ(check_data_tokenizer(tok, 65536, "", -1), tok);  // no document boundaries
  EXPECT_KVS_ERROR(check_data_tokenizer(tok, 65536, "", bos + 4),
                   "model.bos_token_id (" + std::to_string(bos + 4) + ") is not the BOS of data.tokenizer " + tok +
                       " (" + std::to_string(bos) + ")");
  const fs::path bytes = fs::path(testing::TempDir()) / "kvs_bos_bytes";
  fs::create_directories(bytes);
  std::ofstream(bytes / "kvshift_tokenizer.json") << R"({"type": "bytes"})";
  EXPECT_KVS_ERROR(check_data_tokenizer(bytes.string(), 65536, "", 1), "has no BOS token");
  EXPECT_EQ(check_data_tokenizer(bytes.string(), 65536, "", -1), bytes.string());
}

}  // namespace kvs
