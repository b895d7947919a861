// Causal grouped-query attention (CPU), the hot path of the CPU trainer
// (CUDA: flash_attention_fwd.cu / flash_attention_bwd.cu, or cuDNN's SDPA via
// cudnn_sdpa.cpp; both keep the log-sum-exp instead of the probabilities).
// See docs/KERNELS.md for the math.
//
// Queries and keys sit at absolute positions (query t at q_pos0 + t, key s at
// k_pos0 + s), so query row t sees keys s <= t + off with off = q_pos0 - k_pos0:
// the training form is Tq = Tk, off = 0 (the diagonal); decoding and context
// parallelism have more keys than queries, or keys from an earlier chunk.
// Per (b, query head h) with KV head hk = h / (Hq / Hkv), on one [Tq, Tk] slice
// P = att[b, h] and rows of q/k/v that are D contiguous values with a stride of
// H*D between positions, everything is built from three small kernels:
//   scores   S[t, s] = alpha * <A[t], Bm[s]>           (Q K^T and dO V^T)
//   rows_mm  Out[t] (=|+=) alpha * sum_s P[t, s] Bm[s] (P V and dS K)
//   cols_mm  Out[s] += alpha * sum_t P[t, s] A[t]      (dS^T Q and P^T dO)
// rows_mm / cols_mm rely on P[t, s] = 0 for s > t + off (att and datt are
// written that way), which lets them run full register tiles without masks.
// scores transposes a tile of key rows into a stack buffer so its inner loop is
// a broadcast-FMA over keys (no horizontal sums). head_dim 32/64/128 get
// compile-time specialisations (accumulators stay in registers); other sizes
// take the same code with a runtime length, in chunks of at most kDMax.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cpu/exp_fast.h"
#include "kernels/cpu/row_reduce.h"
#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {
namespace detail::attn {

constexpr int kDMax = 256;  // head_dim chunk of the generic path
constexpr int kQB = 64;     // query rows per forward work unit

template <class T> constexpr int key_tile() { return std::is_same_v<T, float> ? 32 : 16; }
// Rows of accumulators per register tile in rows_mm/cols_mm: about 24 vector
// registers of state for the specialised sizes, 4 rows for the generic path.
template <class T, int DC> constexpr int acc_rows() {
  if constexpr (DC == 0) {
    return 4;
  } else {
    constexpr int r = 768 / (DC * (int)sizeof(T));
    return r < 1 ? 1 : (r > 4 ? 4 : r);
  }
}

// S[t*lds + s] = alpha * <A[t*lda ..], Bm[s*ldb ..]> for t in [t0, t1) and
// 0 <= s < min(nk, t1 + off), except that key tiles entirely above row t
// (s > t + off) are skipped (so some entries with s > t + off are written, some
// not: callers mask them themselves).
template <class T, int DC>
void scores(T* S, size_t lds, const T* A, size_t lda, const T* Bm, size_t ldb, int t0, int t1, int off, int nk, int D,
            T alpha) {
  constexpr int TK = key_tile<T>();
  constexpr int TQ = 4;
  constexpr int DA = DC ? DC : kDMax;
  alignas(64) T kt[DA * TK];
  const int jend = std::min(nk, t1 + off);  // the keys some row of [t0, t1) sees
  for (int j0 = 0; j0 < jend; j0 += TK) {
    const int nj = std::min(TK, jend - j0);
    for (int dc0 = 0; dc0 < D; dc0 += DA) {
      const int nd = DC ? DC : std::min(DA, D - dc0);
      for (int j = 0; j < TK; ++j) {
        if (j < nj) {
          const T* br = Bm + (size_t)(j0 + j) * ldb + dc0;
          for (int d = 0; d < nd; ++d) kt[d * TK + j] = br[d];
        } else {
          for (int d = 0; d < nd; ++d) kt[d * TK + j] = T(0);
        }
      }
      for (int t = std::max(t0, j0 - off); t < t1; t += TQ) {
        const int nt = std::min(TQ, t1 - t);
        const T* ar[TQ];
        for (int i = 0; i < TQ; ++i) ar[i] = A + (size_t)(t + std::min(i, nt - 1)) * lda + dc0;
        T acc[TQ][TK] = {};
        for (int d = 0; d < nd; ++d) {
          const T* kr = kt + d * TK;
          for (int i = 0; i < TQ; ++i) {
            const T a = ar[i][d];
            for (int j = 0; j < TK; ++j) acc[i][j] += a * kr[j];
          }
        }
        for (int i = 0; i < nt; ++i) {
          T* sr = S + (size_t)(t + i) * lds + j0;
          if (dc0 == 0)
            for (int j = 0; j < nj; ++j) sr[j] = alpha * acc[i][j];
          else
            for (int j = 0; j < nj; ++j) sr[j] += alpha * acc[i][j];
        }
      }
    }
  }
}

// Out[t] = alpha * sum_{s<=t+off, s<nk} P[t, s] Bm[s]  (accumulate: Out[t] += ...), t in [t0, t1).
template <class T, int DC, bool kAccumulate>
void rows_mm(T* Out, size_t ldo, const T* P, size_t ldp, const T* Bm, size_t ldb, int t0, int t1, int off, int nk,
             int D, T alpha) {
  constexpr int R = acc_rows<T, DC>();
  constexpr int DA = DC ? DC : kDMax;
  for (int t = t0; t < t1; t += R) {
    const int nr = std::min(R, t1 - t);
    const int smax = std::min(nk - 1, t + nr - 1 + off);  // P[t+i, s] = 0 for s > t+i+off
    const T* pr[R];
    for (int i = 0; i < R; ++i) pr[i] = P + (size_t)(t + std::min(i, nr - 1)) * ldp;
    for (int dc0 = 0; dc0 < D; dc0 += DA) {
      const int nd = DC ? DC : std::min(DA, D - dc0);
      T acc[R][DA];
      for (int i = 0; i < R; ++i)
        for (int d = 0; d < nd; ++d) acc[i][d] = T(0);
      for (int s = 0; s <= smax; ++s) {
        const T* br = Bm + (size_t)s * ldb + dc0;
        for (int i = 0; i < R; ++i) {
          const T p = pr[i][s];
          for (int d = 0; d < nd; ++d) acc[i][d] += p * br[d];
        }
      }
      for (int i = 0; i < nr; ++i) {
        T* o = Out + (size_t)(t + i) * ldo + dc0;
        if constexpr (kAccumulate)
          for (int d = 0; d < nd; ++d) o[d] += alpha * acc[i][d];
        else
          for (int d = 0; d < nd; ++d) o[d] = alpha * acc[i][d];
      }
    }
  }
}

// Out[s] += alpha * sum_{s-off<=t<nq} P[t, s] A[t], s in [0, nk).
template <class T, int DC>
void cols_mm(T* Out, size_t ldo, const T* P, size_t ldp, const T* A, size_t lda, int nq, int nk, int off, int D,
             T alpha) {
  constexpr int R = acc_rows<T, DC>();
  constexpr int DA = DC ? DC : kDMax;
  for (int s = 0; s < nk; s += R) {
    const int nr = std::min(R, nk - s);
    int col[R];
    for (int i = 0; i < R; ++i) col[i] = s + std::min(i, nr - 1);
    for (int dc0 = 0; dc0 < D; dc0 += DA) {
      const int nd = DC ? DC : std::min(DA, D - dc0);
      T acc[R][DA];
      for (int i = 0; i < R; ++i)
        for (int d = 0; d < nd; ++d) acc[i][d] = T(0);
      for (int t = std::max(0, s - off); t < nq; ++t) {  // P[t, s+i] = 0 for t + off < s+i
        const T* ar = A + (size_t)t * lda + dc0;
        const T* pr = P + (size_t)t * ldp;
        for (int i = 0; i < R; ++i) {
          const T p = pr[col[i]];
          for (int d = 0; d < nd; ++d) acc[i][d] += p * ar[d];
        }
      }
      for (int i = 0; i < nr; ++i) {
        T* o = Out + (size_t)(s + i) * ldo + dc0;
        for (int d = 0; d < nd; ++d) o[d] += alpha * acc[i][d];
      }
    }
  }
}

// Stable causal softmax of rows [t0, t1) of S [.., nk] (in place): columns
// lo <= s < hi become probabilities, the others 0, with hi = min(nk, t + off + 1)
// and lo = doc_start[t] - k_pos0 (0 without documents). lse[t] (when non-null)
// = log sum_s exp(S[t, s]) over those columns; a row without any is all zeros
// with lse = -inf.
template <class T>
void causal_softmax_rows(T* S, size_t lds, T* lse, int t0, int t1, int off, int nk, const int32_t* doc_start,
                         int k_pos0) {
  for (int t = t0; t < t1; ++t) {
    T* r = S + (size_t)t * lds;
    const int hi = std::min(nk, t + off + 1);
    const int lo = doc_start ? std::max(0, doc_start[t] - k_pos0) : 0;
    const int n = hi - lo;
    if (n <= 0) {
      for (int s = 0; s < nk; ++s) r[s] = T(0);
      if (lse) lse[t] = -std::numeric_limits<T>::infinity();
      continue;
    }
    T* x = r + lo;
    const T mx = row_max(x, n);
    for (int s = 0; s < n; ++s) x[s] = exp_fast(x[s] - mx);
    const T sum = row_sum(x, n);
    const T inv = T(1) / sum;
    for (int s = 0; s < n; ++s) x[s] *= inv;
    if (lse) lse[t] = mx + std::log(sum);
    for (int s = 0; s < lo; ++s) r[s] = T(0);
    for (int s = hi; s < nk; ++s) r[s] = T(0);
  }
}

template <class T, int DC>
void forward(T* out, T* att, T* lse, const T* q, const T* k, const T* v, int B, int Tq, int Tk, int Hq, int Hkv, int D,
             int q_pos0, int k_pos0, const int32_t* doc_start) {
  const int G = Hq / Hkv;
  const T scale = T(1) / std::sqrt(T(D));
  const int off = q_pos0 - k_pos0;
  const int nqb = (Tq + kQB - 1) / kQB;
  const size_t ldq = (size_t)Hq * D, ldk = (size_t)Hkv * D;
#pragma omp parallel for collapse(3) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < Hq; ++h) {
      for (int qb = 0; qb < nqb; ++qb) {
        const int t0 = qb * kQB, t1 = std::min(Tq, t0 + kQB);
        const int hk = h / G;
        const T* qh = q + (size_t)b * Tq * ldq + (size_t)h * D;
        const T* kh = k + (size_t)b * Tk * ldk + (size_t)hk * D;
        const T* vh = v + (size_t)b * Tk * ldk + (size_t)hk * D;
        T* oh = out + (size_t)b * Tq * ldq + (size_t)h * D;
        T* P = att + ((size_t)b * Hq + h) * Tq * Tk;
        T* lh = lse ? lse + ((size_t)b * Hq + h) * Tq : nullptr;
        scores<T, DC>(P, Tk, qh, ldq, kh, ldk, t0, t1, off, Tk, D, scale);
        causal_softmax_rows(P, Tk, lh, t0, t1, off, Tk, doc_start ? doc_start + (size_t)b * Tq : nullptr, k_pos0);
        rows_mm<T, DC, false>(oh, ldq, P, Tk, vh, ldk, t0, t1, off, Tk, D, T(1));
      }
    }
  }
}

