// Data layer: the induction task, token shards and the shard dataset.
#include <gtest/gtest.h>

#include "build_paths.h"
#include "data_test_util.h"
#include "test_util.h"
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/dataset.h"
#include "data/hopk.h"
#include "data/induction.h"
#include "data/ngram.h"
#include "data/shard_dataset.h"
#include "data/shards.h"

namespace fs = std::filesystem;
using namespace kvs;

namespace {

using kvs::testing_util::error_of;

InductionDataConfig small_cfg(int pool = 32) {
  InductionDataConfig c;
  c.token_lo = 11;
  c.token_hi = 200;
  c.pool_size = pool;
  c.pad_token = 0;
  return c;
}

using kvs::testing_util::get_seq;
using kvs::testing_util::Seq;

std::string temp_dir(const std::string& name) { return kvs::testing_util::fresh_temp_dir("kvs_data_", name); }

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

// ---------------------------------------------------------------- induction

TEST(DataInduction, DeterministicPerSeedAndIndex) {
  const int T = 64;
  InductionDataset ds(small_cfg(), T, 256, 42);
  const Seq a = get_seq(ds, Split::Train, 7, T), b = get_seq(ds, Split::Train, 7, T);
  EXPECT_EQ(a.in, b.in);
  EXPECT_EQ(a.tg, b.tg);
  EXPECT_EQ(a.mask, b.mask);
  EXPECT_NE(a.in, get_seq(ds, Split::Train, 8, T).in);
  EXPECT_NE(a.in, get_seq(ds, Split::Val, 7, T).in);
  InductionDataset other(small_cfg(), T, 256, 43);
  EXPECT_NE(a.in, get_seq(other, Split::Train, 7, T).in);
  // Train and val never produce the same sequence for the first indices.
  std::set<std::vector<int32_t>> train;
  for (uint64_t i = 0; i < 200; ++i) train.insert(get_seq(ds, Split::Train, i, T).in);
  for (uint64_t i = 0; i < 200; ++i) EXPECT_EQ(train.count(get_seq(ds, Split::Val, i, T).in), 0u);
  // generate_induction is a pure function of its seed.
  EXPECT_EQ(generate_induction(small_cfg(), T, 99).tokens, generate_induction(small_cfg(), T, 99).tokens);
}

// What the trainer sees: targets are the next inputs, and the mask scores
// exactly the positions the induction rule predicts from the inputs alone (a
// repeated token whose target is what followed its latest occurrence), checked
// from (inputs, targets, mask) without the generator's own record.
TEST(DataInduction, InputsTargetsMaskMatchSequence) {
  const int T = 64;
  const InductionDataConfig cfg = small_cfg();
  InductionDataset ds(cfg, T, 256, 1);
  int scored = 0;
  for (const Split split : {Split::Train, Split::Val}) {
    for (uint64_t index = 0; index < 50; ++index) {
      const Seq s = get_seq(ds, split, index, T);
      for (int t = 0; t + 1 < T; ++t) ASSERT_EQ(s.tg[t], s.in[t + 1]);
      std::map<int32_t, int32_t> latest_next;
      for (int t = 0; t < T; ++t) {
        ASSERT_TRUE(s.mask[t] == 0.0f || s.mask[t] == 1.0f) << "index " << index << " position " << t;
        if (s.mask[t] == 1.0f) {
          ++scored;
          ASSERT_NE(s.in[t], cfg.pad_token) << "index " << index << ": padding scored at " << t;
          ASSERT_EQ(latest_next.count(s.in[t]), 1u) << "index " << index << ": a first occurrence scored at " << t;
          ASSERT_EQ(s.tg[t], latest_next[s.in[t]]) << "index " << index << " position " << t;
        }
        if (s.in[t] != cfg.pad_token) latest_next[s.in[t]] = s.tg[t];
      }
    }
  }
  // About a third of the positions at pool 32, T 64 (ScoredTargetsFollowLatestOccurrence).
  EXPECT_GT(scored, 100 * T / 5);
}

// Independent check of the generation rule on many sequences and configs.
TEST(DataInduction, ScoredTargetsFollowLatestOccurrence) {
  struct Case {
    int pool, T, max_repeats;
  };
  for (const Case c : {Case{32, 64, 0}, Case{8, 64, 0}, Case{2, 16, 0}, Case{64, 64, 0}, Case{180, 128, 0},
                       Case{16, 64, 3}, Case{32, 1, 0}, Case{32, 2, 0}}) {
    InductionDataConfig cfg = small_cfg(c.pool);
    cfg.max_repeats = c.max_repeats;
    uint64_t scored_total = 0, positions = 0;
    for (uint64_t seed = 0; seed < 300; ++seed) {
      const InductionSequence s = generate_induction(cfg, c.T, seed);
      ASSERT_EQ(s.tokens.size(), static_cast<size_t>(c.T) + 1);
      ASSERT_EQ(s.scored.size(), static_cast<size_t>(c.T));
      // Content tokens come first, then padding only.
      size_t content = 0;
      while (content < s.tokens.size() && s.tokens[content] != cfg.pad_token) ++content;
      for (size_t t = content; t < s.tokens.size(); ++t) ASSERT_EQ(s.tokens[t], cfg.pad_token);
      std::set<int32_t> pool;
      for (size_t t = 0; t < content; ++t) {
        ASSERT_GE(s.tokens[t], cfg.token_lo);
        ASSERT_LT(s.tokens[t], cfg.token_hi);
        pool.insert(s.tokens[t]);
        if (t > 0) {
          ASSERT_NE(s.tokens[t], s.tokens[t - 1]) << "immediate repeat at " << t;
        }
      }
      ASSERT_LE(pool.size(), static_cast<size_t>(c.pool));
      // Scan: for every position, the successor of the latest earlier occurrence.
      std::map<int32_t, int32_t> latest_next;
      int events = 0;
      for (int t = 0; t < c.T; ++t) {
        const int32_t x = s.tokens[t];
        const bool seen = latest_next.count(x) > 0;
        if (s.scored[t]) {
          ++events;
          ASSERT_LT(static_cast<size_t>(t), content);
          ASSERT_TRUE(seen) << "scored position " << t << " holds a token never seen before";
          ASSERT_EQ(s.tokens[t + 1], latest_next[x]) << "seed " << seed << " position " << t;
        } else if (static_cast<size_t>(t) < content && t > 0 && !s.scored[t - 1]) {
          // A drawn (not copied) token that was seen before must have been made an event.
          ASSERT_FALSE(seen) << "seed " << seed << ": repeated token at " << t << " was not scored";
        }
        if (static_cast<size_t>(t) + 1 < content) latest_next[x] = s.tokens[t + 1];
      }
      if (c.max_repeats > 0) {
        ASSERT_LE(events, c.max_repeats);
      }
      scored_total += events;
      positions += c.T;
    }
    if (c.T >= 16) {
      EXPECT_GT(scored_total, 0u) << "pool " << c.pool << " T " << c.T;
    }
    if (c.pool == 32 && c.T == 64) {
      const double frac = static_cast<double>(scored_total) / positions;
      EXPECT_GT(frac, 0.2);
      std::printf("pool 32, T 64: %.3f of positions scored\n", frac);
    }
  }
}

// A sequence with no induction event is regenerated (up to 16 attempts). At pool 32, T 64 every attempt has one
// (pigeonhole); at pool 64, T 12 an attempt has none with probability prod_{k=1..11} (64 - k) / 63 = 0.40 (each of
// the 12 drawn tokens must be new, and a draw is never the previous token): without the retry about 200 of these
// 500 sequences would score nothing, with it each does with probability 0.40^16 = 4e-7.
TEST(DataInduction, EveryTypicalSequenceHasAnEvent) {
  for (const auto& [pool, T] : {std::pair{32, 64}, std::pair{64, 12}}) {
    InductionDataset ds(small_cfg(pool), T, 256, 5);
    for (uint64_t i = 0; i < 500; ++i) {
      const Seq s = get_seq(ds, Split::Train, i, T);
      float sum = 0;
      for (float m : s.mask) sum += m;
      EXPECT_GT(sum, 0.0f) << "pool " << pool << " T " << T << " index " << i;
    }
  }
}

TEST(DataInduction, MaxRepeatsOneGivesOneEventThenPadding) {
  InductionDataConfig cfg = small_cfg(64);
  cfg.max_repeats = 1;
  cfg.pad_token = 3;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const InductionSequence s = generate_induction(cfg, 64, seed);
    int events = 0, at = -1;
    for (int t = 0; t < 64; ++t)
      if (s.scored[t]) ++events, at = t;
    ASSERT_EQ(events, 1) << "seed " << seed;
    // A B, then padding to the end.
    for (size_t t = at + 2; t < s.tokens.size(); ++t) ASSERT_EQ(s.tokens[t], 3) << "seed " << seed;
    for (int t = 0; t <= at + 1; ++t) ASSERT_NE(s.tokens[t], 3);
  }
}

