// Causal flash attention, backward, for Hopper (sm_90a): flash_attention_bwd.cu's
// two kernels (dK/dV per key tile, dQ per query tile; no atomics, so the
// gradients are bit-identical run to run) with every product on the
// warpgroup MMA (wgmma.cuh), their elementwise steps shared through
// flash_attention_common.cuh (bwd_p_transposed, bwd_ds_transposed, bwd_ds).
// One block = one warpgroup as "flash" runs them (2 for bench-attention's
// comparison: the kernels' comment): its 4 warps own 16 rows each (keys in dkdv,
// queries in dq), as in the mma.sync kernels, so every register layout and
// elementwise step is theirs. Tiles of 64 rows in wgmma's 128-byte-swizzled
// layout (wgmma.cuh), by cp.async, the streamed operand double-buffered.
//   dkdv: S^T = K Q^T and dP^T = V dO^T (both operands from shared memory,
//         K-major), then dV += P^T dO and dK += dS^T Q (P^T, dS^T from
//         registers, dO and Q "trans-b"); steps of 64 queries over the
//         group's query heads; 96 KB of tiles at D = 128.
//   dq:   S = Q K^T and dP = dO V^T, then dQ += dS K (K "trans-b"); key tiles
//         of 64 up to the diagonal; 96 KB of tiles at D = 128.
// flash_attention_backward takes it for FlashLoads::kHopper when
// flash_hopper_available(D) (sm_90a build, compute capability 9.0, D = 64 or
// 128).
// kDocs: document masks (doc [B, T] and key_row0, flash_attention_common.cuh),
// with the mma.sync kernels' tile skipping (dkdv stops at the first query whose
// document starts after its keys, dq starts at its first row's document).
#include <type_traits>

