// CPU attention, general form: Tq queries against Tk keys at absolute positions
// (decoding, prefill chunks, context parallelism). The forward and lse against
// textbook attention, the backward against finite differences, float vs double,
// rows that see no key, and the last Tq queries against the rows of the full
// causal attention.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops_test_util.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;

struct PosShape {
  const char* name;
  int B, Tq, Tk, Hq, Hkv, D, q_pos0, k_pos0;
};

size_t qi(const PosShape& s, int b, int t, int h) { return (((size_t)b * s.Tq + t) * s.Hq + h) * s.D; }
size_t ki(const PosShape& s, int b, int u, int h) { return (((size_t)b * s.Tk + u) * s.Hkv + h) * s.D; }

// Document starts in absolute positions, [B, Tq], placed relative to the
// keys: in sequence 0 every third query's document starts at the second key
// (the first one masked), the others' at the first key; in sequence 1 the first half of the queries start at the
// middle key and the others after the last key (those rows see nothing).
std::vector<int32_t> doc_starts(const PosShape& s) {
  std::vector<int32_t> ds((size_t)s.B * s.Tq, INT_MIN);
  for (int t = 0; t < s.Tq; ++t) {
    ds[t] = s.k_pos0 + (t % 3 == 2 ? 1 : 0);
    if (s.B > 1) ds[(size_t)s.Tq + t] = s.k_pos0 + (t < s.Tq / 2 ? s.Tk / 2 : s.Tk);
  }
  return ds;
}

// Textbook masked attention in double: out, att [B, Hq, Tq, Tk], lse [B, Hq, Tq].
void naive(Vec& out, Vec& att, Vec& lse, const Vec& q, const Vec& k, const Vec& v, const PosShape& s,
           const int32_t* doc) {
  const int G = s.Hq / s.Hkv;
  out.assign((size_t)s.B * s.Tq * s.Hq * s.D, 0.0);
  att.assign((size_t)s.B * s.Hq * s.Tq * s.Tk, 0.0);
  lse.assign((size_t)s.B * s.Hq * s.Tq, -std::numeric_limits<double>::infinity());
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.Hq; ++h)
      for (int t = 0; t < s.Tq; ++t) {
        const int lo = doc ? doc[(size_t)b * s.Tq + t] : INT_MIN;
        std::vector<double> sc(s.Tk);
        std::vector<bool> vis(s.Tk);
        double mx = -1e300;
        bool any = false;
        for (int u = 0; u < s.Tk; ++u) {
          const int kp = s.k_pos0 + u;
          vis[u] = kp <= s.q_pos0 + t && kp >= lo;
          if (!vis[u]) continue;
          double d = 0;
          for (int i = 0; i < s.D; ++i) d += q[qi(s, b, t, h) + i] * k[ki(s, b, u, h / G) + i];
          sc[u] = d / std::sqrt((double)s.D);
          mx = std::max(mx, sc[u]);
          any = true;
        }
        if (!any) continue;
        double z = 0;
        for (int u = 0; u < s.Tk; ++u)
          if (vis[u]) z += std::exp(sc[u] - mx);
        lse[((size_t)b * s.Hq + h) * s.Tq + t] = mx + std::log(z);
        for (int u = 0; u < s.Tk; ++u) {
          if (!vis[u]) continue;
          const double p = std::exp(sc[u] - mx) / z;
          att[(((size_t)b * s.Hq + h) * s.Tq + t) * s.Tk + u] = p;
          for (int i = 0; i < s.D; ++i) out[qi(s, b, t, h) + i] += p * v[ki(s, b, u, h / G) + i];
        }
      }
}

struct PosData {
  PosShape s;
  Vec q, k, v, R;
  PosData(const PosShape& sh, uint64_t seed) : s(sh) {
    q = randn((size_t)s.B * s.Tq * s.Hq * s.D, seed, 1.5);
    k = randn((size_t)s.B * s.Tk * s.Hkv * s.D, seed + 1, 1.5);
    v = randn((size_t)s.B * s.Tk * s.Hkv * s.D, seed + 2);
    R = randn(q.size(), seed + 3);
  }
  size_t natt() const { return (size_t)s.B * s.Hq * s.Tq * s.Tk; }
  size_t nlse() const { return (size_t)s.B * s.Hq * s.Tq; }
};

