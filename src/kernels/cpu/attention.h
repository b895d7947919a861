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
// H*D between positions, the six products (Q K^T and P V forward; dO V^T,
// dS K, dS^T Q and P^T dO backward) are block_gemm calls (block_gemm.h): the
// left operand (Q, dO, P, dS or their transposes) is read in place, the right
// one (K^T, V, K, Q, dO) was packed once per (b, kv head) or query head (the
// backward reads Q and dO in place where D is whole panels). All
// six run per block of kQB query rows against the keys the block sees (the
// backward keeps the block's dS in a per-thread buffer, so dS never leaves L2
// and P is read once; with too few (b, kv head) units for the threads it
// splits by key block too, see Units); register tiles of 6 rows skip what
// lies wholly past the causal diagonal (S and dP tiles: the vectors past their
// last row's), so they do ~1.05x the causal work at T = 256 (BLAS on whole
// 64-blocks did 1.25x). P and dS are exactly 0 past
// the diagonal where a tile reads them (softmax writes P's zeros up to Tk, the
// backward dS's up to the block's last key), so tiles that straddle it need
// no masks. Softmax and dS are row passes; softmax's exp and sum run in one
// pass over vectors.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/block_gemm.h"
#include "kernels/cpu/exp_fast.h"
#include "kernels/cpu/row_reduce.h"
#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {
namespace detail::attn {

constexpr int kQB = 64;  // query rows (or keys) per GEMM block

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
    const T sum = exp_shifted_sum(x, n, mx);
    const T inv = T(1) / sum;
    for (int s = 0; s < n; ++s) x[s] *= inv;
    if (lse) lse[t] = mx + std::log(sum);
    for (int s = 0; s < lo; ++s) r[s] = T(0);
    for (int s = hi; s < nk; ++s) r[s] = T(0);
  }
}