// S = scale Q K^T, P = softmax(S), O = P V. With dP = dO V^T:
//   dS[t,s] = P[t,s] (dP[t,s] - sum_s' P[t,s'] dP[t,s'])
//   dQ += scale dS K ; dK += scale dS^T Q ; dV += P^T dO.
// Work units are (b, kv head); the query heads of the group run in order.
// delta (null: computed from this block) holds the row sums
// sum_s' P[t,s'] dP[t,s'] over every key of the row, for a block that holds
// only some of them (context parallelism).
template <class T, int DC>
void backward(T* dq, T* dk, T* dv, T* datt, const T* dout, const T* q, const T* k, const T* v, const T* att, int B,
              int Tq, int Tk, int Hq, int Hkv, int D, int off, const T* delta) {
  const int G = Hq / Hkv;
  const T scale = T(1) / std::sqrt(T(D));
  const size_t ldq = (size_t)Hq * D, ldk = (size_t)Hkv * D;
  const bool need_ds = dq || dk;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int hk = 0; hk < Hkv; ++hk) {
      const T* kh = k + (size_t)b * Tk * ldk + (size_t)hk * D;
      const T* vh = v + (size_t)b * Tk * ldk + (size_t)hk * D;
      for (int g = 0; g < G; ++g) {
        const int h = hk * G + g;
        const size_t qoff = (size_t)b * Tq * ldq + (size_t)h * D;
        const T* P = att + ((size_t)b * Hq + h) * Tq * Tk;
        T* dS = datt + ((size_t)b * Hq + h) * Tq * Tk;
        if (need_ds) {
          scores<T, DC>(dS, Tk, dout + qoff, ldq, vh, ldk, 0, Tq, off, Tk, D, T(1));  // dP
          for (int t = 0; t < Tq; ++t) {
            const T* pr = P + (size_t)t * Tk;
            T* r = dS + (size_t)t * Tk;
            const int hi = std::clamp(t + off + 1, 0, Tk);  // the columns the causal mask leaves
            const T dot = delta ? delta[((size_t)b * Hq + h) * Tq + t] : row_dot(pr, r, hi);
            for (int s = 0; s < hi; ++s) r[s] = pr[s] * (r[s] - dot);
            for (int s = hi; s < Tk; ++s) r[s] = T(0);
          }
        }
        T* dkh = dk ? dk + (size_t)b * Tk * ldk + (size_t)hk * D : nullptr;
        T* dvh = dv ? dv + (size_t)b * Tk * ldk + (size_t)hk * D : nullptr;
        if (dq) rows_mm<T, DC, true>(dq + qoff, ldq, dS, Tk, kh, ldk, 0, Tq, off, Tk, D, scale);
        if (dk) cols_mm<T, DC>(dkh, ldk, dS, Tk, q + qoff, ldq, Tq, Tk, off, D, scale);
        if (dv) cols_mm<T, DC>(dvh, ldk, P, Tk, dout + qoff, ldq, Tq, Tk, off, D, T(1));
      }
    }
  }
}

}  // namespace detail::attn