TEST(DataInduction, InvalidConfigsNameTheKey) {
  InductionDataConfig c = small_cfg();
  c.token_hi = 9000;
  EXPECT_KVS_ERROR(InductionDataset(c, 64, 8000, 1), "data.induction.token_hi (9000)", "model.vocab_size (8000)");
  c = small_cfg();
  c.token_lo = -1;
  EXPECT_KVS_ERROR(InductionDataset(c, 64, 256, 1), "data.induction.token_lo");
  c = small_cfg();
  c.token_lo = 200;
  EXPECT_KVS_ERROR(InductionDataset(c, 64, 256, 1), "data.induction.token_lo");
  c = small_cfg();
  c.pool_size = 1;
  EXPECT_KVS_ERROR(InductionDataset(c, 64, 256, 1), "data.induction.pool_size");
  c = small_cfg();
  c.pool_size = 190;  // [11, 200) holds 189 ids
  EXPECT_KVS_ERROR(InductionDataset(c, 64, 256, 1), "data.induction.pool_size (190)");
  c = small_cfg();
  c.pad_token = 50;
  EXPECT_KVS_ERROR(InductionDataset(c, 64, 256, 1), "data.induction.pad_token (50)");
  c = small_cfg();
  c.pad_token = 256;
  EXPECT_KVS_ERROR(InductionDataset(c, 64, 256, 1), "data.induction.pad_token (256)");
  c = small_cfg();
  c.max_repeats = -1;
  EXPECT_KVS_ERROR(InductionDataset(c, 64, 256, 1), "data.induction.max_repeats");
  EXPECT_TRUE(error_of([&] { InductionDataset(small_cfg(), 64, 256, 1); }).empty());
}

TEST(DataInduction, MakeDatasetAndDescribe) {
  DataConfig d;
  d.induction = small_cfg();
  auto ds = make_dataset(d, 32, 256, 1, "");
  EXPECT_TRUE(ds->reports_accuracy());
  EXPECT_EQ(ds->size(Split::Train), UINT64_MAX);
  EXPECT_EQ(ds->describe(), "induction: tokens [11, 200), pool 32");
  // An unknown type is stopped where data.type is read.
  EXPECT_KVS_ERROR(kvs::parse_enum<kvs::DatasetType>("bogus", "c.json", "data.type"), "data.type", "bogus");
}

// ---------------------------------------------------------------- ngram

namespace {

NgramDataConfig ngram_cfg(int pairs = 50) {
  NgramDataConfig c;
  c.token_lo = 11;
  c.token_hi = 60;
  c.num_pairs = pairs;
  c.table_seed = 7;
  return c;
}

}  // namespace

TEST(DataNgram, TableIsDistinctInRangeAndFixedByTableSeed) {
  const auto t = make_ngram_table(ngram_cfg());
  ASSERT_EQ(t.size(), 50u);
  std::set<std::pair<int, int>> pairs;
  for (const auto& e : t) {
    for (int x : {e.x1, e.x2, e.x3}) {
      EXPECT_GE(x, 11);
      EXPECT_LT(x, 60);
    }
    pairs.insert({e.x1, e.x2});
  }
  EXPECT_EQ(pairs.size(), 50u);
  const auto again = make_ngram_table(ngram_cfg());
  for (size_t i = 0; i < t.size(); ++i) EXPECT_TRUE(t[i].x1 == again[i].x1 && t[i].x2 == again[i].x2 && t[i].x3 == again[i].x3);
  auto other = ngram_cfg();
  other.table_seed = 8;
  const auto t2 = make_ngram_table(other);
  bool differs = false;
  for (size_t i = 0; i < t.size(); ++i) differs |= t[i].x1 != t2[i].x1 || t[i].x2 != t2[i].x2 || t[i].x3 != t2[i].x3;
  EXPECT_TRUE(differs);
  // Every pair of a tiny range: num_pairs = range^2 is allowed and gives all of them.
  NgramDataConfig full = ngram_cfg(9);
  full.token_hi = 14;
  std::set<std::pair<int, int>> all;
  for (const auto& e : make_ngram_table(full)) all.insert({e.x1, e.x2});
  EXPECT_EQ(all.size(), 9u);
}