// Scratch that grows to the largest size asked of it, one per calling thread
// and Use (the packed operands; reused across calls, so no allocation per step).
// kBackwardShared is the calling thread's, which all threads of a parallel
// region read.
enum class Use { kForward, kBackward, kBackwardShared };
template <class T, Use U> T* scratch(size_t n) {
  static thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Rows r0..r1 of D values, ld apart, set to 0.
template <class T> void clear_rows(T* p, size_t ld, int r0, int r1, int D) {
  for (int r = r0; r < r1; ++r) std::fill(p + (size_t)r * ld, p + (size_t)r * ld + D, T(0));
}

// Causal blocks cost in proportion to what they see: row block i of n sees
// about i + 1 key blocks, key block i about n - i row blocks. A unit takes
// blocks j and n - 1 - j, so the units cost about the same and a static split over
// (b, head, unit) balances at any thread count, each thread's units still
// consecutive (a head's packed operands stay in its cache). A static split
// of single blocks gave a thread a head's last blocks: 1.5x the mean work at
// 1 x 2048 with 8 heads on 16 threads; handing blocks out one by one
// (dynamic) balanced but cost 0.85-0.91x on lm-small (two cores each read
// every head's operands).
inline int folded_units(int n) { return (n + 1) / 2; }
template <class F> void for_folded_pair(int j, int n, F&& block) {
  block(j);
  if (n - 1 - j != j) block(n - 1 - j);
}

// S = scale Q K^T, P = softmax(S), O = P V, per (b, h, block of kQB query
// rows) against the keys the block can see. K^T and V are packed once per
// (b, kv head) for every query head and block that reads them.
template <class T>
void forward(T* out, T* att, T* lse, const T* q, const T* k, const T* v, int B, int Tq, int Tk, int Hq, int Hkv,
                  int D, int q_pos0, int k_pos0, const int32_t* doc_start) {
  const int G = Hq / Hkv;
  const T scale = T(1) / std::sqrt(T(D));
  const int off = q_pos0 - k_pos0;
  const int nqb = (Tq + kQB - 1) / kQB;
  const int ldq = Hq * D, ldk = Hkv * D;
  constexpr int PC = kPanelCols<T>;
  const size_t kt_size = packed_size<T>(D, Tk), v_size = packed_size<T>(Tk, D);
  T* packed = scratch<T, Use::kForward>((size_t)B * Hkv * (kt_size + v_size));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int hk = 0; hk < Hkv; ++hk) {
      T* kt = packed + ((size_t)b * Hkv + hk) * (kt_size + v_size);
      pack_transposed(kt, k + (size_t)b * Tk * ldk + (size_t)hk * D, ldk, Tk, D);
      pack_rows(kt + kt_size, v + (size_t)b * Tk * ldk + (size_t)hk * D, ldk, Tk, D);
    }
  // Per (b, h), the row blocks in folded pairs (for_folded_pair).
#pragma omp parallel for collapse(3) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int j = 0; j < folded_units(nqb); ++j)
        for_folded_pair(j, nqb, [&](int qb) {
          const int t0 = qb * kQB, t1 = std::min(Tq, t0 + kQB), nr = t1 - t0;
          const int hk = h / G;
          const T* qh = q + (size_t)b * Tq * ldq + (size_t)h * D;
          const T* kt = packed + ((size_t)b * Hkv + hk) * (kt_size + v_size);  // K^T [D, Tk], then V [Tk, D]
          T* oh = out + (size_t)b * Tq * ldq + (size_t)h * D;
          T* P = att + ((size_t)b * Hq + h) * Tq * Tk;
          T* lh = lse ? lse + ((size_t)b * Hq + h) * Tq : nullptr;
          const int kend = std::min(Tk, t1 + off);  // the keys some row of the block sees
          if (kend > 0)
            block_gemm<T>(false, nr, kend, D, scale, qh + (size_t)t0 * ldq, ldq, 1, kt, (size_t)D * PC,
                          P + (size_t)t0 * Tk, Tk, {.out_diag = t0 + off});
          causal_softmax_rows(P, Tk, lh, t0, t1, off, Tk, doc_start ? doc_start + (size_t)b * Tq : nullptr, k_pos0);
          if (kend > 0) {
            block_gemm<T>(false, nr, D, kend, T(1), P + (size_t)t0 * Tk, Tk, 1, kt + kt_size, (size_t)Tk * PC,
                          oh + (size_t)t0 * ldq, ldq, {.k_end_diag = t0 + off});
          } else {
            clear_rows(oh, ldq, t0, t1, D);
          }
        });
}

// S = scale Q K^T, P = softmax(S), O = P V. With dP = dO V^T:
//   dS[t,s] = P[t,s] (dP[t,s] - sum_s' P[t,s'] dP[t,s'])
//   dQ += scale dS K ; dK += scale dS^T Q ; dV += P^T dO.
// Two ways to spread the work over threads, with the same bits (each element
// of dS is the same sum, and each gradient element sums the same terms in the
// same order):
//  - per KV head: units (b, kv head), the query heads of the group in order.
//    dS lives one row block at a time and feeds all three products: the least
//    work, but only B * Hkv units (16 for lm-small at 8 x 256, Hkv at
//    micro-batch 1), too few for a machine with more cores;
//  - per block: units (b, query head, query block) compute dS and add dQ and
//    keep each row's delta, then units (b, kv head, key block) compute dP
//    again for their keys (delta known) and add dK and dV, as CUDA's dQ and
//    dK/dV kernels split it (flash_attention_bwd.cu). dP is computed twice
//    and P read twice, but the units number B * (Hq + Hkv) * T / kQB.
// delta (null: computed from this block) holds the row sums
// sum_s' P[t,s'] dP[t,s'] over every key of the row, for a block that holds
// only some of them (context parallelism). With overwrite, dq, dk and dv are
// written, not added into: a unit clears its dK and dV rows before its first
// product (they are then hot for the adds), and dQ's product writes its rows.
enum class Units { kAuto, kPerKvHead, kPerBlock };

