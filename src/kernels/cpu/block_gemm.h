// The attention blocks' products (CPU): C[M, N] = alpha A B (+ C) with A read
// in place through a row and a column stride (A or its transpose) and B packed
// once into column panels that many products share (K^T and V per KV head,
// Q and dO per query head). OpenBLAS packs both operands again on every call
// and makes a separate pass over C for beta = 0, which at attention's sizes
// (M = 64, N = 64..T, K = 64..T) costs about 40% on top of its kernel.
// A register tile of 6 rows x one panel (2 vectors with AVX2, 4 with AVX-512)
// of C sums over k with a broadcast of A and a vector load of B per vector and
// k; the panel (K x 2 or 4 vectors, contiguous: 16 KB for K = 256 floats with
// AVX2, 64 KB with AVX-512) stays in L1/L2 while the row tiles walk down A.
// Each C element is one sum over k in order, so results do not depend on the
// thread count, on the tile its row falls in or on the tile's shape.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstring>

namespace kvs::cpu::detail::bgemm {

// The widest register the build targets (GCC/Clang vector extensions): 64
// bytes with AVX-512, else 32 (one AVX register, two SSE ones). Tests may set
// KVS_BGEMM_VEC_BYTES to run the other width's code here.
#ifndef KVS_BGEMM_VEC_BYTES
#if defined(__AVX512F__)
#define KVS_BGEMM_VEC_BYTES 64
#else
#define KVS_BGEMM_VEC_BYTES 32
#endif
#endif
constexpr int kVecBytes = KVS_BGEMM_VEC_BYTES;
template <class T> struct VecOf;
template <> struct VecOf<float> {
  using type = float __attribute__((vector_size(kVecBytes)));
};
template <> struct VecOf<double> {
  using type = double __attribute__((vector_size(kVecBytes)));
};
template <class T> using Vec = typename VecOf<T>::type;
template <class T> constexpr int kLanes = kVecBytes / sizeof(T);
// A register tile is kRows rows x kVecs vectors of C. With AVX2's 16 vector
// registers, 2 x 6: 12 accumulators, 2 B vectors and a broadcast. With
// AVX-512's 32, 4 x 6: 24 accumulators, 4 B vectors and a broadcast, so an
// FMA needs fewer other instructions (lm-small's attention on Skylake-SP, both
// tiles alternated in one process: forward 1.03-1.07x, backward 1.13-1.17x
// the 2 x 6 tile's speed, the same bits; 4 x 5 and 3 x 8 were slower).
constexpr int kVecs = kVecBytes == 64 ? 4 : 2;
template <class T> constexpr int kPanel = kVecs * kLanes<T>;  // C columns per panel (16 floats with AVX2, 64 with AVX-512)
constexpr int kRows = 6;

}  // namespace kvs::cpu::detail::bgemm

namespace kvs::cpu::detail {

// The causal structure a product may skip, at register-tile granularity
// (exactly: what it skips is zero or never read). For C row i:
//   out_diag:     C[i, j] is not needed for j > i + out_diag (a tile's vectors
//                 wholly past its last row's are left unwritten);
//   k_end_diag:   A[i, k] = 0 for k > i + k_end_diag (the sum stops at the tile's last row's);
//   k_begin_diag: A[i, k] = 0 for k < i + k_begin_diag (the sum starts at the tile's first row's).
struct CausalSkip {
  static constexpr int kNone = 1 << 29;
  int out_diag = kNone, k_end_diag = kNone, k_begin_diag = -kNone;
};

}  // namespace kvs::cpu::detail