TEST(DataNgram, DeterministicSplitsDifferTableShared) {
  const int T = 64;
  NgramDataset a(ngram_cfg(), T, 128, 1), b(ngram_cfg(), T, 128, 1), c(ngram_cfg(), T, 128, 2);
  // The table depends on table_seed only, not on train.seed.
  ASSERT_EQ(a.table().size(), c.table().size());
  for (size_t i = 0; i < a.table().size(); ++i) EXPECT_EQ(a.table()[i].x3, c.table()[i].x3);
  std::map<std::pair<int, int>, int> x3_of;
  for (const auto& e : a.table()) x3_of[{e.x1, e.x2}] = e.x3;
  int differ_split = 0, differ_seed = 0;
  for (uint64_t i = 0; i < 50; ++i) {
    for (Split sp : {Split::Train, Split::Val}) {
      Seq s1 = get_seq(a, sp, i, T), s2 = get_seq(b, sp, i, T);
      EXPECT_EQ(s1.in, s2.in);
      EXPECT_EQ(s1.tg, s2.tg);
      EXPECT_EQ(s1.mask, s2.mask);
      int scored = 0;
      for (int t = 0; t < T; ++t) {
        if (t + 1 < T) {
          EXPECT_EQ(s1.tg[t], s1.in[t + 1]);
        }
        if (s1.mask[t] == 0.0f) continue;
        ++scored;
        ASSERT_GE(t, 1);
        // Scored target = the table's x3 of (x1, x2) at (t - 1, t), in train and validation alike.
        auto it = x3_of.find({s1.in[t - 1], s1.in[t]});
        ASSERT_NE(it, x3_of.end()) << "pair not in the table at t=" << t;
        EXPECT_EQ(s1.tg[t], it->second);
        EXPECT_EQ(t % 3, 1);
      }
      EXPECT_EQ(scored, (T + 1) / 3);  // x2 positions 1, 4, ..., < T
    }
    differ_split += get_seq(a, Split::Train, i, T).in != get_seq(a, Split::Val, i, T).in;
    differ_seed += get_seq(a, Split::Train, i, T).in != get_seq(c, Split::Train, i, T).in;
  }
  EXPECT_GE(differ_split, 49);
  EXPECT_GE(differ_seed, 49);
  EXPECT_TRUE(a.reports_accuracy());
  EXPECT_EQ(a.accuracy_name(), "3-gram");
}

TEST(DataNgram, InvalidConfigsNameTheKey) {
  NgramDataConfig c = ngram_cfg();
  c.token_hi = 200;
  EXPECT_KVS_ERROR(NgramDataset(c, 64, 128, 1), "data.ngram.token_hi (200)", "model.vocab_size (128)");
  c = ngram_cfg();
  c.token_lo = -1;
  EXPECT_KVS_ERROR(NgramDataset(c, 64, 128, 1), "data.ngram.token_lo");
  c = ngram_cfg();
  c.token_lo = 60;
  EXPECT_KVS_ERROR(NgramDataset(c, 64, 128, 1), "data.ngram.token_lo");
  c = ngram_cfg(0);
  EXPECT_KVS_ERROR(NgramDataset(c, 64, 128, 1), "data.ngram.num_pairs (0)");
  c = ngram_cfg(49 * 49 + 1);
  EXPECT_KVS_ERROR(NgramDataset(c, 64, 128, 1), "data.ngram.num_pairs (2402)");
  EXPECT_KVS_ERROR(NgramDataset(ngram_cfg(), 1, 128, 1), "train.seq_len");
  EXPECT_TRUE(error_of([&] { NgramDataset(ngram_cfg(49 * 49), 64, 128, 1); }).empty());
}

// ---------------------------------------------------------------- hop-k

namespace {

HopkDataConfig hopk_cfg(int k, int lo = 11, int hi = 15) {
  HopkDataConfig c;
  c.token_lo = lo;
  c.token_hi = hi;
  c.k = k;
  return c;
}

// Independent reference: hop_k at position `end` by plain backward scans,
// O(T^2). Returns -1 if some hop finds no earlier occurrence.
int brute_hopk(const std::vector<int32_t>& x, int k, int end = -1) {
  int i = end < 0 ? static_cast<int>(x.size()) - 1 : end;
  for (int h = 0; h < k; ++h) {
    int found = -1;
    for (int j = i - 1; j >= 0; --j)
      if (x[j] == x[i]) {
        found = j;
        break;
      }
    if (found < 0) return -1;
    i = found + 1;
  }
  return x[i];
}

}  // namespace

TEST(DataHopk, AnswersMatchBruteForceForManySequencesAndK) {
  long scored = 0;
  for (int k = 1; k <= 8; ++k) {
    for (auto [lo, hi, T] : {std::tuple{11, 15, 64}, std::tuple{3, 5, 32}, std::tuple{20, 30, 128}}) {
      HopkDataset ds(hopk_cfg(k, lo, hi), T, 128, 99);
      for (uint64_t i = 0; i < 100; ++i) {
        for (Split sp : {Split::Train, Split::Val}) {
          Seq s = get_seq(ds, sp, i, T);
          SCOPED_TRACE(::testing::Message() << "k=" << k << " T=" << T << " i=" << i);
          for (int t = 0; t < T; ++t) {
            ASSERT_GE(s.in[t], lo);
            ASSERT_LT(s.in[t], hi);
            if (t > 0) {
              ASSERT_NE(s.in[t], s.in[t - 1]);  // no immediate repeats
            }
            // Every position whose chain exists is scored with its own answer.
            const int ref_t = brute_hopk(std::vector<int32_t>(s.in.begin(), s.in.begin() + t + 1), k);
            EXPECT_EQ(s.mask[t], ref_t >= 0 ? 1.0f : 0.0f) << "t=" << t;
            if (ref_t >= 0) {
              EXPECT_EQ(s.tg[t], ref_t) << "t=" << t;
            }
            scored += s.mask[t] > 0;
          }
          const int ref = brute_hopk(s.in, k);
          ASSERT_NE(ref, -1);
          EXPECT_EQ(s.tg[T - 1], ref);
        }
      }
    }
  }
  // Dense supervision: well over a quarter of the 358,400 positions are scored.
  EXPECT_GT(scored, 90000);
}

