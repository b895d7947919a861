// CPU KV shift: the forward against the direct formula, the backward against
// finite differences (with a halo and document boundaries too), float vs
// double, the += convention, and a chunk with its halo against the whole sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "kernels/cpu/kv_shift.h"
#include "kernels/cpu/ops_test_util.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;

TEST(OpsKvShift, WindowOneMatchesDirectFormula) {
  const int B = 2, T = 5, H = 3, D = 4;
  Vec x = randn((size_t)B * T * H * D, 50), coef = randn(H * 2, 51), out(x.size());
  kv_shift_forward(out.data(), x.data(), coef.data(), B, T, H, D, 1);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D; ++d) {
          const size_t i = (((size_t)b * T + t) * H + h) * D + d;
          const double prev = t > 0 ? x[i - (size_t)H * D] : 0.0;
          EXPECT_NEAR(out[i], coef[h * 2 + 0] * prev + coef[h * 2 + 1] * x[i], 1e-14);
        }
  // window 1 with coef (0, 1) is the identity, (1, 0) the pure shift.
  Vec id(H * 2), sh(H * 2);
  for (int h = 0; h < H; ++h) id[h * 2 + 1] = 1, sh[h * 2] = 1;
  kv_shift_forward(out.data(), x.data(), id.data(), B, T, H, D, 1);
  EXPECT_EQ(out, x);
  kv_shift_forward(out.data(), x.data(), sh.data(), B, T, H, D, 1);
  EXPECT_EQ(out[(((size_t)1 * T + 3) * H + 2) * D + 1], x[(((size_t)1 * T + 2) * H + 2) * D + 1]);
  EXPECT_EQ(out[(((size_t)1 * T + 0) * H + 2) * D + 1], 0.0);
}

TEST(OpsKvShift, BackwardMatchesFiniteDifferences) {
  for (int W : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "window " << W);
    const int B = 2, T = 6, H = 3, D = 4;
    Vec x = randn((size_t)B * T * H * D, 60 + W), coef = randn((size_t)H * (W + 1), 70 + W);
    Vec R = randn(x.size(), 80 + W), out(x.size());
    auto f = [&] {
      kv_shift_forward(out.data(), x.data(), coef.data(), B, T, H, D, W);
      return dot(out, R);
    };
    Vec dx0 = randn(x.size(), 90), dc0 = randn(coef.size(), 91), dx = dx0, dc = dc0;
    Vec dxf(x.size(), 0.0), dcf(coef.size(), 0.0);
    kv_shift_backward(dxf.data(), dcf.data(), R.data(), x.data(), coef.data(), B, T, H, D, W);
    kv_shift_backward(dx.data(), dc.data(), R.data(), x.data(), coef.data(), B, T, H, D, W);
    expect_grad_close(dxf, numgrad(x, f), "din");
    expect_grad_close(dcf, numgrad(coef, f), "dcoef");
    EXPECT_LT(rel_err(dx, add(dx0, dxf)), 1e-14);
    EXPECT_LT(rel_err(dc, add(dc0, dcf)), 1e-14);

    FVec xf = to_float(x), cf = to_float(coef), Rf = to_float(R), of(x.size()), dxff(x.size(), 0.f),
         dcff(coef.size(), 0.f);
    f();
    kv_shift_forward(of.data(), xf.data(), cf.data(), B, T, H, D, W);
    kv_shift_backward(dxff.data(), dcff.data(), Rf.data(), xf.data(), cf.data(), B, T, H, D, W);
    EXPECT_LT(rel_err(to_double(of), out), kFloatTol);
    EXPECT_LT(rel_err(to_double(dxff), dxf), kFloatTol);
    EXPECT_LT(rel_err(to_double(dcff), dcf), kFloatTol);
  }
}

// ------------------------------------------------------------------ halo and document boundaries