// The per-block units cost about kPerBlockWork times the per-KV-head ones'
// work (one thread, D = 64, T = 256..2048: 1.35-1.42x; docs/PERFORMANCE.md);
// they pay when the B * Hkv per-KV-head units leave enough threads idle:
// per-block when units * kPerBlockWork < ceil(units / threads) * threads.
// The bits are the same either way, so the thread count never changes them.
inline constexpr double kPerBlockWork = 1.4;
inline bool backward_per_block(int units, int threads) {
  if (threads <= 1 || units <= 0) return false;
  const int rounds = (units + threads - 1) / threads;
  return units * kPerBlockWork < (double)rounds * threads;
}

// One row block's dS (rows t0..t1 of P's slice, keys [0, kend), row stride
// Tk): dP = dO V^T (dout_rows: the block's first row of dO, ldq apart; vt: V^T
// packed), then dS = P (dP - delta) in place, 0 from the diagonal up to kend.
// A row's delta is given[t] or, when given is null, its own sum_s P dP over
// the keys it sees (then also written to kept[t] when kept is non-null). Both
// layouts form dS here, so its bits are one.
template <class T>
void row_block_ds(T* dS, const T* dout_rows, int ldq, const T* vt, int D, const T* P, int Tk, int t0, int t1, int kend,
                  int off, const T* given, T* kept) {
  block_gemm<T>(false, t1 - t0, kend, D, T(1), dout_rows, ldq, 1, vt, (size_t)D * kPanelCols<T>, dS, Tk,
                {.out_diag = t0 + off});  // dP
  for (int t = t0; t < t1; ++t) {
    const T* pr = P + (size_t)t * Tk;
    T* r = dS + (size_t)(t - t0) * Tk;
    const int hi = std::clamp(t + off + 1, 0, Tk);  // the columns the causal mask leaves
    T dot;
    if (given) {
      dot = given[t];
    } else {
      dot = row_dot(pr, r, hi);
      if (kept) kept[t] = dot;
    }
    for (int s = 0; s < hi; ++s) r[s] = pr[s] * (r[s] - dot);
    for (int s = hi; s < kend; ++s) r[s] = T(0);
  }
}