// lse rows: equal infinities, close finite values.
void expect_lse_close(const Vec& got, const Vec& ref, double tol) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(ref[i]))
      EXPECT_EQ(got[i], ref[i]) << "lse row " << i;
    else
      EXPECT_NEAR(got[i], ref[i], tol) << "lse row " << i;
  }
}

class OpsAttentionPositions : public testing::TestWithParam<PosShape> {};

TEST_P(OpsAttentionPositions, ForwardAndLseMatchNaive) {
  const PosShape s = GetParam();
  PosData a(s, 2000);
  const std::vector<int32_t> ds = doc_starts(s);
  for (const int32_t* doc : {(const int32_t*)nullptr, ds.data()}) {
    SCOPED_TRACE(doc ? "with documents" : "without documents");
    Vec out(a.q.size(), std::nan("")), att(a.natt(), std::nan("")), lse(a.nlse(), std::nan(""));
    Vec ref_out, ref_att, ref_lse;
    attention_forward(out.data(), att.data(), lse.data(), a.q.data(), a.k.data(), a.v.data(), s.B, s.Tq, s.Tk, s.Hq,
                      s.Hkv, s.D, s.q_pos0, s.k_pos0, doc);
    naive(ref_out, ref_att, ref_lse, a.q, a.k, a.v, s, doc);
    EXPECT_LT(rel_err(out, ref_out), 1e-13);
    EXPECT_LT(rel_err(att, ref_att), 1e-13);
    expect_lse_close(lse, ref_lse, 1e-12);
    // Exact zeros where a key is not visible (the backward relies on them).
    for (size_t i = 0; i < att.size(); ++i)
      if (ref_att[i] == 0.0) {
        ASSERT_EQ(att[i], 0.0) << "att element " << i;
      }
  }
}

TEST_P(OpsAttentionPositions, BackwardMatchesFiniteDifferences) {
  const PosShape s = GetParam();
  PosData a(s, 2100);
  const std::vector<int32_t> ds = doc_starts(s);
  for (const int32_t* doc : {(const int32_t*)nullptr, ds.data()}) {
    SCOPED_TRACE(doc ? "with documents" : "without documents");
    Vec out(a.q.size()), att(a.natt());
    auto f = [&] {
      attention_forward(out.data(), att.data(), nullptr, a.q.data(), a.k.data(), a.v.data(), s.B, s.Tq, s.Tk, s.Hq,
                        s.Hkv, s.D, s.q_pos0, s.k_pos0, doc);
      return dot(out, a.R);
    };
    f();
    Vec dq(a.q.size(), 0.0), dk(a.k.size(), 0.0), dv(a.v.size(), 0.0);
    attention_backward(dq.data(), dk.data(), dv.data(), a.R.data(), a.q.data(), a.k.data(), a.v.data(),
                       att.data(), s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_pos0, s.k_pos0);
    expect_grad_close(dq, numgrad(a.q, f), "dq");
    expect_grad_close(dk, numgrad(a.k, f), "dk");
    expect_grad_close(dv, numgrad(a.v, f), "dv");

    // Accumulation, and gradients requested one at a time give the same values.
    f();
    Vec q0 = randn(dq.size(), 2110), k0 = randn(dk.size(), 2111), v0 = randn(dv.size(), 2112);
    Vec dq2 = q0, dk2 = k0, dv2 = v0;
    attention_backward(dq2.data(), (double*)nullptr, (double*)nullptr, a.R.data(), a.q.data(),
                       a.k.data(), a.v.data(), att.data(), s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_pos0, s.k_pos0);
    attention_backward((double*)nullptr, dk2.data(), (double*)nullptr, a.R.data(), a.q.data(),
                       a.k.data(), a.v.data(), att.data(), s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_pos0, s.k_pos0);
    attention_backward((double*)nullptr, (double*)nullptr, dv2.data(), a.R.data(), a.q.data(),
                       a.k.data(), a.v.data(), att.data(), s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_pos0, s.k_pos0);
    EXPECT_LT(rel_err(dq2, add(q0, dq)), 1e-13);
    EXPECT_LT(rel_err(dk2, add(k0, dk)), 1e-13);
    EXPECT_LT(rel_err(dv2, add(v0, dv)), 1e-13);
  }
}

