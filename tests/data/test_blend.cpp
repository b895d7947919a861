// Blending shard sources (data.shards.weights): the schedule's counts and
// order, each source read in its own order with nothing skipped or repeated,
// the blended dataset's windows, validation size and names, and the config's
// rules.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "data_test_util.h"
#include "data/blend_schedule.h"
#include "data/blended_dataset.h"
#include "data/shard_dataset.h"
#include "data/shards.h"
#include "model/config.h"
#include "test_util.h"

using namespace kvs;

namespace {

using kvs::testing_util::get_seq;
using kvs::testing_util::Seq;

std::string temp_dir(const std::string& name) { return kvs::testing_util::fresh_temp_dir("kvs_blend_", name); }

// A shard of `n` tokens, each `base` + its position mod 97: every source's
// windows are told apart by their first token's range.
void write_source(const std::string& path, uint32_t base, uint32_t n) {
  std::vector<uint32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = base + i % 97;
  write_shard(path, t, 2);
}

}  // namespace

// The counts hold the weights' shares to within one index per period and add
// up to the period; every source's indices come in order 0, 1, 2, ... over
// several periods; position() inverts pick(); and every prefix of the blend
// holds each source's share to within one index (evenly interleaved, not in runs).
TEST(BlendSchedule, CountsOrderAndEvenInterleaving) {
  for (const std::vector<double>& w : std::vector<std::vector<double>>{
           {1}, {0.75, 0.25}, {1, 1, 1}, {5, 3, 2}, {0.999, 0.001}, {2, 7, 1, 1, 3}}) {
    const BlendSchedule b(w, "w");
    double total = 0;
    for (double x : w) total += x;
    uint64_t sum = 0;
    for (size_t s = 0; s < w.size(); ++s) {
      EXPECT_LE(std::abs(b.count(s) - w[s] / total * kBlendPeriod), 1.0) << s;
      sum += b.count(s);
    }
    ASSERT_EQ(sum, kBlendPeriod);
    std::vector<uint64_t> next(w.size(), 0);
    double worst = 0;
    for (uint64_t i = 0; i < 3ull * kBlendPeriod; ++i) {
      const BlendSchedule::Pick p = b.pick(i);
      ASSERT_LT(p.source, w.size());
      ASSERT_EQ(p.index, next[p.source]) << "source " << p.source << " at " << i;
      ASSERT_EQ(b.position(p.source, p.index), i);
      ++next[p.source];
      for (size_t s = 0; s < w.size(); ++s)
        worst = std::max(worst, std::abs(static_cast<double>(next[s]) - (i + 1) * b.share(s)));
    }
    EXPECT_LE(worst, 1.0) << "weights " << w.size() << " first " << w[0];
  }
}

TEST(BlendSchedule, RefusesWeightsItCannotHonour) {
  EXPECT_KVS_ERROR(BlendSchedule({1, 0}, "c.json: data.shards.weights"), "c.json: data.shards.weights[1]: must be > 0, got 0");
  EXPECT_KVS_ERROR(BlendSchedule({-1, 2}, "k"), "k[0]: must be > 0, got -1");
  EXPECT_KVS_ERROR(BlendSchedule({1, 1e-6}, "k"), "k[1]: weight 1e-06 is 1e-06 of the total, under one sequence in 65536");
  EXPECT_KVS_ERROR(BlendSchedule({}, "k"), "k: no weights");
}

TEST(BlendedDataset, NamesAreThePatternsWithoutTheirSharedDirectories) {
  EXPECT_EQ(source_names({"/d/data/web/*.bin", "/d/data/code/*.bin"}),
            (std::vector<std::string>{"web/*.bin", "code/*.bin"}));
  EXPECT_EQ(source_names({"/d/web_*.bin", "/d/wiki_*.bin"}), (std::vector<std::string>{"web_*.bin", "wiki_*.bin"}));
  EXPECT_EQ(source_names({"a.bin", "a.bin", "b.bin"}), (std::vector<std::string>{"a.bin#0", "a.bin#1", "b.bin"}));
  EXPECT_EQ(source_names({"/d/one/*.bin"}), (std::vector<std::string>{"/d/one/*.bin"}));
}