// Causal grouped-query attention with scale 1/sqrt(D), general form: Tq
// queries at absolute positions q_pos0 + t against Tk keys at k_pos0 + s.
// q/out are [B, Tq, Hq, D], k/v are [B, Tk, Hkv, D]; query head h reads KV
// head h / (Hq / Hkv) (K/V are never copied per query head). Key s is visible
// to query t iff k_pos0 + s <= q_pos0 + t and, with doc_start ([B, Tq], the
// first absolute position of query t's document), k_pos0 + s >= doc_start[b, t].
// att [B, Hq, Tq, Tk] receives the softmax probabilities, 0 where a key is not
// visible, so the backward needs no mask. lse [B, Hq, Tq] (null = not written)
// receives the natural-log log-sum-exp of the scaled scores over the visible
// keys. A query row that sees no key at all (its keys all lie after it or
// before its document) gets out = 0, att = 0 and lse = -inf: it contributes
// nothing, and merging partial results by their lse (context parallelism)
// weights it by exp(-inf) = 0.
template <class T>
void attention_forward(T* out, T* att, std::type_identity_t<T>* lse, const T* q, const T* k, const T* v, int B, int Tq,
                       int Tk, int Hq, int Hkv, int D, int q_pos0, int k_pos0, const int32_t* doc_start = nullptr) {
  static_assert(detail::kSupported<T>);
  namespace a = detail::attn;
  switch (D) {
    case 32: return a::forward<T, 32>(out, att, lse, q, k, v, B, Tq, Tk, Hq, Hkv, D, q_pos0, k_pos0, doc_start);
    case 64: return a::forward<T, 64>(out, att, lse, q, k, v, B, Tq, Tk, Hq, Hkv, D, q_pos0, k_pos0, doc_start);
    case 128: return a::forward<T, 128>(out, att, lse, q, k, v, B, Tq, Tk, Hq, Hkv, D, q_pos0, k_pos0, doc_start);
    default: return a::forward<T, 0>(out, att, lse, q, k, v, B, Tq, Tk, Hq, Hkv, D, q_pos0, k_pos0, doc_start);
  }
}