TEST(DataHopk, ChainAndRedrawsAgreeWithReference) {
  // A large alphabet forces redraws; the returned draw still matches the reference.
  const HopkDataConfig c = hopk_cfg(3, 11, 41);
  int redrawn = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    HopkSequence s = generate_hopk(c, 48, seed);
    ASSERT_EQ(s.chain.size(), 4u);
    for (size_t h = 1; h < s.chain.size(); ++h) EXPECT_LT(s.chain[h], s.chain[h - 1]);
    EXPECT_EQ(s.answer, brute_hopk(s.tokens, 3));
    EXPECT_EQ(s.answer, s.tokens[s.chain.back()]);
    redrawn += s.attempts > 1;
  }
  EXPECT_GT(redrawn, 0);
  // Impossible settings fail after the bounded attempts, naming the config.
  EXPECT_KVS_ERROR(generate_hopk(hopk_cfg(6, 0, 100), 8, 1), "data.hopk", "train.seq_len 8");
}

TEST(DataHopk, DeterministicAndSplitsDiffer) {
  const int T = 64;
  HopkDataset a(hopk_cfg(4), T, 128, 5), b(hopk_cfg(4), T, 128, 5), c(hopk_cfg(4), T, 128, 6);
  int differ_split = 0, differ_seed = 0;
  for (uint64_t i = 0; i < 50; ++i) {
    Seq s1 = get_seq(a, Split::Train, i, T), s2 = get_seq(b, Split::Train, i, T);
    EXPECT_EQ(s1.in, s2.in);
    EXPECT_EQ(s1.tg, s2.tg);
    differ_split += s1.in != get_seq(a, Split::Val, i, T).in;
    differ_seed += s1.in != get_seq(c, Split::Train, i, T).in;
  }
  EXPECT_GE(differ_split, 49);
  EXPECT_GE(differ_seed, 49);
  EXPECT_TRUE(a.reports_accuracy());
  EXPECT_EQ(a.accuracy_name(), "hop-k");
  EXPECT_EQ(a.describe(), "hopk: k 4, alphabet [11, 15)");
}

TEST(DataHopk, InvalidConfigsNameTheKey) {
  EXPECT_KVS_ERROR(HopkDataset(hopk_cfg(2, 11, 200), 64, 128, 1), "data.hopk.token_hi (200)", "model.vocab_size (128)");
  EXPECT_KVS_ERROR(HopkDataset(hopk_cfg(2, -1, 3), 64, 128, 1), "data.hopk.token_lo");
  EXPECT_KVS_ERROR(HopkDataset(hopk_cfg(2, 11, 12), 64, 128, 1), "data.hopk.token_hi");
  EXPECT_KVS_ERROR(HopkDataset(hopk_cfg(0), 64, 128, 1), "data.hopk.k (0)");
  EXPECT_KVS_ERROR(HopkDataset(hopk_cfg(63), 64, 128, 1), "data.hopk.k (63)");
  EXPECT_TRUE(error_of([&] { HopkDataset(hopk_cfg(62), 64, 128, 1); }).empty());
}

TEST(DataTasks, MakeDatasetPicksNgramAndHopk) {
  DataConfig d;
  d.type = kvs::DatasetType::Ngram;
  d.ngram = ngram_cfg();
  auto n = make_dataset(d, 32, 128, 1, "");
  EXPECT_EQ(n->accuracy_name(), "3-gram");
  EXPECT_EQ(n->describe(), "ngram: 3-gram table of 50 pairs over tokens [11, 60), table_seed 7");
  d.type = kvs::DatasetType::Hopk;
  d.hopk = hopk_cfg(3);
  auto h = make_dataset(d, 32, 128, 1, "");
  EXPECT_EQ(h->accuracy_name(), "hop-k");
  d.type = kvs::DatasetType::Induction;
  d.induction = small_cfg();
  EXPECT_EQ(make_dataset(d, 32, 256, 1, "")->accuracy_name(), "induction");
}

// ---------------------------------------------------------------- shards

TEST(DataShards, RoundTripU16AndU32) {
  const std::string dir = temp_dir("roundtrip");
  std::vector<uint32_t> toks;
  for (uint32_t i = 0; i < 1000; ++i) toks.push_back((i * 2654435761u) % 65536u);
  write_shard(dir + "/a.bin", toks, 2);
  {
    ShardFile f(dir + "/a.bin");
    ASSERT_EQ(f.size(), toks.size());
    for (size_t i = 0; i < toks.size(); ++i) ASSERT_EQ(f.token(i), toks[i]);
    EXPECT_EQ(f.path(), dir + "/a.bin");
  }
  EXPECT_EQ(fs::file_size(dir + "/a.bin"), 32u + 2u * toks.size());
  const std::vector<uint8_t> b = read_bytes(dir + "/a.bin");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data()), 8), std::string("KVSTOKS\0", 8));
  EXPECT_EQ(b[8], 1);
  EXPECT_EQ(b[12], 2);
  EXPECT_EQ(b[16], 1000 & 0xff);
  EXPECT_EQ(b[17], 1000 >> 8);
  EXPECT_EQ(b[32], toks[0] & 0xff);  // little-endian tokens
  EXPECT_EQ(b[33], toks[0] >> 8);

  std::vector<uint32_t> big = {0, 1, 65535, 65536, 1u << 31, 4294967295u};
  write_shard(dir + "/b.bin", big, 4);
  ShardFile g(dir + "/b.bin");
  ASSERT_EQ(g.size(), big.size());
  for (size_t i = 0; i < big.size(); ++i) EXPECT_EQ(g.token(i), big[i]);
  EXPECT_EQ(fs::file_size(dir + "/b.bin"), 32u + 4u * big.size());

  write_shard(dir + "/empty.bin", {}, 2);
  EXPECT_EQ(ShardFile(dir + "/empty.bin").size(), 0u);
  // No temporary files are left behind.
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(DataShards, WriterRejectsBadInput) {
  const std::string dir = temp_dir("writer");
  EXPECT_KVS_ERROR(write_shard(dir + "/x.bin", {1, 2, 70000}, 2), dir + "/x.bin", "70000", "position 2", "u16");
  EXPECT_FALSE(fs::exists(dir + "/x.bin"));
  EXPECT_KVS_ERROR(write_shard(dir + "/x.bin", {1}, 3), "token_bytes");
  EXPECT_KVS_ERROR(write_shard(dir + "/no/such/dir/x.bin", {1}, 2), "no/such/dir/x.bin");
}