// Document starts for a [B, T] batch in the op's coordinates (B = 2).
// Sequence 0: rows before `cut` belong to a document that continues from
// before the halo (-W, or any smaller value: all halo rows count), the others
// to one that starts at `cut`. Sequence 1: rows 0 and 1 belong to a document
// that starts at -1, inside the halo (for W > 1 the older halo rows are
// excluded), the others to one that starts at 2.
std::vector<int32_t> doc_starts(int B, int T, int W, int cut) {
  std::vector<int32_t> ds((size_t)B * T);
  for (int t = 0; t < T; ++t) {
    ds[t] = t < cut ? (t % 2 ? -W : -1000) : cut;
    if (B > 1) ds[(size_t)T + t] = t < 2 ? -1 : 2;
  }
  return ds;
}

TEST(OpsKvShift, NullHaloIsZeroHaloAndDocStartZeroExcludesIt) {
  for (int W : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "window " << W);
    const int B = 2, T = 6, H = 2, D = 3;
    const size_t row = (size_t)H * D;
    Vec x = randn((size_t)B * T * row, 1100 + W), coef = randn((size_t)H * (W + 1), 1110 + W);
    Vec zeros((size_t)B * W * row, 0.0), halo = randn(zeros.size(), 1120 + W);
    Vec plain(x.size()), with_zeros(x.size()), excluded(x.size()), with_halo(x.size());
    kv_shift_forward(plain.data(), x.data(), coef.data(), B, T, H, D, W);
    kv_shift_forward(with_zeros.data(), x.data(), coef.data(), B, T, H, D, W, (const int32_t*)nullptr, zeros.data());
    EXPECT_EQ(with_zeros, plain);
    // Every row's document starts at 0: the halo does not count.
    std::vector<int32_t> ds0((size_t)B * T, 0);
    kv_shift_forward(excluded.data(), x.data(), coef.data(), B, T, H, D, W, ds0.data(), halo.data());
    EXPECT_EQ(excluded, plain);
    // Without documents it does, on the first W rows only.
    kv_shift_forward(with_halo.data(), x.data(), coef.data(), B, T, H, D, W, (const int32_t*)nullptr, halo.data());
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        const size_t at = ((size_t)b * T + t) * row;
        const bool same = std::equal(with_halo.begin() + at, with_halo.begin() + at + row, plain.begin() + at);
        EXPECT_EQ(same, t >= W) << "b " << b << " t " << t;
      }
    // Direct formula for one element of the first row: the halo rows are positions -W..-1.
    double ref = 0;
    for (int w = 0; w < W; ++w) ref += coef[(size_t)1 * (W + 1) + w] * halo[((size_t)1 * W + w) * row + 1 * D + 2];
    ref += coef[(size_t)1 * (W + 1) + W] * x[((size_t)1 * T + 0) * row + 1 * D + 2];
    EXPECT_NEAR(with_halo[((size_t)1 * T + 0) * row + 1 * D + 2], ref, 1e-14);
  }
}