// Index i of the blend is window pick(i).index of source pick(i).source, read
// as that source alone would read it: train shuffled per source, validation in
// order; size(Val) stops before any source's validation windows repeat.
TEST(BlendedDataset, EachIndexReadsItsSourcesWindow) {
  const std::string dir = temp_dir("read");
  write_source(dir + "/web.bin", 100, 4000);
  write_source(dir + "/code.bin", 300, 1500);
  ShardDataConfig cfg;
  cfg.train = {dir + "/web.bin", dir + "/code.bin"};
  cfg.weights = {3, 1};
  cfg.val_fraction = 0.1;
  const int T = 16;
  const BlendedDataset blend(cfg, T, 512, 7, "");
  const ShardDataset web(cfg, 0, T, 512, 7, ""), code(cfg, 1, T, 512, 7, "");
  EXPECT_EQ(blend.source_names(), (std::vector<std::string>{"web.bin", "code.bin"}));
  EXPECT_EQ(blend.size(Split::Train), web.size(Split::Train) + code.size(Split::Train));
  std::map<size_t, int> from;
  for (uint64_t i = 0; i < 400; ++i) {
    const BlendSchedule::Pick p = blend.schedule().pick(i);
    const ShardDataset& src = p.source == 0 ? web : code;
    const Seq got = get_seq(blend, Split::Train, i, T);
    ASSERT_EQ(got, get_seq(src, Split::Train, p.index, T)) << i;
    ASSERT_EQ(got.in[0] >= 300, p.source == 1) << i;  // really that source's tokens
    EXPECT_EQ(blend.source_of(Split::Train, i), p.source);
    ++from[p.source];
  }
  EXPECT_EQ(from[0], 300);
  EXPECT_EQ(from[1], 100);
  // Validation: 400 web tokens (24 windows) and 150 code tokens (9 windows); each source's
  // next window would be read at the blend's index position(source, windows).
  ASSERT_EQ(code.size(Split::Val), 9u);
  const uint64_t n_val = blend.size(Split::Val);
  EXPECT_EQ(n_val, std::min(blend.schedule().position(1, 9), blend.schedule().position(0, 24)));
  std::set<std::pair<size_t, uint64_t>> seen;
  for (uint64_t i = 0; i < n_val; ++i) {
    const BlendSchedule::Pick p = blend.schedule().pick(i);
    ASSERT_TRUE(seen.insert({p.source, p.index}).second) << i;
    ASSERT_EQ(get_seq(blend, Split::Val, i, T), get_seq(p.source == 0 ? web : code, Split::Val, p.index, T)) << i;
  }
  const BlendSchedule::Pick repeat = blend.schedule().pick(n_val);  // web's 25th of 24 windows comes first
  EXPECT_EQ(repeat.source, 0u);
  EXPECT_EQ(repeat.index, web.size(Split::Val));
  // Reads per source for the epochs line.
  const std::vector<Dataset::Use> use = blend.train_use(800);
  ASSERT_EQ(use.size(), 2u);
  EXPECT_EQ(use[0].source, "web.bin");
  EXPECT_DOUBLE_EQ(use[0].reads, 600);
  EXPECT_EQ(use[1].sequences, code.size(Split::Train));
  // A source without validation data leaves the blend none.
  cfg.val_fraction = 0;
  EXPECT_EQ(BlendedDataset(cfg, T, 512, 7, "").size(Split::Val), 0u);
}

// One source weighted 1 reads exactly what the unweighted stream reads.
TEST(BlendedDataset, OneSourceIsTheUnweightedStream) {
  const std::string dir = temp_dir("one");
  write_source(dir + "/a.bin", 100, 3000);
  ShardDataConfig cfg;
  cfg.train = {dir + "/a.bin"};
  cfg.val_fraction = 0.1;
  const ShardDataset plain(cfg, 16, 512, 3, "");
  cfg.weights = {1};
  const auto blend = make_dataset({DatasetType::Shards, {}, {}, {}, cfg, ""}, 16, 512, 3, "");
  ASSERT_EQ(blend->size(Split::Val), plain.size(Split::Val));
  for (uint64_t i = 0; i < 3 * plain.size(Split::Train); ++i)
    ASSERT_EQ(get_seq(*blend, Split::Train, i, 16), get_seq(plain, Split::Train, i, 16)) << i;
  for (uint64_t i = 0; i < plain.size(Split::Val); ++i)
    ASSERT_EQ(get_seq(*blend, Split::Val, i, 16), get_seq(plain, Split::Val, i, 16)) << i;
}

