// Causal flash attention, backward: three deterministic kernels, no atomics.
// The contract is in kernels/cuda/ops.h; the fragment layouts and tile helpers
// are in flash_attention_common.cuh.
//
// With S = Q K^T (raw), P = exp(scale S - lse) (lse saved by the forward),
// dP = dO V^T and delta = rowsum(dO * O) = rowsum(P * dP):
//   dS = P * (dP - delta),  dV = P^T dO,  dK = scale dS^T Q,  dQ = scale dS K.
// FlashAttention-2 accumulates dQ across key tiles with atomics; here dQ gets
// its own pass (dq_kernel), which recomputes S, P, dP and dS once more. That is
// ~1.4x the FLOPs of the fused version but every output element is summed by
// one thread in a fixed order, so the gradients are bit-identical run to run.
#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {
namespace flash {

// delta[b, h, t] = sum_d dO[b, t, h, d] * O[b, t, h, d] in fp32. One warp per
// (b, t, h) row (D contiguous bf16 in both tensors), two elements per lane and
// step, then a warp sum: the pass is memory bound and reads each row once.
__global__ void __launch_bounds__(kThreads) delta_kernel(float* __restrict__ delta, const bf16* __restrict__ dout,
                                                         const bf16* __restrict__ out, int T, int Hq, int D,
                                                         size_t rows) {
  const size_t n = static_cast<size_t>(blockIdx.x) * kWarps + threadIdx.x / 32;  // (b*T + t)*Hq + h
  const int lane = threadIdx.x % 32;
  if (n >= rows) return;  // whole warps leave together
  const __nv_bfloat162* a = reinterpret_cast<const __nv_bfloat162*>(dout + n * D);
  const __nv_bfloat162* o = reinterpret_cast<const __nv_bfloat162*>(out + n * D);
  float acc = 0.f;
  for (int i = lane; i < D / 2; i += 32) {
    const float2 x = __bfloat1622float2(a[i]), y = __bfloat1622float2(o[i]);
    acc = fmaf(x.x, y.x, acc);
    acc = fmaf(x.y, y.y, acc);
  }
  acc = warp_sum(acc);
  if (lane == 0) {
    const int h = static_cast<int>(n % Hq);
    const size_t bt = n / Hq;  // b*T + t
    const size_t b = bt / T, t = bt % T;
    delta[(b * Hq + h) * T + t] = acc;
  }
}

// dK, dV for one tile of 64 keys of one (batch, KV head). 4 warps, each owning
// 16 keys, so each warp works on transposed scores S^T (16 keys x BQ queries)
// and its dK/dV rows stay in registers (2 x D/2 fp32 per thread) for the whole
// block: the block steps over the G query heads of the group and, for each,
// over the query tiles at or after the key tile (earlier queries cannot see
// these keys), so the group's sum happens in registers in a fixed order and
// nothing is written twice. Per step: Q and dO tiles in shared memory
// ([BQ][D+8] bf16 each) beside the block's K and V ([64][D+8], loaded once),
// with lse (times log2 e) and delta for the tile's rows; then
//   S^T = K Q^T, P^T = exp2(S^T scale log2e - lse log2e) (masked on the band
//   around the diagonal), dV += P^T dO, dP^T = V dO^T,
//   dS^T = P^T (dP^T - delta), dK += dS^T Q,
// where P^T and dS^T feed the next MMA as A fragments straight from their
// accumulator registers. BQ is 64 for D <= 64 and 32 for D = 128: the two
// score tiles (BQ/2 floats each) and the two D-wide accumulators (D/2 floats
// each) must fit next to each other (ptxas, sm_90, sync / cp.async loads:
// 166 / 239 registers at D = 64, 245 / 251 at D = 128, no spills; docs/CUDA.md
// "Kernel resources"). Padded query rows
// (>= T) get lse = +inf, so their P is exactly 0. The key tiles are launched
// in order: tile 0 (the longest loop) first.
// kAsync (as in the forward): two stages of the Q/dO/lse/delta buffers; the
// next step's Q and dO travel by cp.async (its lse and delta by plain loads
// held in registers) while this step computes, and the fragments come by
// ldmatrix. Without it each step's tiles are loaded through registers and
// waited for (FlashLoads::kSync). Dynamic shared memory at D = 128: 52 KB
// (sync), 70 KB (async).
template <int D>
constexpr int dkdv_bq() {
  return D <= 64 ? 64 : 32;
}
template <int D, bool kAsync>
constexpr size_t dkdv_smem_bytes() {
  constexpr int stages = kAsync ? 2 : 1;
  return static_cast<size_t>(2 * 64 + stages * 2 * dkdv_bq<D>()) * row_stride<D>() * sizeof(bf16) +
         stages * 2 * dkdv_bq<D>() * sizeof(float);
}

// kDocs (with kAsync only): document masks (doc [B, T] and key_row0,
// flash_attention_common.cuh).
template <int D, bool kAsync, bool kDocs = false>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv,
                                                        const bf16* __restrict__ dout, const float* __restrict__ lse,
                                                        const float* __restrict__ delta, const bf16* __restrict__ q,
                                                        int ld_q, const bf16* __restrict__ k,
                                                        const bf16* __restrict__ v, int ld_kv, int T, int Hq, int G,
                                                        float scale, float scale_log2, bool causal,
                                                        const int32_t* __restrict__ doc = nullptr, int key_row0 = 0) {
  constexpr int BKV = 16 * kWarps;  // keys per block
  constexpr int BQ = dkdv_bq<D>();  // query rows per step
  constexpr int LDS = row_stride<D>();
  constexpr int KD = D / 16;  // k-steps over the head dimension
  constexpr int ND = D / 8;   // n-tiles over the head dimension
  constexpr int NQ = BQ / 8;  // n-tiles over the queries of a step
  constexpr int kStages = kAsync ? 2 : 1;
  static_assert(BKV % BQ == 0, "the first query tile must start exactly at the key tile");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);
  bf16* sV = sK + BKV * LDS;
  bf16* sQ_stages = sV + BKV * LDS;              // kStages x [BQ][LDS]
  bf16* sdO_stages = sQ_stages + kStages * BQ * LDS;  // kStages x [BQ][LDS]
  float* sLse_stages = reinterpret_cast<float*>(sdO_stages + kStages * BQ * LDS);  // lse * log2(e); +inf past T
  float* sDelta_stages = sLse_stages + kStages * BQ;

  const int kb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int k0 = kb * BKV;
  const int wkey = warp * 16;  // first key of this warp inside the tile
  const int key[2] = {k0 + wkey + g, k0 + wkey + g + 8};

  // With documents, the query tiles from the first query whose document
  // starts after this block's last key on are skipped.
  const int q_end = kDocs ? first_query_after(doc, b, T, causal ? k0 : 0, k0 + BKV - 1, key_row0) : -1;
  const BwdKvSteps qs(q, ld_q, dout, lse, delta, T, Hq, G, D, b, hk, k0, BQ, causal, q_end);
  const int steps = qs.steps;
  const size_t kv_off = static_cast<size_t>(b) * T * ld_kv + static_cast<size_t>(hk) * D;
  if constexpr (kAsync) {
    // K, V and step 0's Q, dO in one group; step 0's lse and delta by plain stores.
    load_tile_async<BKV, D>(sK, k + kv_off, ld_kv, k0, T);
    load_tile_async<BKV, D>(sV, v + kv_off, ld_kv, k0, T);
    load_tile_async<BQ, D>(sQ_stages, qs.q_head(0), ld_q, qs.q_first, T);
    load_tile_async<BQ, D>(sdO_stages, qs.do_head(0), qs.ld_o, qs.q_first, T);
    cp_async_commit();
    if (threadIdx.x < BQ) {
      sLse_stages[threadIdx.x] = qs.lse2_of(0, threadIdx.x);
      sDelta_stages[threadIdx.x] = qs.delta_of(0, threadIdx.x);
    }
  } else {
    load_tile<BKV, D>(sK, k + kv_off, ld_kv, k0, T);
    load_tile<BKV, D>(sV, v + kv_off, ld_kv, k0, T);
  }
  // (made visible by the first __syncthreads inside the loop)

  float dk_acc[ND][4], dv_acc[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.f;

  for (int step = 0; step < steps; ++step) {
    const int stage = kAsync ? step & 1 : 0;
    bf16* sQ = sQ_stages + stage * BQ * LDS;
    bf16* sdO = sdO_stages + stage * BQ * LDS;
    const float* sLse = sLse_stages + stage * BQ;
    const float* sDelta = sDelta_stages + stage * BQ;
    const int q0 = qs.q0(step);
    float next_lse = 0.f, next_delta = 0.f;
    __syncthreads();  // everyone is done with the previous step (the other stage, or this one without kAsync)
    if constexpr (kAsync) {
      if (step + 1 < steps) {  // the next step into the other stage while this one computes
        const int nq0 = qs.q0(step + 1);
        const int ngi = (step + 1) / qs.q_tiles;
        load_tile_async<BQ, D>(sQ_stages + (stage ^ 1) * BQ * LDS, qs.q_head(ngi), ld_q, nq0, T);
        load_tile_async<BQ, D>(sdO_stages + (stage ^ 1) * BQ * LDS, qs.do_head(ngi), qs.ld_o, nq0, T);
        if (threadIdx.x < BQ) {
          next_lse = qs.lse2_of(step + 1, threadIdx.x);
          next_delta = qs.delta_of(step + 1, threadIdx.x);
        }
      }
      cp_async_commit();  // possibly empty: the wait below always leaves the newest group in flight
      cp_async_wait<1>();
    } else {
      load_tile<BQ, D>(sQ, qs.q_head(step / qs.q_tiles), ld_q, q0, T);
      load_tile<BQ, D>(sdO, qs.do_head(step / qs.q_tiles), qs.ld_o, q0, T);
      if (threadIdx.x < BQ) {
        sLse_stages[threadIdx.x] = qs.lse2_of(step, threadIdx.x);
        sDelta_stages[threadIdx.x] = qs.delta_of(step, threadIdx.x);
      }
    }
    __syncthreads();

    // S^T = K Q^T: this warp's 16 keys x BQ queries.
    float st[NQ][4];
#pragma unroll
    for (int j = 0; j < NQ; ++j) st[j][0] = st[j][1] = st[j][2] = st[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t ka[4];
      load_a<LDS, kAsync>(ka, sK + wkey * LDS + kk * 16, lane);
      mma_b_rows<NQ, LDS, kAsync>(st, ka, sQ + kk * 16, lane);
    }

    // A key before its query's document: P = 0.
    if constexpr (kDocs) mask_before_documents_transposed<NQ>(st, doc, b, T, key_row0, key, q0, c);
    bwd_p_transposed<NQ>(st, sLse, causal && k0 + wkey + 15 > q0, key, q0, c, scale_log2);

    // dV += P^T dO (k = queries: dO's rows).
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) {
      uint32_t pa[4];
      a_from_c(pa, st[2 * kk], st[2 * kk + 1]);
      mma_b_cols<ND, LDS, kAsync>(dv_acc, pa, sdO + (kk * 16) * LDS, lane);
    }

    // dP^T = V dO^T: this warp's 16 keys x BQ queries.
    float dpt[NQ][4];
#pragma unroll
    for (int j = 0; j < NQ; ++j) dpt[j][0] = dpt[j][1] = dpt[j][2] = dpt[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t va[4];
      load_a<LDS, kAsync>(va, sV + wkey * LDS + kk * 16, lane);
      mma_b_rows<NQ, LDS, kAsync>(dpt, va, sdO + kk * 16, lane);
    }

    bwd_ds_transposed<NQ>(dpt, st, sDelta, c);

    // dK += dS^T Q (k = queries: Q's rows); scale is applied once at the end.
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) {
      uint32_t da[4];
      a_from_c(da, dpt[2 * kk], dpt[2 * kk + 1]);
      mma_b_cols<ND, LDS, kAsync>(dk_acc, da, sQ + (kk * 16) * LDS, lane);
    }

    // The next step's lse and delta into the other stage: its last reader was
    // the previous step, done before this step's first __syncthreads.
    if constexpr (kAsync) {
      if (step + 1 < steps && threadIdx.x < BQ) {
        sLse_stages[(stage ^ 1) * BQ + threadIdx.x] = next_lse;
        sDelta_stages[(stage ^ 1) * BQ + threadIdx.x] = next_delta;
      }
    }
  }
  if constexpr (kAsync) cp_async_wait<0>();  // the last (empty) group

  bf16* dkh = dk + kv_off;
  bf16* dvh = dv + kv_off;
  store_rows<ND>(dkh, ld_kv, dk_acc, scale, scale, k0 + wkey, T, g, c);
  store_rows<ND>(dvh, ld_kv, dv_acc, 1.f, 1.f, k0 + wkey, T, g, c);
}