TEST_P(OpsAttentionPositions, FloatAgreesWithDouble) {
  const PosShape s = GetParam();
  PosData a(s, 2200);
  const std::vector<int32_t> ds = doc_starts(s);
  Vec out(a.q.size()), att(a.natt()), lse(a.nlse());
  Vec dq(a.q.size(), 0.0), dk(a.k.size(), 0.0), dv(a.v.size(), 0.0);
  attention_forward(out.data(), att.data(), lse.data(), a.q.data(), a.k.data(), a.v.data(), s.B, s.Tq, s.Tk, s.Hq,
                    s.Hkv, s.D, s.q_pos0, s.k_pos0, ds.data());
  attention_backward(dq.data(), dk.data(), dv.data(), a.R.data(), a.q.data(), a.k.data(), a.v.data(),
                     att.data(), s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_pos0, s.k_pos0);
  FVec qf = to_float(a.q), kf = to_float(a.k), vf = to_float(a.v), Rf = to_float(a.R);
  FVec of(out.size()), attf(att.size()), lsef(lse.size()), dqf(dq.size(), 0.f),
      dkf(dk.size(), 0.f), dvf(dv.size(), 0.f);
  attention_forward(of.data(), attf.data(), lsef.data(), qf.data(), kf.data(), vf.data(), s.B, s.Tq, s.Tk, s.Hq, s.Hkv,
                    s.D, s.q_pos0, s.k_pos0, ds.data());
  attention_backward(dqf.data(), dkf.data(), dvf.data(), Rf.data(), qf.data(), kf.data(), vf.data(),
                     attf.data(), s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_pos0, s.k_pos0);
  EXPECT_LT(rel_err(to_double(of), out), kFloatTol);
  EXPECT_LT(rel_err(to_double(attf), att), kFloatTol);
  expect_lse_close(to_double(lsef), lse, 1e-5);
  EXPECT_LT(rel_err(to_double(dqf), dq), kFloatTol);
  EXPECT_LT(rel_err(to_double(dkf), dk), kFloatTol);
  EXPECT_LT(rel_err(to_double(dvf), dv), kFloatTol);
}

// overwrite: dq, dk and dv are written whatever they held (NaN here), with the
// bits of adding into zeros, also for keys no query sees and rows that see no key.
void expect_overwrite_equals_adding_into_zeros(const PosShape& s, const int32_t* doc) {
  PosData a(s, 2300);
  FVec qf = to_float(a.q), kf = to_float(a.k), vf = to_float(a.v), Rf = to_float(a.R);
  FVec of(qf.size()), attf(a.natt());
  attention_forward(of.data(), attf.data(), nullptr, qf.data(), kf.data(), vf.data(), s.B, s.Tq, s.Tk, s.Hq, s.Hkv,
                    s.D, s.q_pos0, s.k_pos0, doc);
  FVec dq(qf.size(), 0.f), dk(kf.size(), 0.f), dv(vf.size(), 0.f);
  attention_backward(dq.data(), dk.data(), dv.data(), Rf.data(), qf.data(), kf.data(), vf.data(), attf.data(), s.B,
                     s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_pos0, s.k_pos0);
  FVec oq(dq.size(), std::nanf("")), ok(dk.size(), std::nanf("")), ov(dv.size(), std::nanf(""));
  attention_backward(oq.data(), ok.data(), ov.data(), Rf.data(), qf.data(), kf.data(), vf.data(), attf.data(), s.B,
                     s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_pos0, s.k_pos0, nullptr, /*overwrite=*/true);
  EXPECT_EQ(oq, dq);
  EXPECT_EQ(ok, dk);
  EXPECT_EQ(ov, dv);
}