namespace kvs::cpu::detail::bgemm {

template <class T> inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T> inline void store(T* p, Vec<T> v) { std::memcpy(p, &v, sizeof v); }
// alpha times a sum, rounded before anything is added to it. GCC contracts
// c + acc * alpha into one fma in some tile instantiations and not in others
// (found with 32-byte vectors: a double dK element's bits depended on the
// tile its key fell in); the empty asm makes the product a value of its own,
// as the partial-panel path's store of it does.
template <class T> inline Vec<T> scaled(Vec<T> acc, T alpha) {
  Vec<T> v = acc * alpha;
  asm("" : "+v"(v));
  return v;
}

// R rows x the first NV vectors of one panel of C; only the first nc
// (<= NV * lanes) columns are written.
template <int R, int NV, bool Accumulate, class T>
inline void tile(int K, T alpha, const T* A, size_t rsa, size_t csa, const T* Bp, size_t ldb, T* C, size_t ldc,
                 int nc) {
  constexpr int W = kLanes<T>, NW = NV * W;
  Vec<T> acc[R][NV] = {};
  for (int k = 0; k < K; ++k) {
    const T* b = Bp + (size_t)k * ldb;
    Vec<T> bv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      bv[j] = load(b + j * W);
      // With R <= 4 rows GCC 12 folds these loads into every FMA as a memory
      // operand (R x NV loads per k instead of NV): on a Zen 5 core the 4 x 4
      // tile ran at 80 GFLOP/s that way, 175 from registers (6 x 4: 205-230
      // either way). The empty asm keeps the vector a value in a register.
      if constexpr (R <= 4) asm("" : "+v"(bv[j]));
    }
    const T* a = A + (size_t)k * csa;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const T ar = a[r * rsa];  // a scalar operand is broadcast (one vbroadcastss from memory)
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[r][j] += bv[j] * ar;
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    T* c = C + r * ldc;
    if (nc == NW) {
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) {
        const Vec<T> v = scaled(acc[r][j], alpha);
        store(c + j * W, Accumulate ? load(c + j * W) + v : v);
      }
    } else {
      T part[NW];
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) store(part + j * W, acc[r][j] * alpha);
      for (int j = 0; j < nc; ++j) c[j] = Accumulate ? c[j] + part[j] : part[j];
    }
  }
}

// The tile's vectors up to the last one some row needs (out_diag): on the
// diagonal a 6-row tile of a 64-column panel (AVX-512) needs a quarter to all
// of it, so whole panels there did about 1.25x Q K^T's causal work at T = 256.
template <int R, bool Accumulate, class T>
inline void skipping_tile(int i, int j, int K, T alpha, const T* A, size_t rsa, size_t csa, const T* Bp, size_t ldb,
                          T* C, size_t ldc, int nc, const CausalSkip& cs) {
  const int last = i + R - 1 + cs.out_diag;  // the last column the tile's last row needs
  if (j > last) return;                      // every C element of the tile is past the diagonal: not needed
  const int kb = std::clamp(i + cs.k_begin_diag, 0, K), ke = std::clamp(i + R + cs.k_end_diag, kb, K);
  constexpr int W = kLanes<T>;
  const int nv = std::min(kVecs, (std::min(nc, last - j + 1) + W - 1) / W);
  nc = std::min(nc, nv * W);
  const T* a = A + i * rsa + kb * csa;
  const T* b = Bp + (size_t)kb * ldb;
  T* c = C + i * ldc;
  if constexpr (kVecs == 4) {
    if (nv == 1) return tile<R, 1, Accumulate>(ke - kb, alpha, a, rsa, csa, b, ldb, c, ldc, nc);
    if (nv == 2) return tile<R, 2, Accumulate>(ke - kb, alpha, a, rsa, csa, b, ldb, c, ldc, nc);
    if (nv == 3) return tile<R, 3, Accumulate>(ke - kb, alpha, a, rsa, csa, b, ldb, c, ldc, nc);
  } else {
    if (nv == 1) return tile<R, 1, Accumulate>(ke - kb, alpha, a, rsa, csa, b, ldb, c, ldc, nc);
  }
  tile<R, kVecs, Accumulate>(ke - kb, alpha, a, rsa, csa, b, ldb, c, ldc, nc);
}

// The last rows < kRows of a panel: one tile of exactly `rows` rows (R counts down to it).
template <int R, bool Accumulate, class T>
inline void last_tile(int rows, int i, int j, int K, T alpha, const T* A, size_t rsa, size_t csa, const T* Bp,
                      size_t ldb, T* C, size_t ldc, int nc, const CausalSkip& cs) {
  if constexpr (R > 0) {
    if (rows == R) skipping_tile<R, Accumulate>(i, j, K, alpha, A, rsa, csa, Bp, ldb, C, ldc, nc, cs);
    else last_tile<R - 1, Accumulate>(rows, i, j, K, alpha, A, rsa, csa, Bp, ldb, C, ldc, nc, cs);
  }
}

