// Causal flash attention, forward (FlashAttention-2 structure). The contract
// is in kernels/cuda/ops.h; the fragment layouts and tile helpers are in
// flash_attention_common.cuh.
#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {
namespace flash {

// One block computes 64 query rows of one (batch, query head): 4 warps, each
// owning 16 rows, so every softmax statistic lives in the registers of the 4
// threads (a "quad") that hold a row's accumulator elements and the only
// cross-thread communication is two quad shuffles per row reduction. The Q
// tile is staged once through shared memory into registers (the A fragments,
// D/4 b32 per thread). The block then walks the key/value tiles (64 keys)
// from the start of the sequence up to the diagonal; tiles above the
// diagonal are never visited and only the diagonal tile (the last one) is
// masked. Per tile: K and V go to shared memory ([64][D+8] bf16 each, 34 KB
// at D = 128, static), S = Q K^T runs on the tensor cores into fp32 (32 floats
// per thread), the online softmax rescales the running output O (D/2 floats
// per thread) by exp(m_old - m_new), and P, rounded to bf16 straight from the
// S registers, multiplies V into O. The running sum l is kept per thread and
// summed over the quad once at the end. Blocks are launched heaviest (last
// query tile) first so the causal triangle's long rows do not trail. K and V
// are read from the KV head h / G in place (GQA without copies).
//
// kAsync (the default, FlashAttention-2's pipeline): the tiles travel by
// cp.async while the tensor cores work, V's during S = Q K^T and the next
// K's during O += P V, in the same two buffers and with the same two
// __syncthreads per tile; and the fragments come out of shared memory by
// ldmatrix (4 matrices per instruction) instead of 32- and 16-bit loads.
// Without it (FlashLoads::kSync), every thread loads each tile through its
// registers and waits for it: the first version, kept as the baseline that
// bench-attention times beside it and as a fallback.
//
// kDocs (with kAsync only): document masks (doc [B, T] and key_row0,
// flash_attention_common.cuh).
template <int D, bool kAsync, bool kDocs = false>
__global__ void __launch_bounds__(kThreads) fwd_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                                                       const bf16* __restrict__ q, int ld_q,
                                                       const bf16* __restrict__ k, const bf16* __restrict__ v,
                                                       int ld_kv, int T, int Hq, int G, float scale,
                                                       float scale_log2, bool causal,
                                                       const int32_t* __restrict__ doc = nullptr, int key_row0 = 0) {
  constexpr int BQ = 16 * kWarps;  // query rows per block
  constexpr int BK = 64;           // keys per K/V tile
  constexpr int LDS = row_stride<D>();
  constexpr int KD = D / 16;  // k-steps over the head dimension
  constexpr int ND = D / 8;   // n-tiles over the head dimension
  constexpr int NK = BK / 8;  // n-tiles over the keys of a tile
  static_assert(BQ == BK, "the diagonal tile is the last one only when BQ == BK");

  __shared__ __align__(16) bf16 sK[BK * LDS];
  __shared__ __align__(16) bf16 sV[BK * LDS];

  const int qb = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // heaviest first
  const int h = blockIdx.y, b = blockIdx.z, hk = h / G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int q0 = qb * BQ;
  const int wrow = warp * 16;  // first row of this warp inside the tile
  // With documents, the key tiles wholly before the block's first row's
  // document (the earliest of the block's: the starts rise) are skipped.
  const int kt_begin = kDocs ? first_key_tile<BK>(doc, b, T, q0, key_row0) : 0;

  const bf16* qh = q + static_cast<size_t>(b) * T * ld_q + static_cast<size_t>(h) * D;
  const bf16* kh = k + static_cast<size_t>(b) * T * ld_kv + static_cast<size_t>(hk) * D;
  const bf16* vh = v + static_cast<size_t>(b) * T * ld_kv + static_cast<size_t>(hk) * D;

  uint32_t qf[KD][4];
  if constexpr (kAsync) {
    // Q -> registers through sV (free until the loop's first V tile, issued
    // after a __syncthreads), in flight together with the first K tile.
    load_tile_async<BQ, D>(sV, qh, ld_q, q0, T);
    load_tile_async<BK, D>(sK, kh, ld_kv, kt_begin * BK, T);
    cp_async_commit();
    cp_async_wait<0>();
  } else {
    // Q -> registers, through sK (free until the first K tile load, which sits
    // behind the loop's leading __syncthreads).
    load_tile<BQ, D>(sK, qh, ld_q, q0, T);
  }
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) load_a<LDS, kAsync>(qf[kk], (kAsync ? sV : sK) + wrow * LDS + kk * 16, lane);

  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  // Row statistics for the thread's two rows (g and g + 8 of the warp's 16):
  // m in raw (unscaled) score units, l a per-thread partial sum.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int row[2] = {q0 + wrow + g, q0 + wrow + g + 8};
  int lo[2] = {0, 0};
  if constexpr (kDocs) document_starts(lo, doc, b, T, row, key_row0);

  // Keys [0, kv_end) can be seen by this tile (every key without the causal mask).
  const int kv_end = causal ? min(T, q0 + BQ) : T;
  const int n_tiles = (kv_end + BK - 1) / BK;
  for (int kt = kt_begin; kt < n_tiles; ++kt) {
    const int k0 = kt * BK;
    if constexpr (kAsync) {
      // K tile kt was issued before (the prologue or the previous tile's P V).
      cp_async_wait<0>();
      __syncthreads();  // K tile kt is everyone's; everyone is done with sV (P V, or Q)
      load_tile_async<BK, D>(sV, vh, ld_kv, k0, T);
      cp_async_commit();
    } else {
      __syncthreads();  // everyone is done with the previous sK / sV (and with Q in sK)
      load_tile<BK, D>(sK, kh, ld_kv, k0, T);
      load_tile<BK, D>(sV, vh, ld_kv, k0, T);
      __syncthreads();
    }

    // S = Q K^T for this warp's 16 rows x BK keys.
    float s[NK][4];
#pragma unroll
    for (int j = 0; j < NK; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) mma_b_rows<NK, LDS, kAsync>(s, qf[kk], sK + kk * 16, lane);

    if constexpr (kDocs) mask_before_documents<NK>(s, lo, k0, c);
    softmax_tile<NK, ND>(s, o, m, l, row, k0, q0 + wrow, c, causal, T, scale_log2);

    if constexpr (kAsync) {
      cp_async_wait<0>();
      __syncthreads();  // V tile kt is everyone's; everyone is done with sK
      if (kt + 1 < n_tiles) {
        load_tile_async<BK, D>(sK, kh, ld_kv, k0 + BK, T);
        cp_async_commit();
      }
    }

    // O += P V: P's A fragments come from pairs of S tiles (bf16), V's B
    // fragments run down the rows of sV.
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t pa[4];
      a_from_c(pa, s[2 * kk], s[2 * kk + 1]);
      mma_b_cols<ND, LDS, kAsync>(o, pa, sV + (kk * 16) * LDS, lane);
    }
  }

  finish_rows<ND>(out, lse, o, m, l, row, b, h, Hq, T, q0 + wrow, g, c, scale);
}