// dQ for 64 query rows of one (batch, query head): the forward's shape (4
// warps x 16 rows, key tiles of 64 from the start up to the diagonal, only the
// diagonal tile masked) with the forward's softmax replaced by the saved lse.
// Per key tile: S = Q K^T, P = exp2(S scale log2e - lse log2e), dP = dO V^T,
// dS = P (dP - delta), dQ += dS K, with dS fed back as A fragments from its
// registers. Q and dO stay in shared memory for the whole block and K, V
// stream through it ([64][D+8] bf16 each: 68 KB of dynamic shared memory at
// D = 128); the fragments of Q and dO are re-read from shared memory per key
// tile instead of being pinned in registers: two 64-key score tiles (S, dP)
// + one D-wide accumulator (ptxas, sm_90, sync / cp.async loads: 168 / 168
// registers at D = 64, 244 / 248 at D = 128, no spills). Each thread keeps lse
// and delta of its two rows in registers.
// kAsync (as in the forward): two stages of K/V buffers (102 KB at D = 128);
// the next key tile travels by cp.async during the whole of this one's work,
// and the fragments come by ldmatrix.
template <int D, bool kAsync>
constexpr size_t dq_smem_bytes() {
  return static_cast<size_t>((2 + (kAsync ? 4 : 2)) * 64) * row_stride<D>() * sizeof(bf16);
}