TEST_P(OpsAttentionPositions, OverwriteEqualsAddingIntoZeros) {
  const std::vector<int32_t> ds = doc_starts(GetParam());
  for (const int32_t* doc : {(const int32_t*)nullptr, ds.data()}) {
    SCOPED_TRACE(doc ? "with documents" : "without documents");
    expect_overwrite_equals_adding_into_zeros(GetParam(), doc);
  }
}

// Keys at 66..71, queries at 0..69: the first 64-row block sees no key at all.
TEST(OpsAttentionPositionsRows, OverwriteWritesABlockThatSeesNoKey) {
  expect_overwrite_equals_adding_into_zeros({"first_block_sees_no_key", 2, 70, 6, 2, 1, 4, 0, 66}, nullptr);
}

std::string pos_name(const testing::TestParamInfo<PosShape>& i) { return i.param.name; }

// D from 4 to 32; Tq = 70 crosses the 64-row blocks and Tk = 75 the 64-key
// blocks (kQB). (No 32-key tiles any more, whatever a shape's name says.)
INSTANTIATE_TEST_SUITE_P(
    OpsShapes, OpsAttentionPositions,
    testing::Values(PosShape{"decode_one_query", 2, 1, 9, 4, 2, 4, 8, 0},
                    PosShape{"prefill_chunk", 2, 5, 12, 2, 1, 6, 7, 0},
                    PosShape{"earlier_keys_only", 2, 6, 5, 2, 2, 4, 10, 3},
                    PosShape{"keys_after_first_queries", 2, 6, 7, 2, 1, 5, 0, 3},
                    PosShape{"shifted_diagonal", 2, 7, 7, 2, 2, 4, 50, 50},
                    PosShape{"chunk_across_key_tiles", 2, 3, 36, 2, 1, 32, 33, 0},
                    PosShape{"rows_across_query_blocks", 1, 70, 75, 2, 1, 4, 5, 0}),
    pos_name);

TEST(OpsAttentionPositionsRows, RowWithoutVisibleKeysIsZeroWithLseMinusInf) {
  // Keys at positions 4..8, queries at 0..5: rows 0..3 see nothing.
  const PosShape s{"", 1, 6, 5, 2, 1, 4, 0, 4};
  PosData a(s, 2300);
  Vec out(a.q.size(), std::nan("")), att(a.natt(), std::nan("")), lse(a.nlse(), std::nan(""));
  attention_forward(out.data(), att.data(), lse.data(), a.q.data(), a.k.data(), a.v.data(), s.B, s.Tq, s.Tk, s.Hq,
                    s.Hkv, s.D, s.q_pos0, s.k_pos0);
  Vec dq(a.q.size(), 0.0);
  attention_backward(dq.data(), (double*)nullptr, (double*)nullptr, a.R.data(), a.q.data(), a.k.data(),
                     a.v.data(), att.data(), s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_pos0, s.k_pos0);
  for (int h = 0; h < s.Hq; ++h)
    for (int t = 0; t < s.Tq; ++t) {
      const bool empty = t < 4;
      EXPECT_EQ(std::isinf(lse[(size_t)h * s.Tq + t]) && lse[(size_t)h * s.Tq + t] < 0, empty) << "row " << t;
      for (int u = 0; u < s.Tk; ++u)
        if (empty) {
          EXPECT_EQ(att[((size_t)h * s.Tq + t) * s.Tk + u], 0.0);
        }
      for (int d = 0; d < s.D; ++d) {
        if (!empty) continue;
        EXPECT_EQ(out[qi(s, 0, t, h) + d], 0.0);
        EXPECT_EQ(dq[qi(s, 0, t, h) + d], 0.0);
      }
    }
}