template <int D, bool kAsync>
void launch_fwd(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T,
                int Hq, int Hkv, bool causal, cudaStream_t stream, AttentionDocs docs) {
  constexpr int BQ = 16 * kWarps;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const dim3 grid(ceil_div(T, BQ), Hq, B);
  if constexpr (kAsync) {
    if (docs.start) {
      fwd_kernel<D, true, true><<<grid, kThreads, 0, stream>>>(out, lse, q, ld_q, k, v, ld_kv, T, Hq, Hq / Hkv, scale,
                                                               scale * kLog2e, causal, docs.start, docs.key_row0);
      KVS_CUDA_LAUNCH_CHECK("flash_attention_forward (documents)", stream);
      return;
    }
  }
  fwd_kernel<D, kAsync><<<grid, kThreads, 0, stream>>>(out, lse, q, ld_q, k, v, ld_kv, T, Hq, Hq / Hkv, scale,
                                                       scale * kLog2e, causal, nullptr, 0);
  KVS_CUDA_LAUNCH_CHECK("flash_attention_forward", stream);
}

template <bool kAsync>
void launch_fwd(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T,
                int Hq, int Hkv, int D, bool causal, cudaStream_t stream, AttentionDocs docs = {}) {
  switch (D) {
    case 16: return launch_fwd<16, kAsync>(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal, stream, docs);
    case 32: return launch_fwd<32, kAsync>(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal, stream, docs);
    case 64: return launch_fwd<64, kAsync>(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal, stream, docs);
    default: return launch_fwd<128, kAsync>(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, causal, stream, docs);
  }
}

}  // namespace flash