// kDocs (with kAsync only): document masks (doc [B, T] and key_row0,
// flash_attention_common.cuh).
template <int D, bool kAsync, bool kDocs = false>
__global__ void __launch_bounds__(kThreads) dq_kernel(bf16* __restrict__ dq, const bf16* __restrict__ dout,
                                                      const float* __restrict__ lse,
                                                      const float* __restrict__ delta, const bf16* __restrict__ q,
                                                      int ld_q, const bf16* __restrict__ k,
                                                      const bf16* __restrict__ v, int ld_kv, int T, int Hq, int G,
                                                      float scale, float scale_log2, bool causal,
                                                      const int32_t* __restrict__ doc = nullptr, int key_row0 = 0) {
  constexpr int BQ = 16 * kWarps;  // query rows per block
  constexpr int BK = 64;           // keys per K/V tile
  constexpr int LDS = row_stride<D>();
  constexpr int KD = D / 16;
  constexpr int ND = D / 8;
  constexpr int NK = BK / 8;
  static_assert(BQ == BK, "the diagonal tile is the last one only when BQ == BK");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sdO = sQ + BQ * LDS;
  bf16* sKV_stages = sdO + BQ * LDS;  // per stage: K [BK][LDS], then V [BK][LDS]

  const int qb = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // heaviest first
  const int h = blockIdx.y, b = blockIdx.z, hk = h / G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int q0 = qb * BQ;
  const int wrow = warp * 16;
  const int row[2] = {q0 + wrow + g, q0 + wrow + g + 8};

  const size_t ld_o = static_cast<size_t>(Hq) * D;
  const bf16* qh = q + static_cast<size_t>(b) * T * ld_q + static_cast<size_t>(h) * D;
  const bf16* doh = dout + static_cast<size_t>(b) * T * ld_o + static_cast<size_t>(h) * D;
  const size_t kv_off = static_cast<size_t>(b) * T * ld_kv + static_cast<size_t>(hk) * D;
  const bf16* kh = k + kv_off;
  const bf16* vh = v + kv_off;
  // With documents, the key tiles wholly before the block's first row's
  // document are skipped (as in the forward).
  const int kt_begin = kDocs ? first_key_tile<BK>(doc, b, T, q0, key_row0) : 0;
  if constexpr (kAsync) {  // Q, dO and key tile kt_begin in one group
    load_tile_async<BQ, D>(sQ, qh, ld_q, q0, T);
    load_tile_async<BQ, D>(sdO, doh, ld_o, q0, T);
    load_tile_async<BK, D>(sKV_stages, kh, ld_kv, kt_begin * BK, T);
    load_tile_async<BK, D>(sKV_stages + BK * LDS, vh, ld_kv, kt_begin * BK, T);
    cp_async_commit();
  } else {
    load_tile<BQ, D>(sQ, qh, ld_q, q0, T);
    load_tile<BQ, D>(sdO, doh, ld_o, q0, T);
  }
  // (made visible by the second __syncthreads inside the loop)

  float lse2[2], dlt[2];  // lse * log2(e) (+inf past T: P = 0) and delta of the thread's rows
  bwd_row_stats(lse2, dlt, lse, delta, b, h, Hq, T, row);
  int lo[2] = {0, 0};
  if constexpr (kDocs) document_starts(lo, doc, b, T, row, key_row0);

  float dq_acc[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) dq_acc[n][0] = dq_acc[n][1] = dq_acc[n][2] = dq_acc[n][3] = 0.f;

  const int n_tiles = ((causal ? min(T, q0 + BQ) : T) + BK - 1) / BK;
  for (int kt = kt_begin; kt < n_tiles; ++kt) {
    const int k0 = kt * BK;
    const int stage = kAsync ? (kt - kt_begin) & 1 : 0;
    bf16* sK = sKV_stages + stage * 2 * BK * LDS;
    bf16* sV = sK + BK * LDS;
    __syncthreads();  // everyone is done with key tile kt - 1 (the other stage, or this one without kAsync)
    if constexpr (kAsync) {
      if (kt + 1 < n_tiles) {  // key tile kt + 1 into the other stage while this one computes
        bf16* nK = sKV_stages + (stage ^ 1) * 2 * BK * LDS;
        load_tile_async<BK, D>(nK, kh, ld_kv, k0 + BK, T);
        load_tile_async<BK, D>(nK + BK * LDS, vh, ld_kv, k0 + BK, T);
      }
      cp_async_commit();  // possibly empty: the wait below always leaves the newest group in flight
      cp_async_wait<1>();
    } else {
      load_tile<BK, D>(sK, kh, ld_kv, k0, T);
      load_tile<BK, D>(sV, vh, ld_kv, k0, T);
    }
    __syncthreads();

    // S = Q K^T and dP = dO V^T: this warp's 16 rows x BK keys.
    float s[NK][4], dp[NK][4];
#pragma unroll
    for (int j = 0; j < NK; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t qa[4], da[4];
      load_a<LDS, kAsync>(qa, sQ + wrow * LDS + kk * 16, lane);
      load_a<LDS, kAsync>(da, sdO + wrow * LDS + kk * 16, lane);
      mma_b_rows<NK, LDS, kAsync>(s, qa, sK + kk * 16, lane);
      mma_b_rows<NK, LDS, kAsync>(dp, da, sV + kk * 16, lane);
    }

    if constexpr (kDocs) mask_before_documents<NK>(s, lo, k0, c);
    bwd_ds<NK>(s, dp, lse2, dlt, row, k0, q0 + wrow, c, causal, T, scale_log2);

    // dQ += dS K (k = keys: K's rows); scale at the end.
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t dsa[4];
      a_from_c(dsa, s[2 * kk], s[2 * kk + 1]);
      mma_b_cols<ND, LDS, kAsync>(dq_acc, dsa, sK + (kk * 16) * LDS, lane);
    }
  }
  if constexpr (kAsync) cp_async_wait<0>();  // the last (empty) group

  bf16* dqh = dq + static_cast<size_t>(b) * T * ld_q + static_cast<size_t>(h) * D;
  store_rows<ND>(dqh, ld_q, dq_acc, scale, scale, q0 + wrow, T, g, c);
}