TEST(DataShards, CorruptFilesNameThePath) {
  const std::string dir = temp_dir("corrupt");
  const std::string good = dir + "/good.bin";
  write_shard(good, {5, 6, 7, 8}, 2);
  const std::vector<uint8_t> ok = read_bytes(good);

  auto variant = [&](const std::string& name, auto&& edit) {
    std::vector<uint8_t> b = ok;
    edit(b);
    write_bytes(dir + "/" + name, b);
    return dir + "/" + name;
  };
  std::string p = variant("magic.bin", [](auto& b) { b[0] = 'X'; });
  EXPECT_KVS_ERROR(ShardFile{p}, p, "magic");
  p = variant("version.bin", [](auto& b) { b[8] = 2; });
  EXPECT_KVS_ERROR(ShardFile{p}, p, "version 2");
  p = variant("tokbytes.bin", [](auto& b) { b[12] = 3; });
  EXPECT_KVS_ERROR(ShardFile{p}, p, "bytes per token 3");
  p = variant("truncated.bin", [](auto& b) { b.pop_back(); });
  EXPECT_KVS_ERROR(ShardFile{p}, p, "file size 39", "truncated");
  p = variant("extra.bin", [](auto& b) { b.push_back(0); b.push_back(0); });
  EXPECT_KVS_ERROR(ShardFile{p}, p, "file size 42");
  p = variant("count.bin", [](auto& b) { b[23] = 0x80; });  // absurd count, no overflow
  EXPECT_KVS_ERROR(ShardFile{p}, p, "does not match");
  p = variant("short.bin", [](auto& b) { b.resize(10); });
  EXPECT_KVS_ERROR(ShardFile{p}, p, "header");
  EXPECT_KVS_ERROR(ShardFile{dir + "/missing.bin"}, dir + "/missing.bin");
  EXPECT_EQ(ShardFile(good).size(), 4u);
}

// ---------------------------------------------------------------- shard dataset

namespace {

// Files holding the stream 0, 1, 2, ... split into pieces of the given sizes.
std::vector<uint32_t> write_counting(const std::string& dir, const std::vector<size_t>& sizes, uint32_t mod = 1000) {
  std::vector<uint32_t> all;
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<uint32_t> part;
    for (size_t i = 0; i < sizes[k]; ++i) part.push_back(static_cast<uint32_t>(all.size() + i) % mod);
    all.insert(all.end(), part.begin(), part.end());
    char name[32];
    std::snprintf(name, sizeof name, "/train_%03zu.bin", k);
    write_shard(dir + name, part, 2);
  }
  return all;
}

}  // namespace

TEST(DataShardDataset, WindowsSpanFilesAndPermutationIsABijection) {
  const std::string dir = temp_dir("windows");
  // 3 files of uneven sizes (one empty), 1003 tokens in all.
  const std::vector<uint32_t> all = write_counting(dir, {400, 0, 603});
  ShardDataConfig cfg;
  cfg.train = {"train_*.bin"};  // relative to config_dir
  cfg.val_fraction = 0.0;
  const int T = 10;
  ShardDataset ds(cfg, T, 1000, 7, dir);
  const uint64_t n = (1003 - 1) / T;  // 100 windows of 11 tokens, starts at 0, 10, ..., 990
  ASSERT_EQ(ds.size(Split::Train), n);
  EXPECT_EQ(ds.size(Split::Val), 0u);
  EXPECT_NE(ds.describe().find("3 files"), std::string::npos) << ds.describe();

  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<uint64_t> seen;
    for (uint64_t j = 0; j < n; ++j) {
      const uint64_t w = ds.train_window(epoch * n + j);
      ASSERT_LT(w, n);
      seen.insert(w);
    }
    EXPECT_EQ(seen.size(), n) << "epoch " << epoch;
  }
  // Different epochs are shuffled differently; the order is not the identity.
  std::vector<uint64_t> e0, e1;
  for (uint64_t j = 0; j < n; ++j) e0.push_back(ds.train_window(j)), e1.push_back(ds.train_window(n + j));
  EXPECT_NE(e0, e1);
  std::vector<uint64_t> ident(n);
  for (uint64_t j = 0; j < n; ++j) ident[j] = j;
  EXPECT_NE(e0, ident);

  // Every window's content is the right slice of the stream (incl. those crossing files).
  for (uint64_t i = 0; i < 2 * n + 5; ++i) {
    const Seq s = get_seq(ds, Split::Train, i, T);
    const uint64_t start = ds.train_window(i) * T;
    for (int t = 0; t < T; ++t) {
      ASSERT_EQ(static_cast<uint32_t>(s.in[t]), all[start + t]);
      ASSERT_EQ(static_cast<uint32_t>(s.tg[t]), all[start + t + 1]);
      ASSERT_EQ(s.mask[t], 1.0f);
    }
  }
  // Same seed: same order; another seed: another order.
  ShardDataset same(cfg, T, 1000, 7, dir), other(cfg, T, 1000, 8, dir);
  std::vector<uint64_t> o;
  for (uint64_t j = 0; j < n; ++j) {
    EXPECT_EQ(same.train_window(j), e0[j]);
    o.push_back(other.train_window(j));
  }
  EXPECT_NE(o, e0);
}

TEST(DataShardDataset, PermutationBijectionForManySizes) {
  const std::string dir = temp_dir("sizes");
  for (size_t tokens : {2, 3, 4, 7, 13, 64, 97, 211}) {
    write_shard(dir + "/s.bin", std::vector<uint32_t>(tokens, 1), 2);
    ShardDataConfig cfg;
    cfg.train = {dir + "/s.bin"};  // absolute path
    cfg.val_fraction = 0;
    ShardDataset ds(cfg, 1, 10, 3, "/nonexistent");
    const uint64_t n = ds.size(Split::Train);
    ASSERT_EQ(n, tokens - 1);
    for (uint64_t epoch = 0; epoch < 4; ++epoch) {
      std::set<uint64_t> seen;
      for (uint64_t j = 0; j < n; ++j) seen.insert(ds.train_window(epoch * n + j));
      ASSERT_EQ(seen.size(), n) << "n " << n << " epoch " << epoch;
      ASSERT_LT(*seen.rbegin(), n);
    }
  }
}

