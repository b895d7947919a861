// Causal flash attention, forward, for Hopper (sm_90a): the same algorithm as
// flash_attention_fwd.cu's kernel (FlashAttention-2's loop, its online
// softmax and epilogue shared through flash_attention_common.cuh), with the
// two products on the warpgroup MMA (wgmma.cuh) instead of mma.sync:
//  - S = Q K^T: wgmma m64n64k16 with Q and K both read by the tensor cores
//    from shared memory (no ldmatrix, no A/B fragments in registers);
//  - O += P V: wgmma m64nDk16, P from the S registers as they are (bf16), V
//    from shared memory (MN-major, "trans-b").
// One block = one warpgroup (4 warps) and 64 query rows of one (batch, query
// head) as "flash" runs it (kGroups warpgroups of 64 rows each for
// bench-attention's comparison: the kernel's comment); the warps own 16 rows
// each, as in the mma.sync kernel, so the softmax is the same code on the
// same register layout. K/V tiles (64 keys) travel by cp.async,
// double-buffered, one tile ahead; a tile's P V product overlaps the next
// tile's softmax (FlashAttention-3's intra-warpgroup pipelining; the loop's
// comment). Tiles are stored in wgmma's 128-byte-swizzled layout (wgmma.cuh),
// written by cp.async to their swizzled addresses. Shared memory at D = 128:
// Q 16 KB + K 2 x 16 KB + V 2 x 16 KB = 80 KB (2 blocks per SM).
// Built for sm_90a only (KVS_CUDA_SM90A, -DKVS_CUDA_ARCHS containing 90a);
// flash_attention_forward takes it for FlashLoads::kHopper when
// flash_hopper_available says so, and head_dim 64 or 128.
// kDocs: document masks (doc [B, T] and key_row0, flash_attention_common.cuh),
// with the mma.sync kernel's tile skipping.
#include <type_traits>

#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/flash_attention_sm90.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {
namespace flash {

template <int D, int kGroups = 1>
constexpr size_t sm90_fwd_smem_bytes() {
  return (kGroups + 4) * kSm90Rows * D * sizeof(bf16) + 1024;  // kGroups Q, 2 K, 2 V; + alignment slack
}

// kGroups consumer warpgroups per block, each with its own 64 query rows and
// the same K/V tiles: 1 is what "flash" runs; 2 and 3 (64 kGroups query rows
// per block, the K/V tiles loaded once for all of them, as FlashAttention-3's
// 128-row blocks) are bench-attention's comparison until a GPU has measured
// them. Every warpgroup runs every key tile of the block, branch-free (a
// wgmma under a branch ptxas cannot prove warpgroup-uniform is serialized,
// C7518): a tile none of a warpgroup's rows sees (past its diagonal, before
// its documents) is masked whole, which leaves its rows' m, l and O exactly
// as they were (alpha = 1 and P = 0; or, before any visible key, 0 times 0),
// so every row still gets the one-warpgroup kernel's bits. The cost: one
// wasted tile per warpgroup after the first on the diagonal.
template <int D, bool kDocs = false, int kGroups = 1>
__global__ void __launch_bounds__(kGroups* kThreads)
    fwd_sm90_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ q, int ld_q,
                    const bf16* __restrict__ k, const bf16* __restrict__ v, int ld_kv, int T, int Hq, int G,
                    float scale, float scale_log2, bool causal, const int32_t* __restrict__ doc = nullptr,
                    int key_row0 = 0) {
  constexpr int BQ = kGroups * kSm90Rows, BK = kSm90Rows, TILE = kSm90Rows * D;
  constexpr int ND = D / 8;   // n-blocks of O
  constexpr int NK = BK / 8;  // n-blocks of S
  constexpr int kLoaders = kGroups * kThreads;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  bf16* sQ = sm90_tiles(smem_raw);  // kGroups tiles
  bf16* sK = sQ + kGroups * TILE;   // 2 stages
  bf16* sV = sK + 2 * TILE;         // 2 stages

  const int qb = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // heaviest first
  const int h = blockIdx.y, b = blockIdx.z, hk = h / G;
  const int wg = threadIdx.x / kThreads, warp = (threadIdx.x / 32) % kWarps, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int q0 = qb * BQ, wq0 = q0 + wg * kSm90Rows, wrow = warp * 16;  // wq0: the warpgroup's first row

  const bf16* qh = q + static_cast<size_t>(b) * T * ld_q + static_cast<size_t>(h) * D;
  const bf16* kh = k + static_cast<size_t>(b) * T * ld_kv + static_cast<size_t>(hk) * D;
  const bf16* vh = v + static_cast<size_t>(b) * T * ld_kv + static_cast<size_t>(hk) * D;

  const int kv_end = causal ? min(T, q0 + BQ) : T;
  const int n_tiles = (kv_end + BK - 1) / BK;
  // With documents, the key tiles wholly before the block's first row's
  // document are skipped (the mma.sync kernel's rule).
  const int kt_begin = kDocs ? first_key_tile<BK>(doc, b, T, q0, key_row0) : 0;
#pragma unroll
  for (int i = 0; i < kGroups; ++i) load_tile_swizzled<D, kLoaders>(sQ + i * TILE, qh, ld_q, q0 + i * kSm90Rows, T);
  load_tile_swizzled<D, kLoaders>(sK, kh, ld_kv, kt_begin * BK, T);
  cp_async_commit();

  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int row[2] = {wq0 + wrow + g, wq0 + wrow + g + 8};
  int lo[2] = {0, 0};
  if constexpr (kDocs) document_starts(lo, doc, b, T, row, key_row0);
  const bf16* sQw = sQ + wg * TILE;

  // Tile kt's P V runs on the tensor cores while tile kt + 1's softmax runs
  // (FlashAttention-3's intra-warpgroup overlap): iteration kt issues S = Q
  // K_kt^T, then O += P_{kt-1} V_{kt-1}, waits for S only, computes P_kt, and
  // only then waits for the P V product and rescales O. O sees the same
  // operations in the same order as without the overlap (O + P V, then times
  // alpha), so the bits are the mma.sync kernel's under the emulator.
  // Loads: iteration kt's group brings K_{kt+1} (stage st ^ 1) and V_kt
  // (stage st), each one iteration ahead of its product.
  uint32_t pa[BK / 16][4];  // P of the previous tile, bf16 A fragments
  for (int kt = kt_begin; kt < n_tiles; ++kt) {
    const int k0 = kt * BK, st = (kt - kt_begin) & 1;
    const bool pv = kt > kt_begin;  // a previous tile's P V to issue
    // The stages written here had their last readers in the previous
    // iteration, which ended with a barrier after its products were done.
    if (kt + 1 < n_tiles) load_tile_swizzled<D, kLoaders>(sK + (st ^ 1) * TILE, kh, ld_kv, k0 + BK, T);
    load_tile_swizzled<D, kLoaders>(sV + st * TILE, vh, ld_kv, k0, T);
    cp_async_commit();
    cp_async_wait<1>();   // K_kt (and Q) and V_{kt-1} have landed
    fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads through the async one
    __syncthreads();      // every thread's copies are in

    // S = Q K^T: 64 rows x 64 keys, k-steps of 16 over D. Then the previous
    // tile's O += P V: k-steps of 16 keys (rows 16 kk of V's tile); n runs
    // along V's rows (trans-b).
    float s[NK][4];
    wgmma_fence();  // s was last written by the softmax
    wgmma_rows_by_rows<D>(s, sQw, sK + st * TILE);
    wgmma_commit();
    if (pv) {
      // o was rescaled and pa written; fenced here, on the branch (with one
      // fence for both wgmmas ptxas injected its own here, C7519).
      wgmma_fence();
      wgmma_regs_by_rows<D>(o, pa, sV + (st ^ 1) * TILE);
      wgmma_commit();
      wgmma_wait<1>();  // S is done; P V may still run
    } else {
      wgmma_wait<0>();
    }
    reg_fence(s);

    float alpha[2];
    if constexpr (kDocs) mask_before_documents<NK>(s, lo, k0, c);
    softmax_scores<NK>(s, m, l, alpha, row, k0, wq0 + wrow, c, causal, T, scale_log2);

    wgmma_wait<0>();  // P V done: o and pa are free
    reg_fence(o);
    rescale_rows<ND>(o, alpha);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) a_from_c(pa[kk], s[2 * kk], s[2 * kk + 1]);
    __syncthreads();  // everyone is done with K_kt and V_{kt-1} before the next loads overwrite them
  }
  cp_async_wait<0>();  // the last tile's V (or, with no tile, the prologue's copies)
  if (n_tiles > kt_begin) {
    fence_proxy_async();
    __syncthreads();
    wgmma_fence();
    wgmma_regs_by_rows<D>(o, pa, sV + ((n_tiles - 1 - kt_begin) & 1) * TILE);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(o);
  }

  finish_rows<ND>(out, lse, o, m, l, row, b, h, Hq, T, wq0 + wrow, g, c, scale);
}