template <int D, bool kAsync, bool kDocs>
void launch_bwd_kernels(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta,
                        const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq, int Hkv,
                        bool causal, cudaStream_t stream, AttentionDocs docs) {
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const int G = Hq / Hkv;

  constexpr size_t kv_smem = dkdv_smem_bytes<D, kAsync>();
  if (kv_smem > 48 * 1024)
    KVS_CUDA_CHECK(cudaFuncSetAttribute(dkdv_kernel<D, kAsync, kDocs>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kv_smem)));
  const dim3 kv_grid(ceil_div(T, 64), Hkv, B);
  dkdv_kernel<D, kAsync, kDocs><<<kv_grid, kThreads, kv_smem, stream>>>(dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv,
                                                                        T, Hq, G, scale, scale * kLog2e, causal,
                                                                        docs.start, docs.key_row0);
  KVS_CUDA_LAUNCH_CHECK("flash_attention_backward (dK, dV)", stream);

  constexpr size_t q_smem = dq_smem_bytes<D, kAsync>();
  if (q_smem > 48 * 1024)
    KVS_CUDA_CHECK(cudaFuncSetAttribute(dq_kernel<D, kAsync, kDocs>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(q_smem)));
  const dim3 q_grid(ceil_div(T, 16 * kWarps), Hq, B);
  dq_kernel<D, kAsync, kDocs><<<q_grid, kThreads, q_smem, stream>>>(dq, dout, lse, delta, q, ld_q, k, v, ld_kv, T, Hq,
                                                                    G, scale, scale * kLog2e, causal, docs.start,
                                                                    docs.key_row0);
  KVS_CUDA_LAUNCH_CHECK("flash_attention_backward (dQ)", stream);
}