TEST(OpsKvShift, HaloAndDocumentBackwardMatchesFiniteDifferences) {
  for (int W : {1, 2, 3}) {
    for (bool docs : {false, true}) {
      SCOPED_TRACE(testing::Message() << "window " << W << (docs ? " with documents" : ""));
      const int B = 2, T = 7, H = 2, D = 3;
      const size_t row = (size_t)H * D;
      Vec x = randn((size_t)B * T * row, 1200 + W), coef = randn((size_t)H * (W + 1), 1210 + W);
      Vec halo = randn((size_t)B * W * row, 1220 + W), R = randn(x.size(), 1230 + W), out(x.size());
      const std::vector<int32_t> ds = doc_starts(B, T, W, 4);
      const int32_t* doc = docs ? ds.data() : nullptr;
      auto f = [&] {
        kv_shift_forward(out.data(), x.data(), coef.data(), B, T, H, D, W, doc, halo.data());
        return dot(out, R);
      };
      Vec dx(x.size(), 0.0), dc(coef.size(), 0.0), dh(halo.size(), 0.0);
      kv_shift_backward(dx.data(), dc.data(), R.data(), x.data(), coef.data(), B, T, H, D, W, doc, halo.data(),
                        dh.data());
      expect_grad_close(dx, numgrad(x, f), "din");
      expect_grad_close(dc, numgrad(coef, f), "dcoef");
      expect_grad_close(dh, numgrad(halo, f), "dhalo");

      // Accumulation, and each gradient alone gives the same values.
      Vec dx0 = randn(dx.size(), 1240), dc0 = randn(dc.size(), 1241), dh0 = randn(dh.size(), 1242);
      Vec dx2 = dx0, dc2 = dc0, dh2 = dh0;
      kv_shift_backward(dx2.data(), (double*)nullptr, R.data(), x.data(), coef.data(), B, T, H, D, W, doc,
                        halo.data(), (double*)nullptr);
      kv_shift_backward((double*)nullptr, dc2.data(), R.data(), x.data(), coef.data(), B, T, H, D, W, doc,
                        halo.data(), (double*)nullptr);
      kv_shift_backward((double*)nullptr, (double*)nullptr, R.data(), x.data(), coef.data(), B, T, H, D, W, doc,
                        halo.data(), dh2.data());
      EXPECT_LT(rel_err(dx2, add(dx0, dx)), 1e-14);
      EXPECT_LT(rel_err(dc2, add(dc0, dc)), 1e-14);
      EXPECT_LT(rel_err(dh2, add(dh0, dh)), 1e-14);

      FVec xf = to_float(x), cf = to_float(coef), hf = to_float(halo), Rf = to_float(R), of(x.size()),
           dxf(x.size(), 0.f), dcf(coef.size(), 0.f), dhf(halo.size(), 0.f);
      f();
      kv_shift_forward(of.data(), xf.data(), cf.data(), B, T, H, D, W, doc, hf.data());
      kv_shift_backward(dxf.data(), dcf.data(), Rf.data(), xf.data(), cf.data(), B, T, H, D, W, doc, hf.data(),
                        dhf.data());
      EXPECT_LT(rel_err(to_double(of), out), kFloatTol);
      EXPECT_LT(rel_err(to_double(dxf), dx), kFloatTol);
      EXPECT_LT(rel_err(to_double(dcf), dc), kFloatTol);
      EXPECT_LT(rel_err(to_double(dhf), dh), kFloatTol);

      // overwrite_din: din is written, not added into: whatever it held (NaN
      // here), the bits of adding into zeros; dcoef and dhalo still add.
      FVec over(x.size(), std::nanf("")), dco = to_float(dc0), dho = to_float(dh0);
      kv_shift_backward(over.data(), dco.data(), Rf.data(), xf.data(), cf.data(), B, T, H, D, W, doc, hf.data(),
                        dho.data(), /*overwrite_din=*/true);
      EXPECT_EQ(over, dxf);
      EXPECT_LT(rel_err(to_double(dco), add(dc0, dc)), kFloatTol);
      EXPECT_LT(rel_err(to_double(dho), add(dh0, dh)), kFloatTol);
    }
  }
}

// Rows in several of the backward's row blocks (the last one short) and heads
// wider than its double lanes (D = 19: one sixteen-lane chunk and a tail of 3).
TEST(OpsKvShift, BackwardOverSeveralRowBlocksWithWideHeadsMatchesFiniteDifferences) {
  for (int W : {1, 2}) {
    SCOPED_TRACE(testing::Message() << "window " << W);
    const int B = 2, T = 23, H = 2, D = 19;
    static_assert(B * T > detail::kShiftRowBlock && B * T % detail::kShiftRowBlock != 0);
    const size_t row = (size_t)H * D;
    Vec x = randn((size_t)B * T * row, 1300 + W), coef = randn((size_t)H * (W + 1), 1310 + W);
    Vec halo = randn((size_t)B * W * row, 1320 + W), R = randn(x.size(), 1330 + W), out(x.size());
    const std::vector<int32_t> ds = doc_starts(B, T, W, 17);
    auto f = [&] {
      kv_shift_forward(out.data(), x.data(), coef.data(), B, T, H, D, W, ds.data(), halo.data());
      return dot(out, R);
    };
    Vec dx(x.size(), 0.0), dc(coef.size(), 0.0), dh(halo.size(), 0.0);
    kv_shift_backward(dx.data(), dc.data(), R.data(), x.data(), coef.data(), B, T, H, D, W, ds.data(), halo.data(),
                      dh.data());
    expect_grad_close(dx, numgrad(x, f), "din");
    expect_grad_close(dc, numgrad(coef, f), "dcoef");
    expect_grad_close(dh, numgrad(halo, f), "dhalo");
  }
}