TEST(DataShardDataset, ValSplitByFractionAndByFiles) {
  const std::string dir = temp_dir("val");
  const std::vector<uint32_t> all = write_counting(dir, {600, 400});
  ShardDataConfig cfg;
  cfg.train = {dir + "/train_*.bin"};
  cfg.val_fraction = 0.1;  // last 100 tokens
  const int T = 8;
  ShardDataset ds(cfg, T, 1000, 1, "");
  EXPECT_EQ(ds.tokens(Split::Train), 900u);
  EXPECT_EQ(ds.tokens(Split::Val), 100u);
  EXPECT_EQ(ds.size(Split::Train), (900u - 1) / T);
  ASSERT_EQ(ds.size(Split::Val), (100u - 1) / T);
  // Train windows stay inside the train part.
  for (uint64_t i = 0; i < ds.size(Split::Train); ++i) {
    const Seq s = get_seq(ds, Split::Train, i, T);
    EXPECT_LT(s.tg[T - 1], 900);
  }
  // Validation windows are in order, starting at the split; the index wraps.
  for (uint64_t i = 0; i < ds.size(Split::Val) + 2; ++i) {
    const Seq s = get_seq(ds, Split::Val, i, T);
    const uint64_t start = 900 + (i % ds.size(Split::Val)) * T;
    for (int t = 0; t < T; ++t) {
      ASSERT_EQ(static_cast<uint32_t>(s.in[t]), all[start + t]);
      ASSERT_EQ(static_cast<uint32_t>(s.tg[t]), all[start + t + 1]);
    }
  }
  // Explicit validation files.
  const std::string vdir = temp_dir("val_files");
  std::vector<uint32_t> v;
  for (uint32_t i = 0; i < 50; ++i) v.push_back(500 + i);
  write_shard(vdir + "/val.bin", v, 4);
  cfg.val = {vdir + "/val.bin"};
  ShardDataset dv(cfg, T, 1000, 1, "");
  EXPECT_EQ(dv.tokens(Split::Train), 1000u);
  EXPECT_EQ(dv.size(Split::Val), (50u - 1) / T);
  const Seq s = get_seq(dv, Split::Val, 1, T);
  EXPECT_EQ(s.in[0], 500 + T);
  // Too small a validation split is an error.
  cfg.val = {};
  cfg.val_fraction = 0.005;  // 5 tokens < T + 1
  EXPECT_KVS_ERROR(ShardDataset(cfg, T, 1000, 1, ""), "data.shards.val_fraction");
  cfg.val_fraction = 1.0;
  EXPECT_KVS_ERROR(ShardDataset(cfg, T, 1000, 1, ""), "data.shards.val_fraction");
}

// A window is T + 1 tokens and windows start every T tokens, so a split of k * T tokens holds k - 1 windows (the
// k-th would need one token past the end): the last one must be readable and no window may run past the split.
TEST(DataShardDataset, WindowCountWhenTokensAreAMultipleOfT) {
  const std::string dir = temp_dir("multiple");
  const std::vector<uint32_t> all = write_counting(dir, {300, 468});  // 768 = 96 * 8 tokens
  const int T = 8;
  auto expect_windows = [&](const ShardDataset& ds, Split split, uint64_t first_token, uint64_t n) {
    ASSERT_EQ(ds.size(split), n);
    std::set<uint64_t> starts;
    for (uint64_t i = 0; i < n; ++i) {
      const Seq s = get_seq(ds, split, i, T);
      const uint64_t start = first_token + (split == Split::Train ? ds.train_window(i) : i) * T;
      starts.insert(start);
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(static_cast<uint32_t>(s.in[t]), all[start + t]) << "window " << i;
        ASSERT_EQ(static_cast<uint32_t>(s.tg[t]), all[start + t + 1]) << "window " << i;
      }
    }
    ASSERT_EQ(starts.size(), n);
    // The window after the last would need the token just past the split.
    EXPECT_EQ(*starts.rbegin() + 2 * T, first_token + ds.tokens(split));
  };
  ShardDataConfig cfg;
  cfg.train = {dir + "/train_*.bin"};
  cfg.val_fraction = 0.125;  // the last 96 tokens: 11 windows; train 672 = 84 * 8 tokens: 83 windows
  ShardDataset ds(cfg, T, 1000, 1, "");
  ASSERT_EQ(ds.tokens(Split::Val), 96u);
  expect_windows(ds, Split::Val, 672, 11);
  expect_windows(ds, Split::Train, 0, 83);
  // Explicit validation files: 96 tokens over two files (0, 1, ..., 95, i.e. all[0, 96)), the same 11 windows.
  const std::string vdir = temp_dir("multiple_val");
  write_counting(vdir, {50, 46});
  cfg.val = {vdir + "/train_*.bin"};
  ShardDataset dv(cfg, T, 1000, 1, "");
  ASSERT_EQ(dv.tokens(Split::Val), 96u);
  expect_windows(dv, Split::Val, 0, 11);
  expect_windows(dv, Split::Train, 0, (768 - 1) / T);
}