template <int D, bool kDocs, int kGroups>
void launch_fwd_sm90(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B,
                     int T, int Hq, int Hkv, bool causal, cudaStream_t stream, AttentionDocs docs) {
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const dim3 grid(ceil_div(T, kGroups * kSm90Rows), Hq, B);
  constexpr size_t smem = sm90_fwd_smem_bytes<D, kGroups>();
  constexpr auto kernel = fwd_sm90_kernel<D, kDocs, kGroups>;
  KVS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, kGroups * kThreads, smem, stream>>>(out, lse, q, ld_q, k, v, ld_kv, T, Hq, Hq / Hkv, scale,
                                                     scale * kLog2e, causal, docs.start, docs.key_row0);
  KVS_CUDA_LAUNCH_CHECK(kDocs ? "flash_attention_forward (sm90, documents)" : "flash_attention_forward (sm90)",
                        stream);
}

// groups 1 ("flash"), with or without documents; 2 and 3 (bench-attention's
// comparison) without.
void launch_fwd_sm90(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B,
                     int T, int Hq, int Hkv, int D, bool causal, cudaStream_t stream, AttentionDocs docs, int groups) {
  KVS_CHECK(groups >= 1 && groups <= 3, "flash_attention_forward: {} warpgroups per block (1 to 3)", groups);
  KVS_CHECK(groups == 1 || !docs.start, "flash_attention_forward: {} warpgroups per block take no documents", groups);
  auto run = [&](auto d) {  // d: std::integral_constant<int, D> (nvcc compiles C++17 here)
    constexpr int kD = decltype(d)::value;
    if (docs.start)
      launch_fwd_sm90<kD, true, 1>(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal, stream, docs);
    else if (groups == 2)
      launch_fwd_sm90<kD, false, 2>(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal, stream, {});
    else if (groups == 3)
      launch_fwd_sm90<kD, false, 3>(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal, stream, {});
    else
      launch_fwd_sm90<kD, false, 1>(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal, stream, {});
  };
  if (D == 64)
    run(std::integral_constant<int, 64>{});
  else
    run(std::integral_constant<int, 128>{});
}

}  // namespace flash
}  // namespace kvs::cuda