// dcoef is summed in fixed row blocks: 1, 2 and 3 threads give the same bits.
// In double: with float gradients, dcoef's double sums rounded to float
// would hide a change of their order.
TEST(OpsKvShift, BackwardDoesNotDependOnTheThreadCount) {
  const int B = 4, T = 100, H = 3, D = 35, W = 2;
  const size_t row = (size_t)H * D;
  Vec x = randn((size_t)B * T * row, 1400), coef = randn((size_t)H * (W + 1), 1401);
  Vec halo = randn((size_t)B * W * row, 1402), g = randn(x.size(), 1403);
  const std::vector<int32_t> ds = doc_starts(B, T, W, 60);
  const int threads_before = omp_get_max_threads();
  Vec dx1, dc1, dh1;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Vec dx(x.size(), 0.0), dc(coef.size(), 0.0), dh(halo.size(), 0.0);
    kv_shift_backward(dx.data(), dc.data(), g.data(), x.data(), coef.data(), B, T, H, D, W, ds.data(), halo.data(),
                      dh.data());
    if (threads == 1) {
      dx1 = dx, dc1 = dc, dh1 = dh;
      continue;
    }
    EXPECT_EQ(dx, dx1) << threads << " threads";
    EXPECT_EQ(dc, dc1) << threads << " threads";
    EXPECT_EQ(dh, dh1) << threads << " threads";
  }
  omp_set_num_threads(threads_before);
}

// kv_shift_term_squares against dcoef one term at a time: with dout zero but
// for one element (b, t, h, d), dcoef[h, w] is that element's single term for
// each w, so the squares summed over every element are the squares of all the
// terms (documents and a halo drop and add terms the same way as dcoef).
TEST(OpsKvShift, TermSquaresAreTheSquaresOfDcoefsTerms) {
  for (int W : {1, 3}) {
    for (bool docs : {false, true}) {
      for (bool with_halo : {false, true}) {
        SCOPED_TRACE(testing::Message() << "window " << W << (docs ? " with documents" : "")
                                        << (with_halo ? " with a halo" : ""));
        const int B = 2, T = 6, H = 2, D = 3;
        const size_t row = (size_t)H * D;
        Vec x = randn((size_t)B * T * row, 1300 + W), coef = randn((size_t)H * (W + 1), 1310 + W);
        Vec halo = randn((size_t)B * W * row, 1320 + W), R = randn(x.size(), 1330 + W);
        const std::vector<int32_t> ds = doc_starts(B, T, W, 3);
        const int32_t* doc = docs ? ds.data() : nullptr;
        const double* hx = with_halo ? halo.data() : nullptr;
        Vec want(coef.size(), 0.0), one(x.size(), 0.0);
        for (size_t e = 0; e < x.size(); ++e) {
          one[e] = R[e];
          Vec dc(coef.size(), 0.0);
          kv_shift_backward((double*)nullptr, dc.data(), one.data(), x.data(), coef.data(), B, T, H, D, W, doc, hx);
          for (size_t i = 0; i < dc.size(); ++i) want[i] += dc[i] * dc[i];
          one[e] = 0.0;
        }
        std::vector<double> got(coef.size(), 1.0);  // += : starts from 1
        kv_shift_term_squares(got.data(), R.data(), x.data(), B, T, H, D, W, doc, hx);
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_GT(want[i], 0.0) << i;
          EXPECT_NEAR(got[i] - 1.0, want[i], 1e-12 * (1.0 + want[i])) << i;
        }
      }
    }
  }
}