TEST(DataShardDataset, Errors) {
  const std::string dir = temp_dir("errors");
  std::vector<uint32_t> toks(100, 5);
  toks[37] = 300;
  write_shard(dir + "/a.bin", std::vector<uint32_t>(50, 5), 2);
  write_shard(dir + "/bad.bin", toks, 2);
  ShardDataConfig cfg;
  cfg.train = {"a.bin", "bad.bin"};
  cfg.val_fraction = 0;
  ShardDataset ds(cfg, 10, 256, 1, dir);
  // Windows not touching the bad token (position 37 of bad.bin, 87 of the two
  // files together) are fine; the ones holding it fail naming the file and
  // the position in that file.
  const uint64_t bad = 50 + 37;
  uint64_t failures = 0;
  for (uint64_t i = 0; i < ds.size(Split::Train); ++i) {
    const uint64_t start = ds.train_window(i) * 10;
    const bool holds = start <= bad && bad <= start + 10;
    const std::string msg = error_of([&] { get_seq(ds, Split::Train, i, 10); });
    EXPECT_EQ(!msg.empty(), holds) << "window at " << start;
    if (holds) {
      ++failures;
      EXPECT_NE(msg.find(dir + "/bad.bin: token ID 300 at position 37 is >= model.vocab_size 256"),
                std::string::npos)
          << msg;
    }
  }
  EXPECT_EQ(failures, 1u);  // only the window [80, 90]

  cfg.train = {"nothing_*.bin"};
  EXPECT_KVS_ERROR(ShardDataset(cfg, 10, 256, 1, dir), "data.shards.train", "nothing_*.bin");
  cfg.train = {"bad.bin"};
  cfg.val = {"missing_val.bin"};
  EXPECT_KVS_ERROR(ShardDataset(cfg, 10, 256, 1, dir), "data.shards.val", "missing_val.bin");
  cfg.val = {};
  EXPECT_KVS_ERROR(ShardDataset(cfg, 100, 256, 1, dir), "data.shards.train", "100 training tokens", "101");
  write_shard(dir + "/tiny.bin", {1, 2, 3}, 2);
  cfg.val = {"tiny.bin"};
  EXPECT_KVS_ERROR(ShardDataset(cfg, 10, 256, 1, dir), "data.shards.val", "3 validation tokens");

  // The limit itself: vocab_size - 1 is the largest id that loads, vocab_size the smallest that does not.
  write_shard(dir + "/top.bin", {0, 255, 255}, 2);
  write_shard(dir + "/over.bin", {0, 256, 255}, 2);
  cfg.val = {};
  cfg.train = {"top.bin"};
  const Seq top = get_seq(ShardDataset(cfg, 2, 256, 1, dir), Split::Train, 0, 2);
  EXPECT_EQ(top.in, (std::vector<int32_t>{0, 255}));
  EXPECT_EQ(top.tg, (std::vector<int32_t>{255, 255}));
  cfg.train = {"over.bin"};
  EXPECT_KVS_ERROR(get_seq(ShardDataset(cfg, 2, 256, 1, dir), Split::Train, 0, 2),
                   dir + "/over.bin: token ID 256 at position 1 is >= model.vocab_size 256");

  DataConfig d;
  d.type = kvs::DatasetType::Shards;
  d.shards.train = {"bad.bin"};
  d.shards.val_fraction = 0;
  auto made = make_dataset(d, 10, 256, 1, dir);
  EXPECT_FALSE(made->reports_accuracy());
  EXPECT_EQ(made->size(Split::Train), 9u);
  EXPECT_KVS_ERROR(get_seq(*made, Split::Val, 0, 10), "no validation data");
}

// A file matched twice would be read twice, silently doubling its weight; a
// glob that matches a directory gets its own message, not mmap's.
TEST(DataShardDataset, AFileMatchedTwiceOrADirectoryIsAnError) {
  const std::string dir = temp_dir("twice");
  write_shard(dir + "/train_0.bin", std::vector<uint32_t>(40, 7), 2);
  write_shard(dir + "/train_1.bin", std::vector<uint32_t>(40, 7), 2);
  ShardDataConfig cfg;
  cfg.val_fraction = 0;
  cfg.train = {"train_*.bin", "train_0.bin"};
  EXPECT_KVS_ERROR(ShardDataset(cfg, 10, 256, 1, dir),
                   "data.shards.train: " + dir + "/train_0.bin is matched by \"train_*.bin\" and by \"train_0.bin\": "
                   "it would be read twice");
  fs::create_directories(dir + "/sub");
  std::error_code ec;
  fs::create_symlink(dir + "/train_1.bin", dir + "/sub/link.bin", ec);
  cfg.train = {"train_*.bin", "sub/link.bin"};  // the same file by another name
  EXPECT_KVS_ERROR(ShardDataset(cfg, 10, 256, 1, dir), "sub/link.bin is matched by", "it would be read twice");
  fs::create_directories(dir + "/train_x.bin");
  cfg.train = {"train_*.bin"};
  EXPECT_KVS_ERROR(ShardDataset(cfg, 10, 256, 1, dir),
                   "data.shards.train: " + dir + "/train_x.bin (matched by \"train_*.bin\") is not a regular file");
  fs::remove(dir + "/train_x.bin");
  EXPECT_EQ(ShardDataset(cfg, 10, 256, 1, dir).size(Split::Train), 7u);
}

// A split's content_id follows what it reads: the manifest's sha256 of each
// file (else its name and size) and the range; the same files elsewhere give
// the same id.
TEST(DataShardDataset, ContentIdFollowsTheShardsContents) {
  const std::string a = temp_dir("content_a"), b = temp_dir("content_b");
  for (const std::string& d : {a, b}) write_shard(d + "/train_0.bin", std::vector<uint32_t>(40, 7), 2);
  auto manifest = [](const std::string& d, const std::string& sha) {
    std::ofstream(d + "/manifest.json")
        << nlohmann::json{{"shards", {{"train_0.bin", {{"tokens", 40}, {"sha256", sha}}}}}}.dump();
  };
  ShardDataConfig cfg;
  cfg.train = {"train_0.bin"};
  cfg.val_fraction = 0.3;
  const std::string plain = ShardDataset(cfg, 10, 256, 1, a).content_id(Split::Train);
  EXPECT_EQ(plain.size(), 64u);
  EXPECT_EQ(ShardDataset(cfg, 10, 256, 1, b).content_id(Split::Train), plain);  // same name and size elsewhere
  EXPECT_NE(ShardDataset(cfg, 10, 256, 1, a).content_id(Split::Val), plain);
  manifest(a, "aa");
  manifest(b, "bb");
  const std::string in_a = ShardDataset(cfg, 10, 256, 1, a).content_id(Split::Train);
  EXPECT_NE(in_a, plain);
  EXPECT_NE(ShardDataset(cfg, 10, 256, 1, b).content_id(Split::Train), in_a);  // other recorded contents
  manifest(b, "aa");
  EXPECT_EQ(ShardDataset(cfg, 10, 256, 1, b).content_id(Split::Train), in_a);
  cfg.val_fraction = 0.35;  // the stream's end moves, no training window does: the same id
  EXPECT_EQ(ShardDataset(cfg, 10, 256, 1, b).content_id(Split::Train), in_a);
  cfg.val_fraction = 0.5;  // another range of the same file
  EXPECT_NE(ShardDataset(cfg, 10, 256, 1, b).content_id(Split::Train), in_a);
}