#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/flash_attention_sm90.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {
namespace flash {

template <int D, int kGroups = 1>
constexpr size_t sm90_dkdv_smem_bytes() {  // kGroups x (K, V), 2 x (Q, dO); 2 x (lse, delta) of 64 rows; slack
  return (2 * kGroups + 4) * kSm90Rows * D * sizeof(bf16) + 4 * kSm90Rows * sizeof(float) + 1024;
}
template <int D, int kGroups = 1>
constexpr size_t sm90_dq_smem_bytes() {  // kGroups x (Q, dO), 2 x (K, V); alignment slack
  return (2 * kGroups + 4) * kSm90Rows * D * sizeof(bf16) + 1024;
}

// kGroups warpgroups per block (1: what "flash" runs; 2: FlashLoads::
// kHopperGroups2/3, bench-attention's comparison), each with its own 64 rows
// (keys in dkdv, queries in dq) and the same streamed tiles, loaded once for
// all of them. As in the forward, every warpgroup runs all of the block's
// steps without a branch around its wgmmas; a step none of its rows takes
// part in is masked whole (P = 0, so dS = 0: the sums gain only zeros), and
// every row gets the one-warpgroup kernel's bits. At 255 (dkdv) and 219 (dq)
// registers, 3 warpgroups would not fit one SM's registers.
template <int D, bool kDocs = false, int kGroups = 1>
__global__ void __launch_bounds__(kGroups* kThreads)
    dkdv_sm90_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv, const bf16* __restrict__ dout,
                     const float* __restrict__ lse, const float* __restrict__ delta, const bf16* __restrict__ q,
                     int ld_q, const bf16* __restrict__ k, const bf16* __restrict__ v, int ld_kv, int T, int Hq, int G,
                     float scale, float scale_log2, bool causal, const int32_t* __restrict__ doc = nullptr,
                     int key_row0 = 0) {
  constexpr int BKV = kGroups * kSm90Rows, BQ = kSm90Rows, TILE = kSm90Rows * D;
  constexpr int ND = D / 8, NQ = BQ / 8;
  constexpr int kLoaders = kGroups * kThreads;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  bf16* sKs = sm90_tiles(smem_raw);            // kGroups x [64][D]
  bf16* sVs = sKs + kGroups * TILE;            // kGroups x [64][D]
  bf16* sQ_stages = sVs + kGroups * TILE;      // 2 x [64][D]
  bf16* sdO_stages = sQ_stages + 2 * TILE;     // 2 x [64][D]
  float* sLse_stages = reinterpret_cast<float*>(sdO_stages + 2 * TILE);  // 2 x 64: lse * log2(e); +inf past T
  float* sDelta_stages = sLse_stages + 2 * BQ;                           // 2 x 64

  const int kb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int wg = threadIdx.x / kThreads, warp = (threadIdx.x / 32) % kWarps, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int k0 = kb * BKV, wk0 = k0 + wg * kSm90Rows;  // the block's and the warpgroup's first key
  const int wkey = warp * 16;
  const int key[2] = {wk0 + wkey + g, wk0 + wkey + g + 8};
  const bf16* sK = sKs + wg * TILE;
  const bf16* sV = sVs + wg * TILE;

  const int q_end = kDocs ? first_query_after(doc, b, T, causal ? k0 : 0, k0 + BKV - 1, key_row0) : -1;
  const BwdKvSteps qs(q, ld_q, dout, lse, delta, T, Hq, G, D, b, hk, k0, BQ, causal, q_end);
  const int steps = qs.steps;
  const size_t kv_off = static_cast<size_t>(b) * T * ld_kv + static_cast<size_t>(hk) * D;
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    load_tile_swizzled<D, kLoaders>(sKs + i * TILE, k + kv_off, ld_kv, k0 + i * kSm90Rows, T);
    load_tile_swizzled<D, kLoaders>(sVs + i * TILE, v + kv_off, ld_kv, k0 + i * kSm90Rows, T);
  }
  load_tile_swizzled<D, kLoaders>(sQ_stages, qs.q_head(0), ld_q, qs.q_first, T);
  load_tile_swizzled<D, kLoaders>(sdO_stages, qs.do_head(0), qs.ld_o, qs.q_first, T);
  cp_async_commit();
  if (threadIdx.x < BQ) {
    sLse_stages[threadIdx.x] = qs.lse2_of(0, threadIdx.x);
    sDelta_stages[threadIdx.x] = qs.delta_of(0, threadIdx.x);
  }

  float dk_acc[ND][4], dv_acc[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.f;

  for (int step = 0; step < steps; ++step) {
    const int stage = step & 1;
    const bf16* sQ = sQ_stages + stage * TILE;
    const bf16* sdO = sdO_stages + stage * TILE;
    const float* sLse = sLse_stages + stage * BQ;
    const float* sDelta = sDelta_stages + stage * BQ;
    const int q0 = qs.q0(step);
    float next_lse = 0.f, next_delta = 0.f;
    __syncthreads();  // everyone is done with the previous step (the other stage)
    if (step + 1 < steps) {  // the next step into the other stage while this one computes
      const int nq0 = qs.q0(step + 1);
      load_tile_swizzled<D, kLoaders>(sQ_stages + (stage ^ 1) * TILE, qs.q_head((step + 1) / qs.q_tiles), ld_q, nq0,
                                      T);
      load_tile_swizzled<D, kLoaders>(sdO_stages + (stage ^ 1) * TILE, qs.do_head((step + 1) / qs.q_tiles), qs.ld_o,
                                      nq0, T);
      if (threadIdx.x < BQ) {
        next_lse = qs.lse2_of(step + 1, threadIdx.x);
        next_delta = qs.delta_of(step + 1, threadIdx.x);
      }
    }
    cp_async_commit();  // possibly empty: the wait below always leaves the newest group in flight
    cp_async_wait<1>();
    fence_proxy_async();
    __syncthreads();

    // S^T = K Q^T and dP^T = V dO^T: 64 keys x 64 queries each, one group.
    float st[NQ][4], dpt[NQ][4];
    wgmma_fence();
    wgmma_rows_by_rows<D>(st, sK, sQ);
    wgmma_rows_by_rows<D>(dpt, sV, sdO);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(st);
    reg_fence(dpt);

    // A key before its query's document: P = 0.
    if constexpr (kDocs) mask_before_documents_transposed<NQ>(st, doc, b, T, key_row0, key, q0, c);
    bwd_p_transposed<NQ>(st, sLse, causal && wk0 + wkey + 15 > q0, key, q0, c, scale_log2);
    bwd_ds_transposed<NQ>(dpt, st, sDelta, c);

    // dV += P^T dO and dK += dS^T Q (k = queries: dO's and Q's rows); scale on dK at the end.
    uint32_t pa[BQ / 16][4], da[BQ / 16][4];
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) {
      a_from_c(pa[kk], st[2 * kk], st[2 * kk + 1]);
      a_from_c(da[kk], dpt[2 * kk], dpt[2 * kk + 1]);
    }
    wgmma_fence();
    wgmma_regs_by_rows<D>(dv_acc, pa, sdO);
    wgmma_regs_by_rows<D>(dk_acc, da, sQ);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dv_acc);
    reg_fence(dk_acc);

    // The next step's lse and delta into the other stage: its last reader was
    // the previous step, done before this step's first __syncthreads.
    if (step + 1 < steps && threadIdx.x < BQ) {
      sLse_stages[(stage ^ 1) * BQ + threadIdx.x] = next_lse;
      sDelta_stages[(stage ^ 1) * BQ + threadIdx.x] = next_delta;
    }
  }
  cp_async_wait<0>();  // the last (empty) group

  store_rows<ND>(dk + kv_off, ld_kv, dk_acc, scale, scale, wk0 + wkey, T, g, c);
  store_rows<ND>(dv + kv_off, ld_kv, dv_acc, 1.f, 1.f, wk0 + wkey, T, g, c);
}

