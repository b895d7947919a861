// Building blocks shared by the flash attention forward (flash_attention_fwd.cu)
// and backward (flash_attention_bwd.cu): one tensor-core MMA, its register
// fragments read from shared memory (by plain loads or by ldmatrix), and tile
// loads (through registers, or by cp.async). Included by those two files
// only. The inline PTX here is all there is in the kernels: tests/simt/gen.py
// maps each wrapper's instruction to the SIMT emulator's version of it.
//
// The MMA is PTX mma.sync.m16n8k16 (bf16 inputs, fp32 accumulators), issued by
// one warp. With g = lane / 4 ("group") and c = lane % 4 ("column pair"), a
// warp holds its operands as (PTX ISA, "Matrix fragments for mma.m16n8k16"):
//   A 16x16 (row-major), 4 x b32, two bf16 each (low half = lower column):
//     a[0] = A[g][2c..2c+1]   a[1] = A[g+8][2c..2c+1]
//     a[2] = A[g][2c+8..+9]   a[3] = A[g+8][2c+8..+9]
//   B 16x8 (k x n, "col": indexed B[k][n]), 2 x b32:
//     b[0] = B[2c..2c+1][g]   b[1] = B[2c+8..+9][g]
//   C 16x8 fp32, 4 floats:
//     c[0..1] = C[g][2c..2c+1]   c[2..3] = C[g+8][2c..2c+1]
// Two adjacent C tiles (columns 0-7 and 8-15) hold, element for element, the A
// fragment of the 16x16 block they form, so a score tile S computed as C can
// be fed straight back as the A operand of P V (FlashAttention-2's register
// reuse): see a_from_c below.
//
// Shared-memory tiles are [rows][D + kPad] bf16. The 8-element pad makes the
// row stride (D/2 + 4) 32-bit words, which spreads the 8 rows x 4 words that
// a fragment load (or one 8x8 matrix of an ldmatrix) touches over 32
// distinct banks for every D in {16..128}, and keeps every row 16-byte
// aligned for the vectorised tile loads, cp.async and ldmatrix.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"  // AttentionDocs

namespace kvs::cuda::flash {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 8;
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
constexpr int row_stride() {
  return D + kPad;
}

// c += a * b (one warp, m16n8k16, bf16 x bf16 -> fp32). Not volatile: a pure
// function of its operands, so the compiler may schedule it freely.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldmatrix.x4: four 8x8 bf16 matrices from shared memory in one instruction.
// Lane l gives the address `p` of row l % 8 of matrix l / 8 (16 bytes, 16-byte
// aligned); r[i] receives matrix i's elements (l / 4, 2 (l % 4) and + 1), the
// layout of one mma A or B register, or with .trans those of the transposed
// matrix: (2 (l % 4) and + 1, l / 4). Volatile: it reads shared memory that
// __syncthreads orders.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
}

