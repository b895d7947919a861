// Shared by the Hopper (sm_90a) flash attention kernels
// (flash_attention_fwd_sm90.cu, flash_attention_bwd_sm90.cu): their tiles of
// 64 rows in wgmma's 128-byte-swizzled layout (wgmma.cuh) and the cp.async
// loads that write them.
#pragma once
#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace kvs::cuda::flash {

constexpr int kSm90Rows = 64;                        // rows of every tile (queries or keys)
constexpr uint32_t kSm90BlockBytes = kSm90Rows * 128;  // one swizzled column block of 64 bf16

// The start of the kernel's tiles in its dynamic shared memory: the swizzle
// works on address bits 4-9, so tiles start 1024-byte aligned (the launchers
// ask for 1 KB of slack).
__device__ __forceinline__ bf16* sm90_tiles(unsigned char* raw) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  return reinterpret_cast<bf16*>(raw + (1024 - addr % 1024) % 1024);
}

// Element offset of 16-byte chunk `chunk` (of D / 8) of row r in a [64][D]
// tile stored as D / 64 swizzled column blocks of [64][64].
__device__ __forceinline__ int swizzled(int r, int chunk) {
  return (chunk / 8) * (kSm90Rows * 64) + r * 64 + (((chunk % 8) ^ (r % 8)) * 8);
}

// Element offset where k-step kk (16 columns) of a K-major operand's
// descriptor starts: column block kk / 4, byte 32 (kk % 4) of its rows.
__device__ __forceinline__ int sm90_kstep_offset(int kk) { return (kk / 4) * (kSm90Rows * 64) + (kk % 4) * 16; }

// Rows [r0, r0 + 64) of a [T, D] slice (row stride ld) into a swizzled tile
// by cp.async; rows >= T zero-filled. All kLoaders threads of the block call it.
template <int D, int kLoaders = kThreads>
__device__ __forceinline__ void load_tile_swizzled(bf16* s, const bf16* src, size_t ld, int r0, int T) {
  constexpr int kChunksPerRow = D / 8, kChunks = kSm90Rows * kChunksPerRow;
  constexpr int kRounds = (kChunks + kLoaders - 1) / kLoaders;
#pragma unroll
  for (int it = 0; it < kRounds; ++it) {
    const int i = it * kLoaders + static_cast<int>(threadIdx.x);
    if (kChunks % kLoaders != 0 && i >= kChunks) break;  // the last round of an uneven split
    const int r = i / kChunksPerRow, chunk = i % kChunksPerRow;
    const bool in = r0 + r < T;  // outside: no bytes read, from a valid address all the same
    cp_async_16(s + swizzled(r, chunk), src + static_cast<size_t>(in ? r0 + r : 0) * ld + chunk * 8, in ? 16 : 0);
  }
}

// d = A B^T for two [64][D] swizzled tiles a and b holding the head
// dimension along their rows (K-major both: S = Q K^T and the like), in D / 16
// k-steps of 16, the first overwriting d.
template <int D>
__device__ __forceinline__ void wgmma_rows_by_rows(float (&d)[8][4], const bf16* a, const bf16* b) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int off = sm90_kstep_offset(kk);
    const uint64_t da = wgmma_desc(a + off, 16, 1024), db = wgmma_desc(b + off, 16, 1024);
    if (kk == 0)
      wgmma_ss_n64<0>(d, da, db);
    else
      wgmma_ss_n64<1>(d, da, db);
  }
}

// acc += A B: A a 64 x 64 score tile as this thread's A fragments (a_from_c,
// k-step kk = columns 16 kk .. + 15), B the [64][D] swizzled tile b, whose
// rows are k (MN-major, "trans-b": P V, dS K and the like).
template <int D>
__device__ __forceinline__ void wgmma_regs_by_rows(float (&acc)[D / 8][4], const uint32_t (&a)[4][4], const bf16* b) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wgmma_rs_trans_b<D, 1>(acc, a[kk], wgmma_desc(b + kk * 16 * 64, kSm90BlockBytes, 1024));
}

}  // namespace kvs::cuda::flash