// Document masks (docs.start non-null) on the cp.async kernels only.
template <int D, bool kAsync>
void launch_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta, const bf16* q,
                int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq, int Hkv, bool causal,
                cudaStream_t stream, AttentionDocs docs) {
  if constexpr (kAsync) {
    if (docs.start)
      return launch_bwd_kernels<D, true, true>(dq, dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv,
                                               causal, stream, docs);
  }
  launch_bwd_kernels<D, kAsync, false>(dq, dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal,
                                       stream, {});
}

template <bool kAsync>
void launch_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta, const bf16* q,
                int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq, int Hkv, int D, bool causal,
                cudaStream_t stream, AttentionDocs docs = {}) {
  switch (D) {
    case 16:
      return launch_bwd<16, kAsync>(dq, dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal, stream,
                                    docs);
    case 32:
      return launch_bwd<32, kAsync>(dq, dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal, stream,
                                    docs);
    case 64:
      return launch_bwd<64, kAsync>(dq, dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal, stream,
                                    docs);
    default:
      return launch_bwd<128, kAsync>(dq, dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal,
                                     stream, docs);
  }
}

}  // namespace flash

size_t flash_attention_backward_scratch_floats(int B, int T, int Hq, int D) {
  (void)D;
  return static_cast<size_t>(B) * Hq * T;  // delta
}