// Sources may share files (a subset weighted up): with data.tokenizer too,
// whose check expands every entry (a file read twice within one stream is
// still an error, ShardDataset's).
TEST(BlendedDataset, SourcesMayShareFilesWithATokenizerToo) {
  const std::string dir = temp_dir("shared");
  write_source(dir + "/a_0.bin", 100, 3000);
  write_source(dir + "/a_1.bin", 200, 3000);
  std::filesystem::create_directories(dir + "/tok");
  std::ofstream(dir + "/tok/kvshift_tokenizer.json") << R"({"type": "bytes"})";
  DataConfig d{DatasetType::Shards, {}, {}, {}, {}, dir + "/tok"};
  d.shards.train = {dir + "/a_*.bin", dir + "/a_0.bin"};
  d.shards.val_fraction = 0.1;
  d.shards.weights = {0.7, 0.3};
  EXPECT_GT(make_dataset(d, 16, 512, 3, "")->size(Split::Train), 0u);
  d.shards.weights = {};  // one stream: a_0.bin twice
  EXPECT_KVS_ERROR(make_dataset(d, 16, 512, 3, ""), "a_0.bin is matched by", "it would be read twice");
}

// Per-source validation files: entry s of data.shards.val is source s's.
TEST(BlendedDataset, ValidationFilesPerSource) {
  const std::string dir = temp_dir("valfiles");
  write_source(dir + "/a.bin", 100, 2000);
  write_source(dir + "/b.bin", 300, 2000);
  write_source(dir + "/a_val.bin", 200, 400);
  write_source(dir + "/b_val.bin", 400, 400);
  ShardDataConfig cfg;
  cfg.train = {dir + "/a.bin", dir + "/b.bin"};
  cfg.val = {dir + "/a_val.bin", dir + "/b_val.bin"};
  cfg.weights = {1, 1};
  const BlendedDataset blend(cfg, 16, 512, 1, "");
  for (uint64_t i = 0; i < blend.size(Split::Val); ++i) {
    const int32_t first = get_seq(blend, Split::Val, i, 16).in[0];
    EXPECT_EQ(first >= 400, blend.source_of(Split::Val, i) == 1) << i;
    EXPECT_TRUE((first >= 200 && first < 300) || first >= 400) << i;
  }
  // A source too short names its entry.
  write_source(dir + "/tiny.bin", 100, 10);
  cfg.train[1] = dir + "/tiny.bin";
  EXPECT_KVS_ERROR(BlendedDataset(cfg, 16, 512, 1, ""), "data.shards.train[1]: 10 training tokens");
  cfg.train[1] = dir + "/b.bin";
  cfg.val[1] = dir + "/tiny.bin";
  EXPECT_KVS_ERROR(BlendedDataset(cfg, 16, 512, 1, ""), "data.shards.val[1]: 10 validation tokens");
  cfg.val[1] = dir + "/none_*.bin";
  EXPECT_KVS_ERROR(BlendedDataset(cfg, 16, 512, 1, ""), "data.shards.val[1]: no file matches");
}

TEST(BlendedDataset, ConfigRules) {
  const std::string base = R"({"model": {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 128},
      "data": {"type": "shards", "shards": )";
  auto load = [&](const std::string& shards) {
    Config c = config_from_json(nlohmann::json::parse(base + shards + "}}"), "c.json");
    validate(c, "c.json");
    return c;
  };
  const Config ok = load(R"({"train": ["a/*.bin", "b/*.bin"], "weights": [0.7, 0.3]})");
  EXPECT_EQ(ok.data.shards.weights, (std::vector<double>{0.7, 0.3}));
  EXPECT_EQ(to_json(ok)["data"]["shards"]["weights"], nlohmann::json::array({0.7, 0.3}));
  EXPECT_FALSE(to_json(load(R"({"train": ["a/*.bin"]})"))["data"]["shards"].contains("weights"));
  EXPECT_KVS_ERROR(load(R"({"train": ["a/*.bin", "b/*.bin"], "weights": [1]})"),
                   "c.json: data.shards.weights: 1 weight for 2 data.shards.train entries (one weight per entry");
  EXPECT_KVS_ERROR(load(R"({"train": ["a/*.bin", "b/*.bin"], "weights": [1, 0]})"),
                   "c.json: data.shards.weights[1]: must be > 0, got 0");
  EXPECT_KVS_ERROR(load(R"({"train": ["a/*.bin", "b/*.bin"], "weights": [1, "x"]})"),
                   "c.json: data.shards.weights[1]: expected a number");
  EXPECT_KVS_ERROR(load(R"({"train": ["a/*.bin", "b/*.bin"], "val": ["v/*.bin"], "weights": [1, 1]})"),
                   "c.json: data.shards.val: 1 entry for 2 sources");
  // Through an override, as a JSON array.
  nlohmann::json j = to_json(ok);
  apply_override(j, "data.shards.weights=[1,3]", "--set");
  EXPECT_EQ(config_from_json(j, "--set").data.shards.weights, (std::vector<double>{1, 3}));
}