// The backward of the general form (att as its forward wrote it). datt is
// scratch of the same shape as att (overwritten). When the keys of a row are
// split over several blocks (context parallelism: att then holds each block's
// part of the whole row's probabilities), delta [B, Hq, Tq] must hold the
// whole row's sum_s P dP, which equals sum_d dO O (attention_row_delta);
// null computes it from this block's keys, which is right when they are all.
template <class T>
void attention_backward(T* dq, T* dk, T* dv, T* datt, const T* dout, const T* q, const T* k, const T* v,
                        const T* att, int B, int Tq, int Tk, int Hq, int Hkv, int D, int q_pos0, int k_pos0,
                        const std::type_identity_t<T>* delta = nullptr) {
  static_assert(detail::kSupported<T>);
  namespace a = detail::attn;
  const int off = q_pos0 - k_pos0;
  switch (D) {
    case 32: return a::backward<T, 32>(dq, dk, dv, datt, dout, q, k, v, att, B, Tq, Tk, Hq, Hkv, D, off, delta);
    case 64: return a::backward<T, 64>(dq, dk, dv, datt, dout, q, k, v, att, B, Tq, Tk, Hq, Hkv, D, off, delta);
    case 128: return a::backward<T, 128>(dq, dk, dv, datt, dout, q, k, v, att, B, Tq, Tk, Hq, Hkv, D, off, delta);
    default: return a::backward<T, 0>(dq, dk, dv, datt, dout, q, k, v, att, B, Tq, Tk, Hq, Hkv, D, off, delta);
  }
}