// Shards against their manifest.json (both formats: data prepare's "splits"
// and prepare_byte_shards.py's "shards"): a listed shard the pattern would
// match but that is missing (a partial copy), or one whose token count
// changed, is an error naming it; a narrower pattern is a choice, not a loss;
// a file the manifest does not list is only a warning.
TEST(DataShardDataset, ShardsAreCheckedAgainstTheirManifest) {
  const std::string dir = temp_dir("manifest");
  for (const char* f : {"train_0.bin", "train_1.bin", "train_2.bin", "val_0.bin"})
    write_shard(dir + "/" + f, std::vector<uint32_t>(40, 7), 2);
  const nlohmann::json shard = {{"tokens", 40}, {"sha256", ""}};
  nlohmann::json prepared = {
      {"splits",
       {{"train", {{"shards", {{{"file", "train_0.bin"}, {"tokens", 40}}, {{"file", "train_1.bin"}, {"tokens", 40}},
                               {{"file", "train_2.bin"}, {"tokens", 40}}}}}},
        {"val", {{"shards", {{{"file", "val_0.bin"}, {"tokens", 40}}}}}}}}};
  const nlohmann::json scripted = {
      {"shards", {{"train_0.bin", shard}, {"train_1.bin", shard}, {"train_2.bin", shard}, {"val_0.bin", shard}}}};
  for (const nlohmann::json& manifest : {prepared, scripted}) {
    std::ofstream(dir + "/manifest.json") << manifest.dump();
    ShardDataConfig cfg;
    cfg.train = {"train_*.bin"};
    cfg.val = {"val_*.bin"};
    EXPECT_EQ(ShardDataset(cfg, 10, 256, 1, dir).size(Split::Train), 11u);
    fs::rename(dir + "/train_1.bin", dir + "/moved.bin");
    EXPECT_KVS_ERROR(ShardDataset(cfg, 10, 256, 1, dir),
                     "data.shards.train: " + dir + "/train_1.bin is missing: " + dir +
                         "/manifest.json lists it (40 tokens) among the shards \"" + dir + "/train_*.bin\" matches");
    cfg.train = {"train_0.bin", "train_2.bin"};  // asked for two of them: fine
    EXPECT_EQ(ShardDataset(cfg, 10, 256, 1, dir).size(Split::Train), 7u);
    fs::rename(dir + "/moved.bin", dir + "/train_1.bin");
    write_shard(dir + "/train_2.bin", std::vector<uint32_t>(30, 7), 2);
    EXPECT_KVS_ERROR(ShardDataset(cfg, 10, 256, 1, dir),
                     "data.shards.train: " + dir + "/train_2.bin holds 30 tokens, but " + dir +
                         "/manifest.json records 40: the shard changed since data prepare wrote it");
    write_shard(dir + "/train_2.bin", std::vector<uint32_t>(40, 7), 2);
    write_shard(dir + "/train_9.bin", std::vector<uint32_t>(40, 7), 2);  // not listed: read, with a warning
    cfg.train = {"train_*.bin"};
    EXPECT_EQ(ShardDataset(cfg, 10, 256, 1, dir).size(Split::Train), 15u);
    fs::remove(dir + "/train_9.bin");
  }
}

// The Python corpus script writes shards the C++ reader accepts, byte for byte.
TEST(DataShardDataset, PrepareByteShardsScriptOutputReads) {
  if (std::system("/usr/bin/python3 -c pass >/dev/null 2>&1") != 0) GTEST_SKIP() << "no /usr/bin/python3";
  const std::string dir = temp_dir("script");
  std::string text_a = "The quick brown fox jumps over the lazy dog.\n", text_b;
  for (int i = 0; i < 40; ++i) text_b += "Line " + std::to_string(i) + " of the second document.\n";
  { std::ofstream(dir + "/a.txt") << text_a; }
  { std::ofstream(dir + "/b.txt") << text_b; }
  const std::string cmd = std::string("/usr/bin/python3 ") + kvs::test::source_dir() +
                          "/scripts/prepare_byte_shards.py --input '" + dir + "/*.txt' --out " + dir +
                          "/out --val-fraction 0.1 > " + dir + "/log.txt 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    const std::vector<uint8_t> log = read_bytes(dir + "/log.txt");
    FAIL() << "prepare_byte_shards.py failed: " << std::string(log.begin(), log.end());
  }
  const std::string stream = text_a + std::string(1, '\0') + text_b;
  const size_t n_val = static_cast<size_t>(stream.size() * 0.1);
  ShardFile train(dir + "/out/train_000.bin"), val(dir + "/out/val_000.bin");
  ASSERT_EQ(train.size(), stream.size() - n_val);
  ASSERT_EQ(val.size(), n_val);
  for (uint64_t i = 0; i < train.size(); ++i) ASSERT_EQ(train.token(i), static_cast<uint8_t>(stream[i]));
  for (uint64_t i = 0; i < val.size(); ++i) ASSERT_EQ(val.token(i), static_cast<uint8_t>(stream[train.size() + i]));
  EXPECT_TRUE(fs::exists(dir + "/out/manifest.json"));

  ShardDataConfig cfg;
  cfg.train = {"out/train_*.bin"};
  cfg.val = {"out/val_*.bin"};
  ShardDataset ds(cfg, 16, 256, 1, dir);
  const Seq s = get_seq(ds, Split::Val, 0, 16);
  EXPECT_EQ(s.in[0], static_cast<uint8_t>(stream[train.size()]));

  // --max-bytes one past the first document: no separator without a byte of the next one after
  // it, and only the first document counted.
  const std::string cut = std::string("/usr/bin/python3 ") + kvs::test::source_dir() +
                          "/scripts/prepare_byte_shards.py --input '" + dir + "/*.txt' --out " + dir +
                          "/cut --val-fraction 0.1 --max-bytes " + std::to_string(text_a.size() + 1) + " > " + dir +
                          "/log.txt 2>&1";
  ASSERT_EQ(std::system(cut.c_str()), 0);
  ShardFile cut_train(dir + "/cut/train_000.bin"), cut_val(dir + "/cut/val_000.bin");
  EXPECT_EQ(cut_train.size() + cut_val.size(), text_a.size());
  EXPECT_EQ(cut_val.token(cut_val.size() - 1), static_cast<uint8_t>(text_a.back()));
  const nlohmann::json manifest = nlohmann::json::parse(std::ifstream(dir + "/cut/manifest.json"));
  EXPECT_EQ(manifest.at("documents"), 1);
}