// The last Tq of T queries against all T keys (q_pos0 = T - Tq, k_pos0 = 0)
// are those rows of the full causal attention; with the gradient only on those
// rows, dq is the full dq's rows and dk/dv the full dk/dv. The training form
// shifted to any common position is the training form itself.
TEST(OpsAttentionPositionsRows, LastQueriesEqualRowsOfFullAttention) {
  struct Case {
    int B, T, Tq, Hq, Hkv, D;
  };
  for (const Case c : {Case{2, 9, 3, 4, 2, 8}, Case{1, 70, 5, 2, 1, 32}, Case{2, 70, 66, 2, 2, 4}}) {
    for (bool docs : {false, true}) {
      SCOPED_TRACE(fmt::format("B{} T{} Tq{} D{}{}", c.B, c.T, c.Tq, c.D, docs ? " with documents" : ""));
      const int T = c.T, Tq = c.Tq, q0 = T - Tq;
      const PosShape full{"", c.B, T, T, c.Hq, c.Hkv, c.D, 0, 0};
      PosData a(full, 2400 + T);
      // Documents: sequence b starts a new one at T/2 + b.
      std::vector<int32_t> full_ds((size_t)c.B * T), last_ds((size_t)c.B * Tq);
      for (int b = 0; b < c.B; ++b)
        for (int t = 0; t < T; ++t) full_ds[(size_t)b * T + t] = t < T / 2 + b ? 0 : T / 2 + b;
      for (int b = 0; b < c.B; ++b)
        for (int t = 0; t < Tq; ++t) last_ds[(size_t)b * Tq + t] = full_ds[(size_t)b * T + q0 + t];
      const int32_t* fdoc = docs ? full_ds.data() : nullptr;
      const int32_t* ldoc = docs ? last_ds.data() : nullptr;

      const size_t row = (size_t)c.Hq * c.D;
      auto last_rows = [&](const Vec& x) {  // rows [q0, T) of each sequence of [B, T, Hq, D]
        Vec r((size_t)c.B * Tq * row);
        for (int b = 0; b < c.B; ++b)
          std::copy_n(x.begin() + ((size_t)b * T + q0) * row, (size_t)Tq * row, r.begin() + (size_t)b * Tq * row);
        return r;
      };
      auto last_att_rows = [&](const Vec& x, size_t width) {  // rows [q0, T) of each [T, width] slice
        Vec r((size_t)c.B * c.Hq * Tq * width);
        for (int bh = 0; bh < c.B * c.Hq; ++bh)
          std::copy_n(x.begin() + ((size_t)bh * T + q0) * width, (size_t)Tq * width,
                      r.begin() + (size_t)bh * Tq * width);
        return r;
      };
      const Vec q_last = last_rows(a.q);
      Vec R = a.R;  // the gradient on the full output: zero on the first q0 rows
      for (int b = 0; b < c.B; ++b) std::fill_n(R.begin() + (size_t)b * T * row, (size_t)q0 * row, 0.0);
      const Vec R_last = last_rows(R);

      const size_t natt_full = (size_t)c.B * c.Hq * T * T, natt_last = (size_t)c.B * c.Hq * Tq * T;
      Vec fo(a.q.size()), fa(natt_full), fl((size_t)c.B * c.Hq * T);
      Vec lo((size_t)c.B * Tq * row), la(natt_last), ll((size_t)c.B * c.Hq * Tq);
      attention_forward(fo.data(), fa.data(), fl.data(), a.q.data(), a.k.data(), a.v.data(), c.B, T, T, c.Hq, c.Hkv,
                        c.D, 0, 0, fdoc);
      attention_forward(lo.data(), la.data(), ll.data(), q_last.data(), a.k.data(), a.v.data(), c.B, Tq, T, c.Hq,
                        c.Hkv, c.D, q0, 0, ldoc);
      EXPECT_LT(rel_err(lo, last_rows(fo)), 1e-14);
      EXPECT_LT(rel_err(la, last_att_rows(fa, T)), 1e-14);
      EXPECT_LT(rel_err(ll, last_att_rows(fl, 1)), 1e-14);

      Vec fdq(a.q.size(), 0.0), fdk(a.k.size(), 0.0), fdv(a.v.size(), 0.0);
      Vec ldq(q_last.size(), 0.0), ldk(a.k.size(), 0.0), ldv(a.v.size(), 0.0);
      attention_backward(fdq.data(), fdk.data(), fdv.data(), R.data(), a.q.data(), a.k.data(),
                         a.v.data(), fa.data(), c.B, T, T, c.Hq, c.Hkv, c.D, 0, 0);
      attention_backward(ldq.data(), ldk.data(), ldv.data(), R_last.data(), q_last.data(), a.k.data(),
                         a.v.data(), la.data(), c.B, Tq, T, c.Hq, c.Hkv, c.D, q0, 0);
      EXPECT_LT(rel_err(ldq, last_rows(fdq)), 1e-14);
      EXPECT_LT(rel_err(ldk, fdk), 1e-14);
      EXPECT_LT(rel_err(ldv, fdv), 1e-14);

      // The training overloads are the general form at positions 0, and any
      // common shift of both positions (documents shifted alike) changes nothing.
      Vec to(a.q.size()), ta(natt_full), so(a.q.size()), sa(natt_full);
      attention_forward(to.data(), ta.data(), a.q.data(), a.k.data(), a.v.data(), c.B, T, c.Hq, c.Hkv, c.D, fdoc);
      EXPECT_EQ(to, fo);
      EXPECT_EQ(ta, fa);
      std::vector<int32_t> shifted_ds = full_ds;
      for (int32_t& d : shifted_ds) d += 1000;
      attention_forward(so.data(), sa.data(), nullptr, a.q.data(), a.k.data(), a.v.data(), c.B, T, T, c.Hq, c.Hkv,
                        c.D, 1000, 1000, docs ? shifted_ds.data() : nullptr);
      EXPECT_EQ(so, fo);
      EXPECT_EQ(sa, fa);
      Vec tdq(a.q.size(), 0.0), tdk(a.k.size(), 0.0), tdv(a.v.size(), 0.0);
      attention_backward(tdq.data(), tdk.data(), tdv.data(), R.data(), a.q.data(), a.k.data(),
                         a.v.data(), fa.data(), c.B, T, c.Hq, c.Hkv, c.D);
      EXPECT_EQ(tdq, fdq);
      EXPECT_EQ(tdk, fdk);
      EXPECT_EQ(tdv, fdv);
    }
  }
}