// The per-KV-head form (see Units).
template <class T>
void backward_per_kv_head(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* att, int B,
                          int Tq, int Tk, int Hq, int Hkv, int D, int off, const T* delta, bool overwrite) {
  const int G = Hq / Hkv;
  const T scale = T(1) / std::sqrt(T(D));
  const int ldq = Hq * D, ldk = Hkv * D;
  const bool need_ds = dq || dk;
  constexpr int PC = kPanelCols<T>;
  // Per unit: V^T [D, Tk] (for dP), K [Tk, D] (dQ), and per query head Q and
  // dO [Tq, D] (dK, dV), packed once. Q and dO are read where they lie when
  // their rows are whole panels (D a multiple of kPanelCols: block_gemm's
  // ldb), which is what packing them would copy (lm-small on a Zen 5 core:
  // the copies were 11% of the backward).
  const bool q_in_place = D % PC == 0;
  const size_t q_pstride = q_in_place ? PC : (size_t)Tq * PC, q_ld = q_in_place ? ldq : PC;
  const size_t vt_size = packed_size<T>(D, Tk), k_size = packed_size<T>(Tk, D), q_size = packed_size<T>(Tq, D);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int hk = 0; hk < Hkv; ++hk) {
      const T* kh = k + (size_t)b * Tk * ldk + (size_t)hk * D;
      const T* vh = v + (size_t)b * Tk * ldk + (size_t)hk * D;
      T* dkh = dk ? dk + (size_t)b * Tk * ldk + (size_t)hk * D : nullptr;
      T* dvh = dv ? dv + (size_t)b * Tk * ldk + (size_t)hk * D : nullptr;
      T* vt = scratch<T, Use::kBackward>(vt_size + k_size + 2 * q_size + (size_t)kQB * Tk);
      T* kp = vt + vt_size;
      T* qp = kp + k_size;
      T* dop = qp + q_size;
      T* dS = dop + q_size;  // one row block's dS [kQB, Tk], hot in L2 for all four products
      if (need_ds) pack_transposed(vt, vh, ldk, Tk, D);
      if (dq) pack_rows(kp, kh, ldk, Tk, D);
      if (overwrite && dkh) clear_rows(dkh, ldk, 0, Tk, D);
      if (overwrite && dvh) clear_rows(dvh, ldk, 0, Tk, D);
      for (int g = 0; g < G; ++g) {
        const int h = hk * G + g;
        const size_t qoff = (size_t)b * Tq * ldq + (size_t)h * D;
        const T* P = att + ((size_t)b * Hq + h) * Tq * Tk;
        if (dk && !q_in_place) pack_rows(qp, q + qoff, ldq, Tq, D);
        if (dv && !q_in_place) pack_rows(dop, dout + qoff, ldq, Tq, D);
        const T* qrows = q_in_place ? q + qoff : qp;  // row t at qrows + t * q_ld
        const T* dorows = q_in_place ? dout + qoff : dop;
        // Per block of query rows, against the keys [0, kend) it sees: dP and
        // dS, then dQ += dS K (its rows), dK += dS^T Q and dV += P^T dO (its
        // columns: each row block adds its part, in order).
        for (int t0 = 0; t0 < Tq; t0 += kQB) {
          const int t1 = std::min(Tq, t0 + kQB), nr = t1 - t0;
          const int kend = std::min(Tk, t1 + off);
          if (kend <= 0) {  // no row of the block sees a key: nothing to add
            if (dq && overwrite) clear_rows(dq + qoff, ldq, t0, t1, D);
            continue;
          }
          const T* Pb = P + (size_t)t0 * Tk;
          if (need_ds)
            row_block_ds(dS, dout + qoff + (size_t)t0 * ldq, ldq, vt, D, P, Tk, t0, t1, kend, off,
                         delta ? delta + ((size_t)b * Hq + h) * Tq : nullptr, (T*)nullptr);
          if (dq)
            block_gemm<T>(!overwrite, nr, D, kend, scale, dS, Tk, 1, kp, (size_t)Tk * PC, dq + qoff + (size_t)t0 * ldq,
                          ldq, {.k_end_diag = t0 + off});
          // Key s gets the rows t >= s - off of the block.
          const CausalSkip seen_from{.k_begin_diag = -off - t0};
          if (dk)
            block_gemm<T>(true, kend, D, nr, scale, dS, 1, Tk, qrows + (size_t)t0 * q_ld, q_pstride, dkh, ldk,
                          seen_from, q_ld);
          if (dv)
            block_gemm<T>(true, kend, D, nr, T(1), Pb, 1, Tk, dorows + (size_t)t0 * q_ld, q_pstride, dvh, ldk,
                          seen_from, q_ld);
        }
      }
    }
  }
}