// delta[b, h, t] = sum_d dout[b, t, h, d] * out[b, t, h, d]: the row sum
// sum_s P dP of attention_backward's dS over every key (dP = dO V^T, O = P V).
template <class T>
void attention_row_delta(T* delta, const T* dout, const T* out, int B, int Tq, int Hq, int D) {
  static_assert(detail::kSupported<T>);
  const size_t ld = (size_t)Hq * D;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int t = 0; t < Tq; ++t) {
        const size_t at = (size_t)b * Tq * ld + (size_t)t * ld + (size_t)h * D;
        delta[((size_t)b * Hq + h) * Tq + t] = detail::row_dot(dout + at, out + at, D);
      }
}

// The training form: T queries and T keys at positions 0..T-1 (causal
// self-attention). att is [B, Hq, T, T] (entries above the diagonal written as
// 0); with doc_start ([B, T], as for kv_shift) query t attends to keys
// [doc_start[b, t], t] only (document masking).
template <class T>
void attention_forward(T* out, T* att, const T* q, const T* k, const T* v, int B, int Tn, int Hq, int Hkv, int D,
                       const int32_t* doc_start = nullptr) {
  attention_forward(out, att, nullptr, q, k, v, B, Tn, Tn, Hq, Hkv, D, 0, 0, doc_start);
}

// datt is scratch of the same shape as att (overwritten).
template <class T>
void attention_backward(T* dq, T* dk, T* dv, T* datt, const T* dout, const T* q, const T* k, const T* v,
                        const T* att, int B, int Tn, int Hq, int Hkv, int D) {
  attention_backward(dq, dk, dv, datt, dout, q, k, v, att, B, Tn, Tn, Hq, Hkv, D, 0, 0);
}

}  // namespace kvs::cpu