// Keys split into two blocks (context parallelism's ring): each block's
// forward with its lse, merged by log-sum-exp, is the attention over all keys;
// each block's probabilities rescaled by exp(lse_block - lse) are the rows of
// the full att, and the backward of each block with the whole row's delta
// (attention_row_delta) sums to the full backward.
TEST(OpsAttentionPositionsRows, KeyBlocksMergeByLseAndBackwardWithRowDelta) {
  const int B = 2, Tq = 6, Hq = 4, Hkv = 2, D = 8, q0 = 10;
  const int T1 = 7, T2 = 9, Tk = T1 + T2;  // keys at positions 0..6 and 7..15
  const PosShape full{"", B, Tq, Tk, Hq, Hkv, D, q0, 0};
  PosData a(full, 77);
  const size_t kr = (size_t)Hkv * D, qr = (size_t)Hq * D;
  auto key_rows = [&](const Vec& x, int from, int n) {
    Vec r((size_t)B * n * kr);
    for (int b = 0; b < B; ++b)
      std::copy_n(x.begin() + ((size_t)b * Tk + from) * kr, (size_t)n * kr, r.begin() + (size_t)b * n * kr);
    return r;
  };
  Vec fo(a.q.size()), fa((size_t)B * Hq * Tq * Tk), fl((size_t)B * Hq * Tq);
  attention_forward(fo.data(), fa.data(), fl.data(), a.q.data(), a.k.data(), a.v.data(), B, Tq, Tk, Hq, Hkv, D, q0, 0);
  const Vec k1 = key_rows(a.k, 0, T1), v1 = key_rows(a.v, 0, T1), k2 = key_rows(a.k, T1, T2), v2 = key_rows(a.v, T1, T2);
  Vec o1(a.q.size()), o2(a.q.size()), a1((size_t)B * Hq * Tq * T1), a2((size_t)B * Hq * Tq * T2), l1(fl.size()),
      l2(fl.size());
  attention_forward(o1.data(), a1.data(), l1.data(), a.q.data(), k1.data(), v1.data(), B, Tq, T1, Hq, Hkv, D, q0, 0);
  attention_forward(o2.data(), a2.data(), l2.data(), a.q.data(), k2.data(), v2.data(), B, Tq, T2, Hq, Hkv, D, q0, T1);
  Vec mo(a.q.size());
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int t = 0; t < Tq; ++t) {
        const size_t r = ((size_t)b * Hq + h) * Tq + t;
        const double lse = std::max(l1[r], l2[r]) + std::log(std::exp(l1[r] - std::max(l1[r], l2[r])) +
                                                             std::exp(l2[r] - std::max(l1[r], l2[r])));
        EXPECT_NEAR(lse, fl[r], 1e-12);
        const double w1 = std::exp(l1[r] - lse), w2 = std::exp(l2[r] - lse);
        for (int d = 0; d < D; ++d) {
          const size_t o = ((size_t)b * Tq + t) * qr + (size_t)h * D + d;
          mo[o] = w1 * o1[o] + w2 * o2[o];
        }
        for (int s = 0; s < T1; ++s) a1[r * T1 + s] *= w1;
        for (int s = 0; s < T2; ++s) a2[r * T2 + s] *= w2;
      }
  EXPECT_LT(rel_err(mo, fo), 1e-13);

  Vec fdq(a.q.size(), 0.0), fdk(a.k.size(), 0.0), fdv(a.v.size(), 0.0);
  attention_backward(fdq.data(), fdk.data(), fdv.data(), a.R.data(), a.q.data(), a.k.data(), a.v.data(),
                     fa.data(), B, Tq, Tk, Hq, Hkv, D, q0, 0);
  Vec delta(fl.size());
  attention_row_delta(delta.data(), a.R.data(), fo.data(), B, Tq, Hq, D);
  Vec dq(a.q.size(), 0.0), dk1(k1.size(), 0.0), dv1(v1.size(), 0.0), dk2(k2.size(), 0.0), dv2(v2.size(), 0.0);
  attention_backward(dq.data(), dk1.data(), dv1.data(), a.R.data(), a.q.data(), k1.data(), v1.data(),
                     a1.data(), B, Tq, T1, Hq, Hkv, D, q0, 0, delta.data());
  attention_backward(dq.data(), dk2.data(), dv2.data(), a.R.data(), a.q.data(), k2.data(), v2.data(),
                     a2.data(), B, Tq, T2, Hq, Hkv, D, q0, T1, delta.data());
  EXPECT_LT(rel_err(dq, fdq), 1e-12);
  EXPECT_LT(rel_err(dk1, key_rows(fdk, 0, T1)), 1e-12);
  EXPECT_LT(rel_err(dv1, key_rows(fdv, 0, T1)), 1e-12);
  EXPECT_LT(rel_err(dk2, key_rows(fdk, T1, T2)), 1e-12);
  EXPECT_LT(rel_err(dv2, key_rows(fdv, T1, T2)), 1e-12);
  // Without the whole row's delta the block's own sum is wrong.
  Vec bad(a.q.size(), 0.0);
  attention_backward(bad.data(), dk1.data(), dv1.data(), a.R.data(), a.q.data(), k1.data(), v1.data(),
                     a1.data(), B, Tq, T1, Hq, Hkv, D, q0, 0);
  Vec want1(a.q.size(), 0.0);
  attention_backward(want1.data(), dk1.data(), dv1.data(), a.R.data(), a.q.data(), k1.data(), v1.data(),
                     a1.data(), B, Tq, T1, Hq, Hkv, D, q0, 0, delta.data());
  EXPECT_GT(rel_err(bad, want1), 1e-3);
}

}  // namespace
