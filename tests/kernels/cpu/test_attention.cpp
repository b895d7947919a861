// CPU attention: the forward against textbook attention, the backward against
// central finite differences (double), float vs double agreement, GQA vs
// replicated MHA, the += convention and bit-for-bit determinism.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops_test_util.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;

struct AttnShape {
  int B, T, Hq, Hkv, D;
};

// Textbook causal attention (no tiling), for the forward check.
void naive_attention(Vec& out, Vec& att, const Vec& q, const Vec& k, const Vec& v, AttnShape s) {
  const int G = s.Hq / s.Hkv;
  out.assign((size_t)s.B * s.T * s.Hq * s.D, 0.0);
  att.assign((size_t)s.B * s.Hq * s.T * s.T, 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.Hq; ++h)
      for (int t = 0; t < s.T; ++t) {
        std::vector<double> sc(t + 1);
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          double d = 0;
          for (int i = 0; i < s.D; ++i)
            d += q[(((size_t)b * s.T + t) * s.Hq + h) * s.D + i] * k[(((size_t)b * s.T + u) * s.Hkv + h / G) * s.D + i];
          sc[u] = d / std::sqrt((double)s.D);
          mx = std::max(mx, sc[u]);
        }
        double z = 0;
        for (int u = 0; u <= t; ++u) z += std::exp(sc[u] - mx);
        for (int u = 0; u <= t; ++u) {
          const double p = std::exp(sc[u] - mx) / z;
          att[(((size_t)b * s.Hq + h) * s.T + t) * s.T + u] = p;
          for (int i = 0; i < s.D; ++i)
            out[(((size_t)b * s.T + t) * s.Hq + h) * s.D + i] +=
                p * v[(((size_t)b * s.T + u) * s.Hkv + h / G) * s.D + i];
        }
      }
}

struct AttnData {
  AttnShape s;
  Vec q, k, v, R;
  AttnData(AttnShape sh, uint64_t seed) : s(sh) {
    q = randn((size_t)s.B * s.T * s.Hq * s.D, seed, 1.5);
    k = randn((size_t)s.B * s.T * s.Hkv * s.D, seed + 1, 1.5);
    v = randn((size_t)s.B * s.T * s.Hkv * s.D, seed + 2);
    R = randn(q.size(), seed + 3);
  }
  size_t natt() const { return (size_t)s.B * s.Hq * s.T * s.T; }
};

class OpsAttention : public testing::TestWithParam<AttnShape> {};