// The per-block form (see Units): packs K, V^T, Q and dO once for every
// unit, then the row units (dQ, delta), then the key units (dK, dV).
template <class T>
void backward_per_block(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* att, int B,
                        int Tq, int Tk, int Hq, int Hkv, int D, int off, const T* delta, bool overwrite) {
  const int G = Hq / Hkv;
  const T scale = T(1) / std::sqrt(T(D));
  const int ldq = Hq * D, ldk = Hkv * D;
  const bool need_ds = dq || dk;
  constexpr int PC = kPanelCols<T>;
  static_assert(kQB % PC == 0, "a key block starts at a packed panel");
  const int nqb = (Tq + kQB - 1) / kQB, nkb = (Tk + kQB - 1) / kQB;
  // Shared: per (b, kv head) V^T [D, Tk] and K [Tk, D]; per (b, query head)
  // Q and dO [Tq, D]; then each row's delta [B, Hq, Tq] unless given.
  const size_t vt_size = packed_size<T>(D, Tk), k_size = packed_size<T>(Tk, D), q_size = packed_size<T>(Tq, D);
  const size_t kv_stride = vt_size + k_size, qd_stride = 2 * q_size;
  T* kvp = scratch<T, Use::kBackwardShared>((size_t)B * Hkv * kv_stride + (size_t)B * Hq * qd_stride +
                                            (delta ? 0 : (size_t)B * Hq * Tq));
  T* qdp = kvp + (size_t)B * Hkv * kv_stride;
  T* row_delta = qdp + (size_t)B * Hq * qd_stride;
  const T* deltas = delta ? delta : row_delta;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int u = 0; u < Hkv + Hq; ++u) {
      if (u < Hkv) {
        T* vt = kvp + ((size_t)b * Hkv + u) * kv_stride;
        const size_t at = (size_t)b * Tk * ldk + (size_t)u * D;
        if (need_ds) pack_transposed(vt, v + at, ldk, Tk, D);
        if (dq) pack_rows(vt + vt_size, k + at, ldk, Tk, D);
      } else {
        const int h = u - Hkv;
        T* qp = qdp + ((size_t)b * Hq + h) * qd_stride;
        const size_t at = (size_t)b * Tq * ldq + (size_t)h * D;
        if (dk) pack_rows(qp, q + at, ldq, Tq, D);
        if (dv) pack_rows(qp + q_size, dout + at, ldq, Tq, D);
      }
    }
  // Row units: per (b, h), folded pairs of row blocks (for_folded_pair): dP
  // and dS of the block's rows against the keys [0, kend) they see, then dQ
  // (its rows); the rows' delta kept.
  if (dq || (dk && !delta)) {
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < Hq; ++h)
        for (int j = 0; j < folded_units(nqb); ++j)
          for_folded_pair(j, nqb, [&](int qb) {
            const int t0 = qb * kQB, t1 = std::min(Tq, t0 + kQB), nr = t1 - t0;
            const int kend = std::min(Tk, t1 + off);
            const size_t qoff = (size_t)b * Tq * ldq + (size_t)h * D;
            if (kend <= 0) {
              if (dq && overwrite) clear_rows(dq + qoff, ldq, t0, t1, D);
              return;
            }
            const T* vt = kvp + ((size_t)b * Hkv + h / G) * kv_stride;
            const T* P = att + ((size_t)b * Hq + h) * Tq * Tk;
            T* dS = scratch<T, Use::kBackward>((size_t)kQB * Tk);
            const size_t rows = ((size_t)b * Hq + h) * Tq;  // this head's rows of delta
            row_block_ds(dS, dout + qoff + (size_t)t0 * ldq, ldq, vt, D, P, Tk, t0, t1, kend, off,
                         delta ? delta + rows : nullptr, delta ? nullptr : row_delta + rows);
            if (dq)
              block_gemm<T>(!overwrite, nr, D, kend, scale, dS, Tk, 1, vt + vt_size, (size_t)Tk * PC,
                            dq + qoff + (size_t)t0 * ldq, ldq, {.k_end_diag = t0 + off});
          });
  }
  if (!dk && !dv) return;
  // Key units: per (b, kv head), folded pairs of key blocks: per query head
  // of the group and row block that sees some of the keys [s0, s1), dP and
  // dS of that tile again, then dK and dV of those keys (the row blocks add
  // in order, as per KV head).
