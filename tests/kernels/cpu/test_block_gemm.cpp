// The attention blocks' GEMM (block_gemm.h) against a plain triple loop: both
// layouts of A, packed B of any width (full and partial panels of 16 and 64
// columns), every remainder of the 6-row tiles, accumulation, and the causal skips.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "kernels/cpu/block_gemm.h"

namespace {

using kvs::cpu::detail::block_gemm;
using kvs::cpu::detail::CausalSkip;
using kvs::cpu::detail::kPanelCols;
using kvs::cpu::detail::packed_size;

template <class T> struct Problem {
  int M, N, K;
  bool a_transposed;
  std::vector<T> A, B, C0;
  Problem(int m, int n, int k, bool at)
      : M(m), N(n), K(k), a_transposed(at), A((size_t)m * k), B((size_t)k * n), C0((size_t)m * n) {
    for (size_t i = 0; i < A.size(); ++i) A[i] = T(std::sin(0.7 * (double)i + 0.1));
    for (size_t i = 0; i < B.size(); ++i) B[i] = T(std::cos(1.3 * (double)i));
    for (size_t i = 0; i < C0.size(); ++i) C0[i] = T(0.5 * std::sin(0.37 * (double)i));
  }
  // A[i, k] as block_gemm reads it: row-major [M, K], or stored [K, M] when transposed.
  size_t rsa() const { return a_transposed ? 1 : (size_t)K; }
  size_t csa() const { return a_transposed ? (size_t)M : 1; }
  T a(int i, int k) const { return A[i * rsa() + k * csa()]; }
};

template <class T> void check(int M, int N, int K, bool at, bool accumulate, bool b_transposed, double tol) {
  Problem<T> p(M, N, K, at);
  std::vector<T> packed(packed_size<T>(K, N), T(-7));
  // B [K, N]: packed from rows, or from its transpose stored [N, K].
  std::vector<T> bt((size_t)N * K);
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < N; ++j) bt[(size_t)j * K + k] = p.B[(size_t)k * N + j];
  if (b_transposed) kvs::cpu::detail::pack_transposed(packed.data(), bt.data(), K, N, K);
  else kvs::cpu::detail::pack_rows(packed.data(), p.B.data(), N, K, N);
  std::vector<T> C = p.C0;
  const T alpha = T(0.75);
  const size_t pstride = (size_t)K * kPanelCols<T>;
  block_gemm<T>(accumulate, M, N, K, alpha, p.A.data(), p.rsa(), p.csa(), packed.data(), pstride, C.data(), N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += (double)p.a(i, k) * (double)p.B[(size_t)k * N + j];
      const double want = (accumulate ? (double)p.C0[(size_t)i * N + j] : 0.0) + (double)alpha * s;
      ASSERT_NEAR(C[(size_t)i * N + j], want, tol * (1 + std::fabs(want)))
          << M << "x" << N << "x" << K << " at=" << at << " acc=" << accumulate << " (" << i << ", " << j << ")";
    }
}

TEST(OpsBlockGemm, MatchesTripleLoop) {
  for (bool at : {false, true})
    for (bool acc : {false, true})
      for (bool bt : {false, true})
        for (auto [M, N, K] : {std::tuple{1, 1, 1}, {6, 16, 5}, {7, 17, 3}, {13, 40, 64}, {64, 64, 256}, {5, 3, 0},
                                  {8, 70, 2}, {9, 100, 9}, {11, 130, 7}}) {
          check<float>(M, N, K, at, acc, bt, 1e-5);
          check<double>(M, N, K, at, acc, bt, 1e-13);
        }
}

// With A zero past (or before) each row's diagonal, skipping that part gives
// the full product; with out_diag, every element on or before the diagonal is
// right (a tile computes only the vectors up to its last row's diagonal: N
// spans whole and partial panels, and the diagonals cut them at every vector).
template <class T> void check_causal_skips(int M, int N, int K, double tol) {
  for (int diag : {-9, 0, 4, 16, 37}) {
    for (int mode = 0; mode < 3; ++mode) {
      Problem<T> p(M, N, K, mode == 2);
      for (int i = 0; i < M; ++i)
        for (int k = 0; k < K; ++k) {
          const bool zero = mode == 1 ? k > i + diag : (mode == 2 ? k < i + diag : false);
          if (zero) p.A[i * p.rsa() + k * p.csa()] = 0;
        }
      std::vector<T> packed(packed_size<T>(K, N));
      kvs::cpu::detail::pack_rows(packed.data(), p.B.data(), N, K, N);
      std::vector<T> C(p.C0.size(), T(std::nan("")));
      CausalSkip cs;
      if (mode == 0) cs.out_diag = diag;
      if (mode == 1) cs.k_end_diag = diag;
      if (mode == 2) cs.k_begin_diag = diag;
      block_gemm<T>(false, M, N, K, T(1), p.A.data(), p.rsa(), p.csa(), packed.data(), (size_t)K * kPanelCols<T>,
                    C.data(), N, cs);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          if (mode == 0 && j > i + diag) continue;  // not needed, may be left unwritten
          double s = 0;
          for (int k = 0; k < K; ++k) s += (double)p.a(i, k) * (double)p.B[(size_t)k * N + j];
          ASSERT_NEAR(C[(size_t)i * N + j], s, tol * (1 + std::fabs(s)))
              << "mode " << mode << " diag " << diag << " (" << i << ", " << j << ")";
        }
    }
  }
}

TEST(OpsBlockGemm, CausalSkipsAreExact) {
  check_causal_skips<double>(29, 45, 45, 1e-12);
  check_causal_skips<float>(29, 45, 45, 1e-5);
  check_causal_skips<double>(70, 150, 40, 1e-12);
  check_causal_skips<float>(70, 150, 40, 1e-5);
}

// B read where it lies (ldb: a row-major matrix's leading dimension, panels
// kPanelCols apart) gives the packed product's bits: the attention backward
// reads Q and dO so when D is whole panels. Rows of B are wider than N (the
// next head's columns sit beside them) and the tiles' causal skips apply.
template <class T> void check_b_in_place(int M, int panels, int K) {
  constexpr int P = kPanelCols<T>;
  const int N = panels * P;
  const size_t ldb = (size_t)N + 3 * P;  // other columns between rows
  Problem<T> p(M, N, K, true);
  std::vector<T> rows((size_t)K * ldb, T(99)), packed(packed_size<T>(K, N));
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < N; ++j) rows[(size_t)k * ldb + j] = p.B[(size_t)k * N + j];
  kvs::cpu::detail::pack_rows(packed.data(), p.B.data(), N, K, N);
  for (const CausalSkip cs : {CausalSkip{}, CausalSkip{.k_begin_diag = -3}, CausalSkip{.out_diag = 5}}) {
    std::vector<T> want = p.C0, got = p.C0;
    block_gemm<T>(true, M, N, K, T(0.5), p.A.data(), p.rsa(), p.csa(), packed.data(), (size_t)K * P, want.data(), N,
                  cs);
    block_gemm<T>(true, M, N, K, T(0.5), p.A.data(), p.rsa(), p.csa(), rows.data(), P, got.data(), N, cs, ldb);
    ASSERT_EQ(got, want) << M << "x" << N << "x" << K;
  }
}

TEST(OpsBlockGemm, BReadInPlaceIsThePackedProduct) {
  check_b_in_place<float>(13, 1, 20);
  check_b_in_place<float>(64, 2, 70);
  check_b_in_place<double>(13, 1, 20);
  check_b_in_place<double>(40, 2, 33);
}

}  // namespace
