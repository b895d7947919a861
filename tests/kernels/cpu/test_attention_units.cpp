// CPU attention backward: its two ways of spreading work over threads (units
// per KV head, units per row and key block; attention.h) give the same bits
// for every position shape, with and without documents, with the row deltas
// given or computed, for every set of gradients asked, adding or
// overwriting, on any thread count; and the rule that picks one.
#include <gtest/gtest.h>
#include <omp.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops_test_util.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;
namespace attn = kvs::cpu::detail::attn;

struct UnitShape {
  const char* name;
  int B, Tq, Tk, Hq, Hkv, D, q_pos0, k_pos0;
};

// Every third query's document starts one key later; in sequence 1 the
// first half of the queries start at the middle key.
std::vector<int32_t> doc_starts(const UnitShape& s) {
  std::vector<int32_t> ds((size_t)s.B * s.Tq, INT_MIN);
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.Tq; ++t)
      ds[(size_t)b * s.Tq + t] = s.k_pos0 + (b == 1 && t < s.Tq / 2 ? s.Tk / 2 : (t % 3 == 2 ? 1 : 0));
  return ds;
}

template <class T> struct Problem {
  UnitShape s;
  std::vector<T> q, k, v, dout, out, att, delta;
  Problem(const UnitShape& sh, const int32_t* doc, uint64_t seed) : s(sh) {
    auto cast = [](const Vec& x) { return std::vector<T>(x.begin(), x.end()); };
    q = cast(randn((size_t)s.B * s.Tq * s.Hq * s.D, seed, 1.5));
    k = cast(randn((size_t)s.B * s.Tk * s.Hkv * s.D, seed + 1, 1.5));
    v = cast(randn(k.size(), seed + 2));
    dout = cast(randn(q.size(), seed + 3));
    out.resize(q.size());
    att.resize((size_t)s.B * s.Hq * s.Tq * s.Tk);
    attention_forward(out.data(), att.data(), nullptr, q.data(), k.data(), v.data(), s.B, s.Tq, s.Tk, s.Hq, s.Hkv,
                      s.D, s.q_pos0, s.k_pos0, doc);
    delta.resize((size_t)s.B * s.Hq * s.Tq);
    attention_row_delta(delta.data(), dout.data(), out.data(), s.B, s.Tq, s.Hq, s.D);
  }
  // The gradients asked (mask bit 0: dq, 1: dk, 2: dv), starting from `fill`.
  struct Grads {
    std::vector<T> dq, dk, dv;
  };
  Grads backward(attn::Units units, int mask, bool given_delta, bool overwrite, T fill) const {
    Grads g{std::vector<T>(q.size(), fill), std::vector<T>(k.size(), fill), std::vector<T>(v.size(), fill)};
    attn::backward<T>(mask & 1 ? g.dq.data() : nullptr, mask & 2 ? g.dk.data() : nullptr,
                      mask & 4 ? g.dv.data() : nullptr, dout.data(), q.data(), k.data(), v.data(), att.data(), s.B,
                      s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_pos0 - s.k_pos0, given_delta ? delta.data() : nullptr,
                      overwrite, units);
    return g;
  }
};

template <class T> void expect_same_bits(const UnitShape& s, const int32_t* doc) {
  const Problem<T> p(s, doc, 4100);
  const int threads_before = omp_get_max_threads();
  for (const int mask : {7, 1, 2, 4, 6})
    for (const bool given_delta : {false, true})
      for (const bool overwrite : {false, true}) {
        // Adding into nonzero gradients checks the add; overwriting NaN checks that every element is written.
        const T fill = overwrite ? T(NAN) : T(0.25);
        SCOPED_TRACE("gradients " + std::to_string(mask) + (given_delta ? ", delta given" : "") +
                     (overwrite ? ", overwrite" : ""));
        const auto want = p.backward(attn::Units::kPerKvHead, mask, given_delta, overwrite, fill);
        for (const int threads : {1, 2, 3}) {
          SCOPED_TRACE(std::to_string(threads) + " threads");
          omp_set_num_threads(threads);
          const auto got = p.backward(attn::Units::kPerBlock, mask, given_delta, overwrite, fill);
          if (mask & 1) {
            EXPECT_EQ(std::memcmp(got.dq.data(), want.dq.data(), want.dq.size() * sizeof(T)), 0) << "dq";
          }
          if (mask & 2) {
            EXPECT_EQ(std::memcmp(got.dk.data(), want.dk.data(), want.dk.size() * sizeof(T)), 0) << "dk";
          }
          if (mask & 4) {
            EXPECT_EQ(std::memcmp(got.dv.data(), want.dv.data(), want.dv.size() * sizeof(T)), 0) << "dv";
          }
        }
        omp_set_num_threads(threads_before);
      }
}

class OpsAttentionUnits : public testing::TestWithParam<UnitShape> {};

TEST_P(OpsAttentionUnits, PerBlockEqualsPerKvHeadBitForBit) {
  const std::vector<int32_t> ds = doc_starts(GetParam());
  for (const int32_t* doc : {(const int32_t*)nullptr, ds.data()}) {
    SCOPED_TRACE(doc ? "with documents" : "without documents");
    {
      SCOPED_TRACE("float");
      expect_same_bits<float>(GetParam(), doc);
    }
    {
      SCOPED_TRACE("double");
      expect_same_bits<double>(GetParam(), doc);
    }
  }
}

std::string unit_name(const testing::TestParamInfo<UnitShape>& i) { return i.param.name; }

// The key blocks are 64 keys (kQB): the shapes cross them, end in a partial
// one, have keys before the first query (a later chunk), keys no query sees
// and rows that see no key.
INSTANTIATE_TEST_SUITE_P(
    OpsShapes, OpsAttentionUnits,
    testing::Values(UnitShape{"training_form_three_key_blocks", 2, 150, 150, 4, 2, 8, 0, 0},
                    UnitShape{"one_block", 2, 7, 7, 2, 1, 5, 0, 0},
                    UnitShape{"chunk_after_earlier_keys", 1, 70, 200, 2, 1, 16, 130, 0},
                    UnitShape{"first_rows_see_no_key", 2, 130, 140, 2, 2, 4, 0, 70},
                    UnitShape{"decode_one_query", 2, 1, 129, 4, 2, 4, 128, 0},
                    UnitShape{"wide_head", 1, 100, 100, 2, 1, 64, 0, 0}),
    unit_name);

// Per block when B * Hkv units leave enough threads idle, weighed by the
// per-block form's extra work.
TEST(OpsAttentionUnitsRule, PerBlockOnlyWhenThePerKvHeadUnitsLeaveThreadsIdle) {
  EXPECT_FALSE(attn::backward_per_block(16, 1));  // one thread: never
  EXPECT_FALSE(attn::backward_per_block(1, 1));
  EXPECT_FALSE(attn::backward_per_block(16, 2));  // lm-small at 8 x 256 on 2 threads: all busy
  EXPECT_FALSE(attn::backward_per_block(16, 16));
  EXPECT_FALSE(attn::backward_per_block(32, 16));
  EXPECT_TRUE(attn::backward_per_block(1, 2));  // micro-batch 1, one KV head
  EXPECT_TRUE(attn::backward_per_block(4, 16));  // lm-4x at 1 x 2048 on 16 threads
  EXPECT_TRUE(attn::backward_per_block(16, 24));  // 16 x 1.4 < 24
  EXPECT_TRUE(attn::backward_per_block(17, 16));  // a second round for one unit
}

}  // namespace