TEST_P(OpsAttention, ForwardMatchesNaiveAndProbabilitiesAreCausal) {
  const AttnShape s = GetParam();
  AttnData a(s, 200);
  Vec out(a.q.size()), att(a.natt(), std::nan("")), ref_out, ref_att;
  attention_forward(out.data(), att.data(), a.q.data(), a.k.data(), a.v.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  naive_attention(ref_out, ref_att, a.q, a.k, a.v, s);
  EXPECT_LT(rel_err(out, ref_out), 1e-13);
  EXPECT_LT(rel_err(att, ref_att), 1e-13);
  for (int bh = 0; bh < s.B * s.Hq; ++bh)
    for (int t = 0; t < s.T; ++t) {
      double sum = 0;
      for (int u = 0; u < s.T; ++u) {
        const double p = att[((size_t)bh * s.T + t) * s.T + u];
        if (u > t)
          ASSERT_EQ(p, 0.0) << "above the diagonal";
        else
          sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-13);
    }
}

TEST_P(OpsAttention, BackwardMatchesFiniteDifferences) {
  const AttnShape s = GetParam();
  AttnData a(s, 300);
  Vec out(a.q.size()), att(a.natt());
  auto f = [&] {
    attention_forward(out.data(), att.data(), a.q.data(), a.k.data(), a.v.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
    return dot(out, a.R);
  };
  f();
  Vec dq(a.q.size(), 0.0), dk(a.k.size(), 0.0), dv(a.v.size(), 0.0);
  attention_backward(dq.data(), dk.data(), dv.data(), a.R.data(), a.q.data(), a.k.data(), a.v.data(),
                     att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  expect_grad_close(dq, numgrad(a.q, f), "dq");
  expect_grad_close(dk, numgrad(a.k, f), "dk");
  expect_grad_close(dv, numgrad(a.v, f), "dv");

  // Accumulation, and gradients requested one at a time give the same values.
  f();
  Vec q0 = randn(dq.size(), 310), k0 = randn(dk.size(), 311), v0 = randn(dv.size(), 312);
  Vec dq2 = q0, dk2 = k0, dv2 = v0;
  attention_backward(dq2.data(), (double*)nullptr, (double*)nullptr, a.R.data(), a.q.data(), a.k.data(),
                     a.v.data(), att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  attention_backward((double*)nullptr, dk2.data(), (double*)nullptr, a.R.data(), a.q.data(), a.k.data(),
                     a.v.data(), att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  attention_backward((double*)nullptr, (double*)nullptr, dv2.data(), a.R.data(), a.q.data(), a.k.data(),
                     a.v.data(), att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  EXPECT_LT(rel_err(dq2, add(q0, dq)), 1e-13);
  EXPECT_LT(rel_err(dk2, add(k0, dk)), 1e-13);
  EXPECT_LT(rel_err(dv2, add(v0, dv)), 1e-13);
}

TEST_P(OpsAttention, FloatAgreesWithDouble) {
  const AttnShape s = GetParam();
  AttnData a(s, 400);
  Vec out(a.q.size()), att(a.natt()), dq(a.q.size(), 0.0), dk(a.k.size(), 0.0), dv(a.v.size(), 0.0);
  attention_forward(out.data(), att.data(), a.q.data(), a.k.data(), a.v.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  attention_backward(dq.data(), dk.data(), dv.data(), a.R.data(), a.q.data(), a.k.data(), a.v.data(),
                     att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  FVec qf = to_float(a.q), kf = to_float(a.k), vf = to_float(a.v), Rf = to_float(a.R);
  FVec of(out.size()), attf(att.size()), dqf(dq.size(), 0.f), dkf(dk.size(), 0.f),
      dvf(dv.size(), 0.f);
  attention_forward(of.data(), attf.data(), qf.data(), kf.data(), vf.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  attention_backward(dqf.data(), dkf.data(), dvf.data(), Rf.data(), qf.data(), kf.data(), vf.data(),
                     attf.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  EXPECT_LT(rel_err(to_double(of), out), kFloatTol);
  EXPECT_LT(rel_err(to_double(attf), att), kFloatTol);
  EXPECT_LT(rel_err(to_double(dqf), dq), kFloatTol);
  EXPECT_LT(rel_err(to_double(dkf), dk), kFloatTol);
  EXPECT_LT(rel_err(to_double(dvf), dv), kFloatTol);
}

std::string shape_name(const testing::TestParamInfo<AttnShape>& i) {
  const AttnShape& s = i.param;
  return fmt::format("B{}T{}Hq{}Hkv{}D{}", s.B, s.T, s.Hq, s.Hkv, s.D);
}

// D from 4 to 64; T = 70 crosses the 64-row blocks (kQB); T = 150 and 200 make
// three and four blocks (the folded pairs with and without a middle block).
INSTANTIATE_TEST_SUITE_P(OpsShapes, OpsAttention,
                         testing::Values(AttnShape{2, 5, 2, 2, 4}, AttnShape{1, 6, 2, 2, 8}, AttnShape{2, 7, 4, 2, 6},
                                         AttnShape{1, 5, 4, 2, 8}, AttnShape{1, 7, 4, 1, 5}, AttnShape{1, 6, 2, 1, 64},
                                         AttnShape{1, 70, 2, 1, 4}, AttnShape{1, 34, 2, 1, 32},
                                         AttnShape{1, 150, 2, 1, 4}, AttnShape{1, 200, 1, 1, 4}),
                         shape_name);

TEST(OpsAttentionGqa, SingleKvHeadEqualsMhaWithReplicatedKv) {
  const AttnShape g{2, 9, 3, 1, 8}, m{2, 9, 3, 3, 8};
  AttnData a(g, 500);
  // Replicate the single KV head per query head for the MHA run.
  Vec k3((size_t)m.B * m.T * m.Hkv * m.D), v3(k3.size());
  for (int bt = 0; bt < m.B * m.T; ++bt)
    for (int h = 0; h < m.Hkv; ++h)
      for (int d = 0; d < m.D; ++d) {
        k3[((size_t)bt * m.Hkv + h) * m.D + d] = a.k[(size_t)bt * m.D + d];
        v3[((size_t)bt * m.Hkv + h) * m.D + d] = a.v[(size_t)bt * m.D + d];
      }
  const size_t natt = (size_t)g.B * g.Hq * g.T * g.T;
  Vec og(a.q.size()), attg(natt), om(a.q.size()), attm(natt);
  attention_forward(og.data(), attg.data(), a.q.data(), a.k.data(), a.v.data(), g.B, g.T, g.Hq, g.Hkv, g.D);
  attention_forward(om.data(), attm.data(), a.q.data(), k3.data(), v3.data(), m.B, m.T, m.Hq, m.Hkv, m.D);
  EXPECT_EQ(og, om);
  EXPECT_EQ(attg, attm);
  // Backward: the GQA dk/dv are the sums over the replicated heads' gradients.
  Vec dqg(a.q.size(), 0.0), dkg(a.k.size(), 0.0), dvg(a.v.size(), 0.0);
  Vec dqm(a.q.size(), 0.0), dkm(k3.size(), 0.0), dvm(v3.size(), 0.0);
  attention_backward(dqg.data(), dkg.data(), dvg.data(), a.R.data(), a.q.data(), a.k.data(), a.v.data(),
                     attg.data(), g.B, g.T, g.Hq, g.Hkv, g.D);
  attention_backward(dqm.data(), dkm.data(), dvm.data(), a.R.data(), a.q.data(), k3.data(), v3.data(),
                     attm.data(), m.B, m.T, m.Hq, m.Hkv, m.D);
  EXPECT_LT(rel_err(dqg, dqm), 1e-14);
  Vec dks(a.k.size(), 0.0), dvs(a.v.size(), 0.0);
  for (int bt = 0; bt < m.B * m.T; ++bt)
    for (int h = 0; h < m.Hkv; ++h)
      for (int d = 0; d < m.D; ++d) {
        dks[(size_t)bt * m.D + d] += dkm[((size_t)bt * m.Hkv + h) * m.D + d];
        dvs[(size_t)bt * m.D + d] += dvm[((size_t)bt * m.Hkv + h) * m.D + d];
      }
  EXPECT_LT(rel_err(dkg, dks), 1e-14);
  EXPECT_LT(rel_err(dvg, dvs), 1e-14);
}

TEST(OpsAttentionDeterminism, FloatBackwardIsBitwiseDeterministic) {
  const AttnShape s{2, 70, 4, 2, 64};
  AttnData a(s, 600);
  FVec q = to_float(a.q), k = to_float(a.k), v = to_float(a.v), g = to_float(a.R);
  FVec out(q.size()), att(a.natt());
  attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  FVec dq1(q.size(), 0.f), dk1(k.size(), 0.f), dv1(v.size(), 0.f);
  FVec dq2(q.size(), 0.f), dk2(k.size(), 0.f), dv2(v.size(), 0.f);
  attention_backward(dq1.data(), dk1.data(), dv1.data(), g.data(), q.data(), k.data(), v.data(),
                     att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  attention_backward(dq2.data(), dk2.data(), dv2.data(), g.data(), q.data(), k.data(), v.data(),
                     att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  EXPECT_EQ(dq1, dq2);
  EXPECT_EQ(dk1, dk2);
  EXPECT_EQ(dv1, dv2);
}

}  // namespace