#pragma omp parallel for collapse(3) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int hk = 0; hk < Hkv; ++hk)
      for (int j = 0; j < folded_units(nkb); ++j)
        for_folded_pair(j, nkb, [&](int kb) {
          const int s0 = kb * kQB, s1 = std::min(Tk, s0 + kQB);
          const size_t kvoff = (size_t)b * Tk * ldk + (size_t)hk * D;
          T* dkh = dk ? dk + kvoff : nullptr;
          T* dvh = dv ? dv + kvoff : nullptr;
          if (overwrite && dkh) clear_rows(dkh, ldk, s0, s1, D);
          if (overwrite && dvh) clear_rows(dvh, ldk, s0, s1, D);
          const T* vt = kvp + ((size_t)b * Hkv + hk) * kv_stride + (size_t)(s0 / PC) * D * PC;  // V^T's columns s0..
          T* dS = scratch<T, Use::kBackward>((size_t)kQB * kQB);
          for (int g = 0; g < G; ++g) {
            const int h = hk * G + g;
            const size_t qoff = (size_t)b * Tq * ldq + (size_t)h * D;
            const T* P = att + ((size_t)b * Hq + h) * Tq * Tk;
            const T* qp = qdp + ((size_t)b * Hq + h) * qd_stride;
            const T* hd = deltas + ((size_t)b * Hq + h) * Tq;
            for (int t0 = 0; t0 < Tq; t0 += kQB) {
              const int t1 = std::min(Tq, t0 + kQB), nr = t1 - t0;
              const int nc = std::min(s1, std::min(Tk, t1 + off)) - s0;  // keys of the block some row sees
              if (nc <= 0) continue;
              const CausalSkip seen_from{.k_begin_diag = s0 - off - t0};  // key s0 + i gets rows t >= s0 + i - off
              if (dk) {
                block_gemm<T>(false, nr, nc, D, T(1), dout + qoff + (size_t)t0 * ldq, ldq, 1, vt, (size_t)D * PC, dS,
                              kQB, {.out_diag = t0 + off - s0});  // dP
                for (int t = t0; t < t1; ++t) {
                  const T* pr = P + (size_t)t * Tk + s0;
                  T* r = dS + (size_t)(t - t0) * kQB;
                  const int e = std::clamp(t + off + 1 - s0, 0, nc);
                  const T dot = hd[t];
                  for (int s = 0; s < e; ++s) r[s] = pr[s] * (r[s] - dot);
                  for (int s = e; s < nc; ++s) r[s] = T(0);
                }
                block_gemm<T>(true, nc, D, nr, scale, dS, 1, kQB, qp + (size_t)t0 * PC, (size_t)Tq * PC,
                              dkh + (size_t)s0 * ldk, ldk, seen_from);
              }
              if (dv)
                block_gemm<T>(true, nc, D, nr, T(1), P + (size_t)t0 * Tk + s0, 1, Tk, qp + q_size + (size_t)t0 * PC,
                              (size_t)Tq * PC, dvh + (size_t)s0 * ldk, ldk, seen_from);
            }
          }
        });
}

template <class T>
void backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* att, int B, int Tq,
              int Tk, int Hq, int Hkv, int D, int off, const T* delta, bool overwrite, Units units = Units::kAuto) {
  if (units == Units::kAuto) {
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    units = backward_per_block(B * Hkv, threads) ? Units::kPerBlock : Units::kPerKvHead;
  }
  if (units == Units::kPerBlock)
    backward_per_block<T>(dq, dk, dv, dout, q, k, v, att, B, Tq, Tk, Hq, Hkv, D, off, delta, overwrite);
  else
    backward_per_kv_head<T>(dq, dk, dv, dout, q, k, v, att, B, Tq, Tk, Hq, Hkv, D, off, delta, overwrite);
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
  a::forward<T>(out, att, lse, q, k, v, B, Tq, Tk, Hq, Hkv, D, q_pos0, k_pos0, doc_start);
}

// The backward of the general form (att as its forward wrote it); dS lives
// one row block at a time in a per-thread buffer that stays in L2, so no
// scratch of att's shape is needed. When the keys of a row are
// split over several blocks (context parallelism: att then holds each block's
// part of the whole row's probabilities), delta [B, Hq, Tq] must hold the
// whole row's sum_s P dP, which equals sum_d dO O (attention_row_delta);
// null computes it from this block's keys, which is right when they are all.
// The gradients are added into dq, dk and dv, or with overwrite written
// (whatever they held: no zeroing pass before).
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* att, int B,
                        int Tq, int Tk, int Hq, int Hkv, int D, int q_pos0, int k_pos0,
                        const std::type_identity_t<T>* delta = nullptr, bool overwrite = false) {
  static_assert(detail::kSupported<T>);
  namespace a = detail::attn;
  const int off = q_pos0 - k_pos0;
  a::backward<T>(dq, dk, dv, dout, q, k, v, att, B, Tq, Tk, Hq, Hkv, D, off, delta, overwrite);
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

// The training form's backward.
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* att, int B,
                        int Tn, int Hq, int Hkv, int D, bool overwrite = false) {
  attention_backward(dq, dk, dv, dout, q, k, v, att, B, Tn, Tn, Hq, Hkv, D, 0, 0, nullptr, overwrite);
}

}  // namespace kvs::cpu