bool flash_hopper_available(int D) {
#ifdef KVS_CUDA_SM90A
  if (D != 64 && D != 128) return false;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    return false;
  }
  return major == 9 && minor == 0;
#else
  (void)D;
  return false;
#endif
}

void flash_attention_forward(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv,
                             int B, int T, int Hq, int Hkv, int D, cudaStream_t stream) {
  flash_attention_forward(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, true, FlashLoads::kAsync, stream);
}

void flash_attention_forward(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv,
                             int B, int T, int Hq, int Hkv, int D, bool causal, cudaStream_t stream) {
  flash_attention_forward(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, causal, FlashLoads::kAsync, stream);
}

void flash_attention_forward(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv,
                             int B, int T, int Hq, int Hkv, int D, bool causal, FlashLoads loads,
                             cudaStream_t stream, AttentionDocs docs) {
  flash::check_args("flash_attention_forward", {out, q, k, v}, {lse}, ld_q, ld_kv, B, T, Hq, Hkv, D);
  if (B == 0 || T == 0) return;
  if (const int groups = flash::hopper_groups(loads, false); groups > 0 && flash_hopper_available(D))
    flash::launch_fwd_sm90(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, causal, stream, docs, groups);
  else if (loads != FlashLoads::kSync || docs.start)  // documents: the cp.async kernels
    flash::launch_fwd<true>(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, causal, stream, docs);
  else
    flash::launch_fwd<false>(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, causal, stream);
}

namespace flash {

// The running (acc, acc_lse) and a block's (out, lse) merged by their
// log-sum-exp, in fp32, in two passes so that both read and write memory in
// consecutive addresses: merge_values_kernel, one thread per element of acc
// [B, T, Hq, D] with its row's weights from the old acc_lse, then
// merge_lse_kernel, one thread per (b, h, t) row, the new acc_lse (a single
// pass would update acc_lse while other threads of its row still read it). A
// row the block does not reach (lse = -inf) keeps its accumulator; the first
// block a row sees is copied.
__device__ __forceinline__ float merged_lse(float al, float pl) {
  const float m = fmaxf(al, pl);
  return m + logf(expf(al - m) + expf(pl - m));
}

__global__ void merge_values_kernel(float* acc, const float* acc_lse, const bf16* out, const float* lse, int T, int Hq,
                                    int D, size_t elems) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // ((b * T + t) * Hq + h) * D + d
  if (i >= elems) return;
  const size_t bth = i / D, h = bth % Hq, bt = bth / Hq, t = bt % T, b = bt / T;
  const size_t n = (b * Hq + h) * T + t;
  const float pl = lse[n], al = acc_lse[n];
  if (pl == -INFINITY) return;
  const float o = __bfloat162float(out[i]);
  if (al == -INFINITY) {
    acc[i] = o;
    return;
  }
  const float merged = merged_lse(al, pl);
  acc[i] = expf(al - merged) * acc[i] + expf(pl - merged) * o;
}

__global__ void merge_lse_kernel(float* acc_lse, const float* lse, size_t rows) {
  const size_t n = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // (b * Hq + h) * T + t
  if (n >= rows) return;
  const float pl = lse[n], al = acc_lse[n];
  if (pl == -INFINITY) return;
  acc_lse[n] = al == -INFINITY ? pl : merged_lse(al, pl);
}

}  // namespace flash

void attention_merge(float* acc, float* acc_lse, const bf16* out, const float* lse, int B, int T, int Hq, int D,
                     cudaStream_t stream) {
  const size_t rows = static_cast<size_t>(B) * Hq * T, elems = rows * D;
  if (rows == 0) return;
  flash::merge_values_kernel<<<ceil_div(elems, 256), 256, 0, stream>>>(acc, acc_lse, out, lse, T, Hq, D, elems);
  KVS_CUDA_LAUNCH_CHECK("attention_merge (values)", stream);
  flash::merge_lse_kernel<<<ceil_div(rows, 256), 256, 0, stream>>>(acc_lse, lse, rows);
  KVS_CUDA_LAUNCH_CHECK("attention_merge (lse)", stream);
}

}  // namespace kvs::cuda