template <int D, bool kDocs = false, int kGroups = 1>
__global__ void __launch_bounds__(kGroups* kThreads)
    dq_sm90_kernel(bf16* __restrict__ dq, const bf16* __restrict__ dout, const float* __restrict__ lse,
                   const float* __restrict__ delta, const bf16* __restrict__ q, int ld_q, const bf16* __restrict__ k,
                   const bf16* __restrict__ v, int ld_kv, int T, int Hq, int G, float scale, float scale_log2,
                   bool causal, const int32_t* __restrict__ doc = nullptr, int key_row0 = 0) {
  constexpr int BQ = kGroups * kSm90Rows, BK = kSm90Rows, TILE = kSm90Rows * D;
  constexpr int ND = D / 8, NK = BK / 8;
  constexpr int kLoaders = kGroups * kThreads;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  bf16* sQs = sm90_tiles(smem_raw);        // kGroups x [64][D]
  bf16* sdOs = sQs + kGroups * TILE;       // kGroups x [64][D]
  bf16* sKV_stages = sdOs + kGroups * TILE;  // per stage: K [64][D], then V [64][D]

  const int qb = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // heaviest first
  const int h = blockIdx.y, b = blockIdx.z, hk = h / G;
  const int wg = threadIdx.x / kThreads, warp = (threadIdx.x / 32) % kWarps, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int q0 = qb * BQ, wq0 = q0 + wg * kSm90Rows, wrow = warp * 16;  // wq0: the warpgroup's first row
  const int row[2] = {wq0 + wrow + g, wq0 + wrow + g + 8};
  const bf16* sQ = sQs + wg * TILE;
  const bf16* sdO = sdOs + wg * TILE;

  const size_t ld_o = static_cast<size_t>(Hq) * D;
  const bf16* qh = q + static_cast<size_t>(b) * T * ld_q + static_cast<size_t>(h) * D;
  const bf16* doh = dout + static_cast<size_t>(b) * T * ld_o + static_cast<size_t>(h) * D;
  const size_t kv_off = static_cast<size_t>(b) * T * ld_kv + static_cast<size_t>(hk) * D;
  const bf16* kh = k + kv_off;
  const bf16* vh = v + kv_off;
  // With documents, the key tiles wholly before the block's first row's
  // document are skipped (as in the forward).
  const int kt_begin = kDocs ? first_key_tile<BK>(doc, b, T, q0, key_row0) : 0;
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    load_tile_swizzled<D, kLoaders>(sQs + i * TILE, qh, ld_q, q0 + i * kSm90Rows, T);
    load_tile_swizzled<D, kLoaders>(sdOs + i * TILE, doh, ld_o, q0 + i * kSm90Rows, T);
  }
  load_tile_swizzled<D, kLoaders>(sKV_stages, kh, ld_kv, kt_begin * BK, T);
  load_tile_swizzled<D, kLoaders>(sKV_stages + TILE, vh, ld_kv, kt_begin * BK, T);
  cp_async_commit();

  float lse2[2], dlt[2];  // lse * log2(e) (+inf past T: P = 0) and delta of the thread's rows
  bwd_row_stats(lse2, dlt, lse, delta, b, h, Hq, T, row);
  int lo[2] = {0, 0};
  if constexpr (kDocs) document_starts(lo, doc, b, T, row, key_row0);

  float dq_acc[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) dq_acc[n][0] = dq_acc[n][1] = dq_acc[n][2] = dq_acc[n][3] = 0.f;

  const int n_tiles = ((causal ? min(T, q0 + BQ) : T) + BK - 1) / BK;
  for (int kt = kt_begin; kt < n_tiles; ++kt) {
    const int k0 = kt * BK, stage = (kt - kt_begin) & 1;
    const bf16* sK = sKV_stages + stage * 2 * TILE;
    const bf16* sV = sK + TILE;
    __syncthreads();  // everyone is done with key tile kt - 1 (the other stage)
    if (kt + 1 < n_tiles) {
      bf16* nK = sKV_stages + (stage ^ 1) * 2 * TILE;
      load_tile_swizzled<D, kLoaders>(nK, kh, ld_kv, k0 + BK, T);
      load_tile_swizzled<D, kLoaders>(nK + TILE, vh, ld_kv, k0 + BK, T);
    }
    cp_async_commit();  // possibly empty: the wait below always leaves the newest group in flight
    cp_async_wait<1>();
    fence_proxy_async();
    __syncthreads();

    // S = Q K^T and dP = dO V^T: 64 rows x 64 keys each, one group.
    float s[NK][4], dp[NK][4];
    wgmma_fence();
    wgmma_rows_by_rows<D>(s, sQ, sK);
    wgmma_rows_by_rows<D>(dp, sdO, sV);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(s);
    reg_fence(dp);

    if constexpr (kDocs) mask_before_documents<NK>(s, lo, k0, c);
    bwd_ds<NK>(s, dp, lse2, dlt, row, k0, wq0 + wrow, c, causal, T, scale_log2);

    // dQ += dS K (k = keys: K's rows); scale at the end.
    uint32_t dsa[BK / 16][4];
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) a_from_c(dsa[kk], s[2 * kk], s[2 * kk + 1]);
    wgmma_fence();
    wgmma_regs_by_rows<D>(dq_acc, dsa, sK);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dq_acc);
  }
  cp_async_wait<0>();  // the last (empty) group

  bf16* dqh = dq + static_cast<size_t>(b) * T * ld_q + static_cast<size_t>(h) * D;
  store_rows<ND>(dqh, ld_q, dq_acc, scale, scale, wq0 + wrow, T, g, c);
}