template <bool Accumulate, class T>
void panel(int M, int j, int K, T alpha, const T* A, size_t rsa, size_t csa, const T* Bp, size_t ldb, T* C,
           size_t ldc, int nc, const CausalSkip& cs) {
  int i = 0;
  for (; i + kRows <= M; i += kRows)
    skipping_tile<kRows, Accumulate>(i, j, K, alpha, A, rsa, csa, Bp, ldb, C, ldc, nc, cs);
  if (i < M) last_tile<kRows - 1, Accumulate>(M - i, i, j, K, alpha, A, rsa, csa, Bp, ldb, C, ldc, nc, cs);
}

}  // namespace kvs::cpu::detail::bgemm

namespace kvs::cpu::detail {

// Packed B [K, N]: column panel p (columns p*kPanel ..) is K rows of kPanel
// contiguous values (zero past N), panels pstride = K_full * kPanel apart; row
// k0 of every panel starts at packed + k0 * kPanel.
template <class T> constexpr int kPanelCols = bgemm::kPanel<T>;
template <class T> size_t packed_size(int K, int N) {
  return (size_t)K * ((N + kPanelCols<T> - 1) / kPanelCols<T>) * kPanelCols<T>;
}

// B = src [K, N] (row k at src + k * ld).
template <class T> void pack_rows(T* dst, const T* src, size_t ld, int K, int N) {
  constexpr int P = kPanelCols<T>;
  for (int j0 = 0; j0 < N; j0 += P) {
    T* d = dst + (size_t)(j0 / P) * K * P;
    const int nc = std::min(P, N - j0);
    for (int k = 0; k < K; ++k) {
      const T* s = src + (size_t)k * ld + j0;
      T* dk = d + (size_t)k * P;
      if (nc == P) {
        std::memcpy(dk, s, sizeof(T) * P);
      } else {
        for (int j = 0; j < P; ++j) dk[j] = j < nc ? s[j] : T(0);
      }
    }
  }
}

// B = src^T with src [N, K] (row j at src + j * ld): B[k, j] = src[j, k].
template <class T> void pack_transposed(T* dst, const T* src, size_t ld, int N, int K) {
  constexpr int P = kPanelCols<T>;
  for (int j0 = 0; j0 < N; j0 += P) {
    T* d = dst + (size_t)(j0 / P) * K * P;
    const int nc = std::min(P, N - j0);
    for (int j = 0; j < P; ++j) {
      if (j >= nc) {  // past N: zeros (no pointer is formed past src's rows)
        for (int k = 0; k < K; ++k) d[(size_t)k * P + j] = T(0);
        continue;
      }
      const T* s = src + (size_t)(j0 + j) * ld;
      for (int k = 0; k < K; ++k) d[(size_t)k * P + j] = s[k];
    }
  }
}

// C[M, N] = alpha A B (accumulate = false: C is only written) or C += alpha A B,
// with A[i, k] = A[i * rsa + k * csa] and B packed (pack_rows / pack_transposed,
// panels pstride apart, Bp pointing at row 0 of the sum in panel 0), skipping
// what cs says. B's rows are ldb apart: a packed panel's kPanelCols, or a
// row-major matrix's leading dimension when B is read in place (pstride =
// kPanelCols then: each panel reads whole kPanelCols-wide row pieces, so
// N must be a multiple of kPanelCols or the row's end readable).
template <class T>
void block_gemm(bool accumulate, int M, int N, int K, T alpha, const T* A, size_t rsa, size_t csa, const T* Bp,
                size_t pstride, T* C, size_t ldc, const CausalSkip& cs = {}, size_t ldb = kPanelCols<T>) {
  constexpr int P = kPanelCols<T>;
  for (int j = 0; j < N; j += P) {
    const int nc = std::min(P, N - j);
    const T* b = Bp + (size_t)(j / P) * pstride;
    if (accumulate) bgemm::panel<true>(M, j, K, alpha, A, rsa, csa, b, ldb, C + j, ldc, nc, cs);
    else bgemm::panel<false>(M, j, K, alpha, A, rsa, csa, b, ldb, C + j, ldc, nc, cs);
  }
}

}  // namespace kvs::cpu::detail