// cp.async (sm_80+): 16 bytes global -> shared without passing through
// registers, so the copy runs while the thread computes. The first src_bytes
// (0 or 16) are read, the rest of the 16 are zero-filled. A copy belongs to the
// group the next cp_async_commit closes; cp_async_wait<N> returns when every
// committed group but the N most recent has landed (in this thread's view:
// other threads see them after a __syncthreads that follows their waits).
__device__ __forceinline__ void cp_async_16(bf16* dst, const bf16* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Two floats -> one b32 of two bf16 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Two adjacent bf16 in shared memory (4-byte aligned) as one b32.
__device__ __forceinline__ uint32_t ld_pair(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Two bf16 from different rows (p[0] low, p[step] high) as one b32.
__device__ __forceinline__ uint32_t ld_pair_strided(const bf16* p, int step) {
  const uint32_t lo = *reinterpret_cast<const uint16_t*>(p);
  const uint32_t hi = *reinterpret_cast<const uint16_t*>(p + step);
  return lo | (hi << 16);
}

// A fragment of the 16x16 block of a [rows][LDS] smem tile whose top-left
// element is `s` (the block's rows are contiguous in k, i.e. A[r][k] = s[r*LDS + k]).
template <int LDS>
__device__ __forceinline__ void ld_a(uint32_t (&a)[4], const bf16* s, int g, int c) {
  a[0] = ld_pair(s + g * LDS + 2 * c);
  a[1] = ld_pair(s + (g + 8) * LDS + 2 * c);
  a[2] = ld_pair(s + g * LDS + 2 * c + 8);
  a[3] = ld_pair(s + (g + 8) * LDS + 2 * c + 8);
}

// B fragment (16 k x 8 n) where B[k][n] = s[n*LDS + k]: the 8 n are rows of the
// smem tile, k runs along a row (K for Q K^T, dO for dP = dO V^T, ...).
template <int LDS>
__device__ __forceinline__ void ld_b_rows(uint32_t& b0, uint32_t& b1, const bf16* s, int g, int c) {
  b0 = ld_pair(s + g * LDS + 2 * c);
  b1 = ld_pair(s + g * LDS + 2 * c + 8);
}

// B fragment (16 k x 8 n) where B[k][n] = s[k*LDS + n]: k runs down the rows of
// the smem tile (V for P V, K for dS K, Q for dS^T Q, dO for P^T dO).
template <int LDS>
__device__ __forceinline__ void ld_b_cols(uint32_t& b0, uint32_t& b1, const bf16* s, int g, int c) {
  const bf16* p = s + (2 * c) * LDS + g;
  b0 = ld_pair_strided(p, LDS);
  b1 = ld_pair_strided(p + 8 * LDS, LDS);
}

// The same fragments by ldmatrix, one instruction for what the helpers above
// read in 4 to 8 loads. `lane` is the thread's lane (0..31).
// ld_a's A fragment of the 16x16 block at s.
template <int LDS>
__device__ __forceinline__ void ldsm_a(uint32_t (&a)[4], const bf16* s, int lane) {
  ldsm_x4(a, s + (lane % 16) * LDS + (lane / 16) * 8);
}
// ld_b_rows' B fragments of two adjacent n-tiles: b[0], b[1] for the smem rows
// 0-7 at s, b[2], b[3] for rows 8-15.
template <int LDS>
__device__ __forceinline__ void ldsm_b_rows_x2(uint32_t (&b)[4], const bf16* s, int lane) {
  ldsm_x4(b, s + ((lane / 16) * 8 + lane % 8) * LDS + ((lane / 8) % 2) * 8);
}
// ld_b_cols' B fragments of two adjacent n-tiles: b[0], b[1] for the smem
// columns 0-7 at s, b[2], b[3] for columns 8-15.
template <int LDS>
__device__ __forceinline__ void ldsm_b_cols_x2(uint32_t (&b)[4], const bf16* s, int lane) {
  ldsm_x4_trans(b, s + (((lane / 8) % 2) * 8 + lane % 8) * LDS + (lane / 16) * 8);
}

// The products of the attention kernels, on fragments read either way
// (kLdmatrix: ldmatrix, else the loads above), in the same order, so both
// give the same bits.
// The A fragment of the 16x16 block at s (row-major in k).
template <int LDS, bool kLdmatrix>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* s, int lane) {
  if constexpr (kLdmatrix)
    ldsm_a<LDS>(a, s, lane);
  else
    ld_a<LDS>(a, s, lane / 4, lane % 4);
}
// acc[j] += A B_j for j < NJ, where B_j[k][n] = s[(8 j + n) LDS + k]: the n run
// down the smem rows (K for Q K^T, ...), k along them.
template <int NJ, int LDS, bool kLdmatrix>
__device__ __forceinline__ void mma_b_rows(float (&acc)[NJ][4], const uint32_t (&a)[4], const bf16* s, int lane) {
  if constexpr (kLdmatrix) {
    static_assert(NJ % 2 == 0, "ldmatrix.x4 reads two n-tiles at a time");
#pragma unroll
    for (int j = 0; j < NJ; j += 2) {
      uint32_t b[4];
      ldsm_b_rows_x2<LDS>(b, s + (j * 8) * LDS, lane);
      mma_16816(acc[j], a, b[0], b[1]);
      mma_16816(acc[j + 1], a, b[2], b[3]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      uint32_t b0, b1;
      ld_b_rows<LDS>(b0, b1, s + (j * 8) * LDS, lane / 4, lane % 4);
      mma_16816(acc[j], a, b0, b1);
    }
  }
}
// acc[n] += A B_n for n < NN, where B_n[k][m] = s[k LDS + 8 n + m]: k runs down
// the smem rows (V for P V, K for dS K, ...).
template <int NN, int LDS, bool kLdmatrix>
__device__ __forceinline__ void mma_b_cols(float (&acc)[NN][4], const uint32_t (&a)[4], const bf16* s, int lane) {
  if constexpr (kLdmatrix) {
    static_assert(NN % 2 == 0, "ldmatrix.x4 reads two n-tiles at a time");
#pragma unroll
    for (int n = 0; n < NN; n += 2) {
      uint32_t b[4];
      ldsm_b_cols_x2<LDS>(b, s + n * 8, lane);
      mma_16816(acc[n], a, b[0], b[1]);
      mma_16816(acc[n + 1], a, b[2], b[3]);
    }
  } else {
#pragma unroll
    for (int n = 0; n < NN; ++n) {
      uint32_t b0, b1;
      ld_b_cols<LDS>(b0, b1, s + n * 8, lane / 4, lane % 4);
      mma_16816(acc[n], a, b0, b1);
    }
  }
}

// The A fragment (16 rows x 16 k) made of two adjacent fp32 C tiles lo (k 0-7)
// and hi (k 8-15), rounded to bf16.
__device__ __forceinline__ void a_from_c(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// Copies rows [r0, r0 + R) of a [T, D] slice (row stride ld elements; `src`
// points at row 0, column 0 of the head) into the smem tile s [R][D + kPad],
// 16 bytes per thread and step. Rows >= T are zero-filled: a zero K/V/Q/dO row
// contributes nothing (and never a NaN) to any product, so the partial last
// tile needs no other special case in the loads. All kThreads threads call it.
template <int R, int D>
__device__ __forceinline__ void load_tile(bf16* s, const bf16* src, size_t ld, int r0, int T) {
  constexpr int kChunksPerRow = D / 8;  // 8 bf16 = 16 bytes
  constexpr int kChunks = R * kChunksPerRow;
  constexpr int kLds = row_stride<D>();
#pragma unroll
  for (int it = 0; it < (kChunks + kThreads - 1) / kThreads; ++it) {
    const int i = it * kThreads + static_cast<int>(threadIdx.x);
    if (kChunks % kThreads == 0 || i < kChunks) {
      const int r = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (r0 + r < T) v = *reinterpret_cast<const uint4*>(src + static_cast<size_t>(r0 + r) * ld + col);
      *reinterpret_cast<uint4*>(s + r * kLds + col) = v;
    }
  }
}

// load_tile by cp.async: the same rows into the same layout, rows >= T
// zero-filled, issued but not waited for (the caller commits and waits).
template <int R, int D>
__device__ __forceinline__ void load_tile_async(bf16* s, const bf16* src, size_t ld, int r0, int T) {
  constexpr int kChunksPerRow = D / 8;
  constexpr int kChunks = R * kChunksPerRow;
  constexpr int kLds = row_stride<D>();
#pragma unroll
  for (int it = 0; it < (kChunks + kThreads - 1) / kThreads; ++it) {
    const int i = it * kThreads + static_cast<int>(threadIdx.x);
    if (kChunks % kThreads == 0 || i < kChunks) {
      const int r = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
      const bool in = r0 + r < T;  // outside: no bytes read, from a valid address all the same
      cp_async_16(s + r * kLds + col, src + static_cast<size_t>(in ? r0 + r : 0) * ld + col, in ? 16 : 0);
    }
  }
}

// Writes a warp's 16 x D fp32 accumulator (NT = D/8 C tiles, rows row0 + g and
// row0 + g + 8 of the [T, D] slice at `dst`, row stride ld), times `mul`, as
// bf16; rows >= T are skipped.
template <int NT>
__device__ __forceinline__ void store_rows(bf16* dst, size_t ld, const float (&acc)[NT][4], float mul0, float mul1,
                                           int row0, int T, int g, int c) {
  const int ra = row0 + g, rb = row0 + g + 8;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    if (ra < T)
      *reinterpret_cast<uint32_t*>(dst + static_cast<size_t>(ra) * ld + n * 8 + 2 * c) =
          pack_bf16(acc[n][0] * mul0, acc[n][1] * mul0);
    if (rb < T)
      *reinterpret_cast<uint32_t*>(dst + static_cast<size_t>(rb) * ld + n * 8 + 2 * c) =
          pack_bf16(acc[n][2] * mul1, acc[n][3] * mul1);
  }
}

// The forward's online softmax over one tile of BK = 8 NK keys starting at k0,
// for a warp's 16 rows (first_row = the first; row[r] the thread's rows g and
// g + 8): the causal mask (and keys past T) where a key can exceed a row,
// i.e. on the diagonal tile; per row, the new max over the quad, l rescaled
// by alpha = exp(scale (m_old - m_new)), and S replaced by P = exp(scale
// (S - m)). m is in raw (unscaled) score units, l a per-thread partial sum.
// O's rescale by alpha is rescale_rows, kept apart so that a kernel can run it
// after a product still accumulating into O (the Hopper forward's overlap).
// Element e of s[j] is row row[e / 2], key k0 + 8 j + 2 c + e % 2 (the C
// layout of mma.m16n8k16 and of wgmma alike).
template <int NK>
__device__ __forceinline__ void softmax_scores(float (&s)[NK][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                               const int (&row)[2], int k0, int first_row, int c, bool causal, int T,
                                               float scale_log2) {
  constexpr int BK = 8 * NK;
  if ((causal && k0 + BK - 1 > first_row) || k0 + BK > T) {
#pragma unroll
    for (int j = 0; j < NK; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + j * 8 + 2 * c + (e & 1);
        if ((causal && key > row[e >> 1]) || key >= T) s[j][e] = -INFINITY;
      }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = m[r];
#pragma unroll
    for (int j = 0; j < NK; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // A row with no visible key yet keeps mx = -inf; offset 0 then makes
    // every exp2 below exp2(-inf) = 0 instead of NaN.
    // Both products are rounded (__fmul_rn, never contracted): a row whose
    // max did not move gets alpha = exp2(0) = 1 exactly. nvcc contracted
    // m * scale_log2 - offset into one fma, whose result is the product's
    // rounding error: alpha = 1 + 1 ulp moved l's last bit on such tiles (the
    // masked tiles of the wider Hopper blocks, which then missed the
    // one-warpgroup kernel's lse bits on an H200).
    const float offset = mx == -INFINITY ? 0.f : __fmul_rn(mx, scale_log2);
    alpha[r] = exp2f(__fmul_rn(m[r], scale_log2) - offset);  // m = -inf: 0
    m[r] = mx;
    l[r] *= alpha[r];
#pragma unroll
    for (int j = 0; j < NK; ++j) {
      s[j][2 * r] = exp2f(fmaf(s[j][2 * r], scale_log2, -offset));
      s[j][2 * r + 1] = exp2f(fmaf(s[j][2 * r + 1], scale_log2, -offset));
      l[r] += s[j][2 * r] + s[j][2 * r + 1];
    }
  }
}

// O's rows times softmax_scores' alpha (row g: elements 0, 1; row g + 8: 2, 3).
template <int ND>
__device__ __forceinline__ void rescale_rows(float (&o)[ND][4], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < ND; ++n) {
    o[n][0] *= alpha[0];
    o[n][1] *= alpha[0];
    o[n][2] *= alpha[1];
    o[n][3] *= alpha[1];
  }
}

// softmax_scores, then O rescaled at once (the kernels without overlap).
template <int NK, int ND>
__device__ __forceinline__ void softmax_tile(float (&s)[NK][4], float (&o)[ND][4], float (&m)[2], float (&l)[2],
                                             const int (&row)[2], int k0, int first_row, int c, bool causal, int T,
                                             float scale_log2) {
  float alpha[2];
  softmax_scores<NK>(s, m, l, alpha, row, k0, first_row, c, causal, T, scale_log2);
  rescale_rows<ND>(o, alpha);
}

// Document masks (model.document_boundaries "shift_and_attention"): a query
// sees only the keys of its own document, from doc[query] (the row its
// document starts at; the starts rise along a sequence) to itself. The
// kernels take them as a template switch (kDocs), so the kernels without
// documents are the same code as before. A masked score becomes -inf before
// the softmax (forward) or before P is formed again (backward), which makes
// its probability exactly 0.
//
// doc counts rows in the queries' coordinates; key j is row key_row0 + j
// there. On one GPU key_row0 = 0. In ring attention (context parallelism) a
// block attends one chunk's queries to another's keys, and key_row0 is how
// far the key chunk starts from the query chunk ((kc - qc) Tc, <= 0): so
// query t sees key j iff key_row0 + j >= doc[t], and a query whose document
// starts after the key chunk sees none of it (its lse is -inf, its output 0).
//
// A warp's 16 rows x 8 NK keys from k0 (element e of s[j] is row e / 2's key
// k0 + 8 j + 2 c + e % 2): -inf where the key lies before lo[row] (lo in key
// rows: document_starts).
template <int NK>
__device__ __forceinline__ void mask_before_documents(float (&s)[NK][4], const int (&lo)[2], int k0, int c) {
  if (k0 >= max(lo[0], lo[1])) return;
#pragma unroll
  for (int j = 0; j < NK; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (k0 + j * 8 + 2 * c + (e & 1) < lo[e >> 1]) s[j][e] = -INFINITY;
}
// The dK/dV kernels' form, on a warp's transposed scores (16 keys x 8 NQ
// queries from q0; element e of st[j] is key key[e / 2], query q0 + 8 j + 2 c
// + e % 2): -inf where the key lies before its query's document.
template <int NQ>
__device__ __forceinline__ void mask_before_documents_transposed(float (&st)[NQ][4], const int32_t* doc, int b, int T,
                                                                 int key_row0, const int (&key)[2], int q0, int c) {
#pragma unroll
  for (int j = 0; j < NQ; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int qq = q0 + j * 8 + 2 * c + h;
      const int lo = qq < T ? doc[static_cast<size_t>(b) * T + qq] - key_row0 : 0;
      if (key[0] < lo) st[j][h] = -INFINITY;
      if (key[1] < lo) st[j][2 + h] = -INFINITY;
    }
}
// The first query in [first, T) whose document starts after key `last` (a
// key row: T if none): the starts rise along a sequence, so no query from
// there on sees it.
__device__ __forceinline__ int first_query_after(const int32_t* doc, int b, int T, int first, int last, int key_row0) {
  const int32_t* d = doc + static_cast<size_t>(b) * T;
  const int after = key_row0 + last;  // in doc's coordinates
  int lo = first, hi = T;  // the answer lies in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (d[mid] > after)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}
// The first key tile (of BK keys) that query row q0 (a block's first row: the
// earliest document start of the block's rows) can see; past the last tile
// when its document starts after every key.
template <int BK>
__device__ __forceinline__ int first_key_tile(const int32_t* doc, int b, int T, int q0, int key_row0) {
  return max(0, doc[static_cast<size_t>(b) * T + q0] - key_row0) / BK;
}
// The document start of each of a thread's two rows as a key row (0 past T:
// padding rows).
__device__ __forceinline__ void document_starts(int (&lo)[2], const int32_t* doc, int b, int T, const int (&row)[2],
                                                int key_row0) {
#pragma unroll
  for (int r = 0; r < 2; ++r) lo[r] = row[r] < T ? doc[static_cast<size_t>(b) * T + row[r]] - key_row0 : 0;
}

// The forward's end for a warp's 16 rows (first_row the first): l summed over
// the quad, out = O / l (bf16, rows >= T skipped), lse = scale m + log l.
template <int ND>
__device__ __forceinline__ void finish_rows(bf16* out, float* lse, const float (&o)[ND][4], const float (&m)[2],
                                            float (&l)[2], const int (&row)[2], int b, int h, int Hq, int T,
                                            int first_row, int g, int c, float scale) {
  constexpr int D = 8 * ND;
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = l[r] > 0.f ? 1.f / l[r] : 0.f;
  }
  const size_t ld_out = static_cast<size_t>(Hq) * D;
  bf16* oh = out + static_cast<size_t>(b) * T * ld_out + static_cast<size_t>(h) * D;
  store_rows<ND>(oh, ld_out, o, inv[0], inv[1], first_row, T, g, c);
  if (c == 0) {
    float* lh = lse + (static_cast<size_t>(b) * Hq + h) * T;
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (row[r] < T) lh[row[r]] = m[r] * scale + logf(l[r]);
  }
}

// The backward's bookkeeping, shared by the mma.sync and wgmma kernels.
//
// dQ kernels: lse * log2(e) (+inf past T, so P = 0) and delta of the thread's
// two rows of (b, h).
__device__ __forceinline__ void bwd_row_stats(float (&lse2)[2], float (&dlt)[2], const float* lse, const float* delta,
                                              int b, int h, int Hq, int T, const int (&row)[2]) {
  const float* lse_h = lse + (static_cast<size_t>(b) * Hq + h) * T;
  const float* delta_h = delta + (static_cast<size_t>(b) * Hq + h) * T;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse2[r] = row[r] < T ? lse_h[row[r]] * kLog2e : INFINITY;
    dlt[r] = row[r] < T ? delta_h[row[r]] : 0.f;
  }
}

// dK/dV kernels: the steps of a block of keys from k0 of (b, KV head hk),
// query head gi of the group (outer) and query tile of BQ rows (inner), from
// the key tile on (causal: earlier queries cannot see these keys) up to q_end
// (T, or with documents the first query whose document starts after the
// block's keys: no later one sees them).
struct BwdKvSteps {
  const bf16 *q, *dout;
  const float *lse, *delta;
  int ld_q, T, Hq, G, D, b, hk, BQ, q_first, q_tiles, steps;
  size_t ld_o;  // dO is contiguous [B, T, Hq, D]

  __device__ BwdKvSteps(const bf16* q_, int ld_q_, const bf16* dout_, const float* lse_, const float* delta_, int T_,
                        int Hq_, int G_, int D_, int b_, int hk_, int k0, int BQ_, bool causal, int q_end = -1)
      : q(q_), dout(dout_), lse(lse_), delta(delta_), ld_q(ld_q_), T(T_), Hq(Hq_), G(G_), D(D_), b(b_), hk(hk_),
        BQ(BQ_), q_first(causal ? k0 : 0), q_tiles(((q_end < 0 ? T_ : q_end) - q_first + BQ_ - 1) / BQ_),
        steps(G_ * q_tiles), ld_o(static_cast<size_t>(Hq_) * D_) {
    // No query sees these keys (ring attention with documents): no steps,
    // and q_tiles stays a valid divisor for the prologue's step 0. (q_end < 0:
    // no documents, q_tiles >= 1 already; the kernels without them keep
    // their code.)
    if (q_end >= 0 && q_tiles < 1) q_tiles = 1;
  }
  __device__ int q0(int step) const { return q_first + (step % q_tiles) * BQ; }
  // Column 0 of query head gi of the group in Q and in dO, row 0 of sequence b.
  __device__ const bf16* q_head(int gi) const {
    return q + static_cast<size_t>(b) * T * ld_q + static_cast<size_t>(hk * G + gi) * D;
  }
  __device__ const bf16* do_head(int gi) const {
    return dout + static_cast<size_t>(b) * T * ld_o + static_cast<size_t>(hk * G + gi) * D;
  }
  // lse * log2(e) and delta of row i < BQ of a step (+inf and 0 past T).
  __device__ float lse2_of(int step, int i) const {
    const int t = q0(step) + i;
    return t < T ? stats(lse, step / q_tiles)[t] * kLog2e : INFINITY;
  }
  __device__ float delta_of(int step, int i) const {
    const int t = q0(step) + i;
    return t < T ? stats(delta, step / q_tiles)[t] : 0.f;
  }
  __device__ const float* stats(const float* x, int gi) const {
    return x + (static_cast<size_t>(b) * Hq + hk * G + gi) * T;
  }
};

// The backward's elementwise steps, shared by the mma.sync and wgmma kernels
// (flash_attention_bwd.cu, flash_attention_bwd_sm90.cu).
//
// dK/dV kernels, on a warp's transposed scores S^T (16 keys x 8 NQ queries;
// element e of st[j] is key key[e / 2], query q0 + 8 j + 2 c + e % 2):
// P^T = exp2(S^T scale log2e - lse log2e) in place, 0 where a key exceeds its
// query (band: the warp's last key passes the tile's first query; padded
// queries >= T have lse = +inf, so P = exp2(-inf) = 0 already).
template <int NQ>
__device__ __forceinline__ void bwd_p_transposed(float (&st)[NQ][4], const float* sLse, bool band,
                                                 const int (&key)[2], int q0, int c, float scale_log2) {
#pragma unroll
  for (int j = 0; j < NQ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qi = j * 8 + 2 * c + (e & 1);
      float p = exp2f(fmaf(st[j][e], scale_log2, -sLse[qi]));
      if (band && key[e >> 1] > q0 + qi) p = 0.f;
      st[j][e] = p;
    }
}
// dS^T = P^T (dP^T - delta) into dpt (masked entries have P = 0, so dS = 0 there).
template <int NQ>
__device__ __forceinline__ void bwd_ds_transposed(float (&dpt)[NQ][4], const float (&pt)[NQ][4], const float* sDelta,
                                                  int c) {
#pragma unroll
  for (int j = 0; j < NQ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dpt[j][e] = pt[j][e] * (dpt[j][e] - sDelta[j * 8 + 2 * c + (e & 1)]);
}
// dQ kernels, on a warp's 16 rows x 8 NK keys from k0 (first_row the warp's
// first row; element e of s[j] is row row[e / 2], key k0 + 8 j + 2 c + e % 2):
// dS = P (dP - delta) into s, P = exp2(S scale log2e - lse2) and 0 above the
// diagonal and, without the causal mask, for the keys past T (zero rows).
template <int NK>
__device__ __forceinline__ void bwd_ds(float (&s)[NK][4], const float (&dp)[NK][4], const float (&lse2)[2],
                                       const float (&dlt)[2], const int (&row)[2], int k0, int first_row, int c,
                                       bool causal, int T, float scale_log2) {
  constexpr int BK = 8 * NK;
  const bool diag = causal ? k0 + BK - 1 > first_row : k0 + BK > T;
#pragma unroll
  for (int j = 0; j < NK; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      float p = exp2f(fmaf(s[j][e], scale_log2, -lse2[r]));
      const int key = k0 + j * 8 + 2 * c + (e & 1);
      if (diag && ((causal && key > row[r]) || key >= T)) p = 0.f;
      s[j][e] = p * (dp[j][e] - dlt[r]);
    }
}

// Warpgroups per block of the Hopper kernels `loads` selects (0: not the
// Hopper kernels): kHopper 1, kHopperGroups2 2, kHopperGroups3 3 in the
// forward and 2 in the backward (ops.h).
inline int hopper_groups(FlashLoads loads, bool backward) {
  switch (loads) {
    case FlashLoads::kHopper: return 1;
    case FlashLoads::kHopperGroups2: return 2;
    case FlashLoads::kHopperGroups3: return backward ? 2 : 3;  // launch_bwd_sm90 refuses 3
    default: return 0;
  }
}

// The Hopper kernels (flash_attention_{fwd,bwd}_sm90.cu), D = 64 or 128, with
// `groups` warpgroups per block (hopper_groups).
void launch_fwd_sm90(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B,
                     int T, int Hq, int Hkv, int D, bool causal, cudaStream_t stream, AttentionDocs docs, int groups);
void launch_bwd_sm90(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta,
                     const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq, int Hkv,
                     int D, bool causal, cudaStream_t stream, AttentionDocs docs, int groups);

// Host side: the launchers' argument checks. The vectorised tile loads read 16
// bytes at a time, so every bf16 tensor's base pointer must be 16-byte aligned
// and every row stride a multiple of 8 elements (true for cudaMalloc'd buffers
// and for the Q/K/V column blocks of a fused [N, (Hq + 2 Hkv) D] projection).
// The fp32 tensors (lse, scratch) only need to be non-null.
inline void check_args(const char* who, std::initializer_list<const void*> bf16_ptrs,
                       std::initializer_list<const void*> f32_ptrs, int ld_q, int ld_kv, int B, int T, int Hq, int Hkv,
                       int D) {
  if (B < 0 || T < 0 || Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0)
    ::kvs::fail("{}: bad shape B={} T={} Hq={} Hkv={} (need Hq % Hkv == 0)", who, B, T, Hq, Hkv);
  if (D != 16 && D != 32 && D != 64 && D != 128) ::kvs::fail("{}: head_dim {} not in {{16, 32, 64, 128}}", who, D);
  if (B > 65535 || Hq > 65535)  // gridDim.z = B, gridDim.y = Hq (or Hkv)
    ::kvs::fail("{}: B = {} and Hq = {} must be at most 65535 (grid y/z limits)", who, B, Hq);
  if (ld_q < Hq * D || ld_kv < Hkv * D || ld_q % 8 != 0 || ld_kv % 8 != 0)
    ::kvs::fail("{}: row strides ld_q={} ld_kv={} must be multiples of 8 and at least Hq*D={} / Hkv*D={}", who, ld_q,
                ld_kv, Hq * D, Hkv * D);
  if (B == 0 || T == 0) return;
  for (const void* p : bf16_ptrs)
    if (p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 != 0)
      ::kvs::fail("{}: every bf16 tensor must be non-null and 16-byte aligned", who);
  for (const void* p : f32_ptrs)
    if (p == nullptr) ::kvs::fail("{}: null fp32 tensor (lse / scratch)", who);
}

}  // namespace kvs::cuda::flash