template <int D, bool kDocs, int kGroups>
void launch_bwd_sm90(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta,
                     const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq, int Hkv,
                     bool causal, cudaStream_t stream, AttentionDocs docs) {
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const int G = Hq / Hkv, rows = kGroups * kSm90Rows;
  constexpr size_t kv_smem = sm90_dkdv_smem_bytes<D, kGroups>(), q_smem = sm90_dq_smem_bytes<D, kGroups>();
  constexpr auto dkdv = dkdv_sm90_kernel<D, kDocs, kGroups>;
  constexpr auto dqk = dq_sm90_kernel<D, kDocs, kGroups>;
  KVS_CUDA_CHECK(cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kv_smem)));
  dkdv<<<dim3(ceil_div(T, rows), Hkv, B), kGroups * kThreads, kv_smem, stream>>>(
      dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv, T, Hq, G, scale, scale * kLog2e, causal, docs.start,
      docs.key_row0);
  KVS_CUDA_LAUNCH_CHECK("flash_attention_backward (dK, dV)", stream);
  KVS_CUDA_CHECK(cudaFuncSetAttribute(dqk, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(q_smem)));
  dqk<<<dim3(ceil_div(T, rows), Hq, B), kGroups * kThreads, q_smem, stream>>>(
      dq, dout, lse, delta, q, ld_q, k, v, ld_kv, T, Hq, G, scale, scale * kLog2e, causal, docs.start, docs.key_row0);
  KVS_CUDA_LAUNCH_CHECK("flash_attention_backward (dQ)", stream);
}

// groups 1 ("flash"), with or without documents; 2 (bench-attention's
// comparison) without.
void launch_bwd_sm90(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta,
                     const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq, int Hkv,
                     int D, bool causal, cudaStream_t stream, AttentionDocs docs, int groups) {
  KVS_CHECK(groups == 1 || groups == 2, "flash_attention_backward: {} warpgroups per block (1 or 2)", groups);
  KVS_CHECK(groups == 1 || !docs.start, "flash_attention_backward: {} warpgroups per block take no documents", groups);
  auto run = [&](auto d) {  // d: std::integral_constant<int, D> (nvcc compiles C++17 here)
    constexpr int kD = decltype(d)::value;
    if (docs.start)
      launch_bwd_sm90<kD, true, 1>(dq, dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal, stream,
                                   docs);
    else if (groups == 2)
      launch_bwd_sm90<kD, false, 2>(dq, dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal,
                                    stream, {});
    else
      launch_bwd_sm90<kD, false, 1>(dq, dk, dv, dout, lse, delta, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal,
                                    stream, {});
  };
  if (D == 64)
    run(std::integral_constant<int, 64>{});
  else
    run(std::integral_constant<int, 128>{});
}

}  // namespace flash
}  // namespace kvs::cuda