// A sequence cut in two chunks: the second chunk with the first chunk's last W
// rows as halo gives the whole sequence's rows, and its backward gives the
// whole sequence's gradients (dhalo = those on the first chunk's last W rows,
// when only the second chunk's outputs have a gradient).
TEST(OpsKvShift, ChunkWithHaloEqualsWholeSequence) {
  for (int W : {1, 2, 3}) {
    for (bool docs : {false, true}) {
      SCOPED_TRACE(testing::Message() << "window " << W << (docs ? " with documents" : ""));
      const int B = 2, T0 = 5, T1 = 6, T = T0 + T1, H = 2, D = 3;
      const size_t row = (size_t)H * D;
      Vec x = randn((size_t)B * T * row, 1300 + W), coef = randn((size_t)H * (W + 1), 1310 + W);
      // Whole-sequence documents (positions 0..T-1): sequence 0 one document
      // starting at 0 then one at T0 + 3; sequence 1 one starting inside the
      // halo rows (T0 - 1, so a window > 1 reaches before it) and one at T0 + 2.
      std::vector<int32_t> whole_ds((size_t)B * T), chunk_ds((size_t)B * T1);
      for (int t = 0; t < T; ++t) {
        whole_ds[t] = t < T0 + 3 ? 0 : T0 + 3;
        whole_ds[(size_t)T + t] = t < T0 - 1 ? 0 : (t < T0 + 2 ? T0 - 1 : T0 + 2);
      }
      for (int b = 0; b < B; ++b)  // the chunk's coordinates: position T0 is 0
        for (int t = 0; t < T1; ++t) chunk_ds[(size_t)b * T1 + t] = whole_ds[(size_t)b * T + T0 + t] - T0;
      const int32_t* wdoc = docs ? whole_ds.data() : nullptr;
      const int32_t* cdoc = docs ? chunk_ds.data() : nullptr;

      auto rows = [&](const Vec& v, int len, int t0, int n) {  // rows [t0, t0 + n) of each sequence of length len
        Vec r((size_t)B * n * row);
        for (int b = 0; b < B; ++b)
          std::copy_n(v.begin() + ((size_t)b * len + t0) * row, (size_t)n * row, r.begin() + (size_t)b * n * row);
        return r;
      };
      const Vec chunk = rows(x, T, T0, T1), halo = rows(x, T, T0 - W, W);
      Vec whole_out(x.size()), chunk_out(chunk.size());
      kv_shift_forward(whole_out.data(), x.data(), coef.data(), B, T, H, D, W, wdoc);
      kv_shift_forward(chunk_out.data(), chunk.data(), coef.data(), B, T1, H, D, W, cdoc, halo.data());
      EXPECT_LT(rel_err(chunk_out, rows(whole_out, T, T0, T1)), 1e-15);

      // Gradient only on the second chunk's outputs.
      Vec R = randn(x.size(), 1320 + W);
      for (int b = 0; b < B; ++b) std::fill_n(R.begin() + (size_t)b * T * row, (size_t)T0 * row, 0.0);
      const Vec Rc = rows(R, T, T0, T1);
      Vec wdx(x.size(), 0.0), wdc(coef.size(), 0.0), cdx(chunk.size(), 0.0), cdc(coef.size(), 0.0),
          cdh(halo.size(), 0.0);
      kv_shift_backward(wdx.data(), wdc.data(), R.data(), x.data(), coef.data(), B, T, H, D, W, wdoc);
      kv_shift_backward(cdx.data(), cdc.data(), Rc.data(), chunk.data(), coef.data(), B, T1, H, D, W, cdoc,
                        halo.data(), cdh.data());
      EXPECT_LT(rel_err(cdx, rows(wdx, T, T0, T1)), 1e-15);
      EXPECT_LT(rel_err(cdh, rows(wdx, T, T0 - W, W)), 1e-15);
      EXPECT_LT(rel_err(cdc, wdc), 1e-14);
      EXPECT_GT(norm(cdh), 1e-3);
    }
  }
}

}  // namespace