void flash_attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                              const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq,
                              int Hkv, int D, float* scratch, cudaStream_t stream) {
  flash_attention_backward(dq, dk, dv, dout, out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, true,
                           FlashLoads::kAsync, scratch, stream);
}

void flash_attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                              const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq,
                              int Hkv, int D, bool causal, float* scratch, cudaStream_t stream) {
  flash_attention_backward(dq, dk, dv, dout, out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, causal,
                           FlashLoads::kAsync, scratch, stream);
}

void flash_attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                              const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq,
                              int Hkv, int D, bool causal, FlashLoads loads, float* scratch, cudaStream_t stream,
                              AttentionDocs docs) {
  flash::check_args("flash_attention_backward", {dq, dk, dv, dout, out, q, k, v}, {lse, scratch}, ld_q, ld_kv, B, T,
                    Hq, Hkv, D);
  if (B == 0 || T == 0) return;

  float* delta = scratch;
  const size_t rows = static_cast<size_t>(B) * T * Hq;
  flash::delta_kernel<<<ceil_div(rows, flash::kWarps), flash::kThreads, 0, stream>>>(delta, dout, out, T, Hq, D, rows);
  KVS_CUDA_LAUNCH_CHECK("flash_attention_backward (delta)", stream);

  if (const int groups = flash::hopper_groups(loads, true); groups > 0 && flash_hopper_available(D))
    flash::launch_bwd_sm90(dq, dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, causal, stream, docs,
                           groups);
  else if (loads != FlashLoads::kSync || docs.start)  // documents: the cp.async kernels
    flash::launch_bwd<true>(dq, dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, causal, stream, docs);
  else
    flash::launch_bwd<false>(dq, dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, causal, stream);
}

}  // namespace kvs::cuda
