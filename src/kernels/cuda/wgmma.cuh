// Hopper's warpgroup MMA (PTX wgmma, sm_90a): the wrappers the Hopper flash
// attention kernels (flash_attention_{fwd,bwd}_sm90.cu) issue, and the shared
// memory descriptors they read their tiles through. The inline PTX here and
// in flash_attention_common.cuh is all there is in the kernels:
// tests/simt/gen.py maps each wrapper's instruction to the SIMT emulator's
// version of it (tests/simt/emu.h, which also says what it checks).
//
// A wgmma is issued by a warpgroup (4 consecutive warps, the first one's
// index a multiple of 4) and runs asynchronously:
//   wgmma_fence();            // before the first wgmma that reads registers
//                             // written since (accumulators, register A)
//   wgmma_*(...); ...         // issue, in order, into this thread's open group
//   wgmma_commit();           // close the group
//   wgmma_wait<N>();          // every group but the N most recent is done
// and the accumulator and register-A operands must not be touched in
// between. reg_fence on each accumulator register after the wait keeps the
// compiler from moving their reads above it (CUTLASS's
// warpgroup_fence_operand).
//
// D[64][N] += A[64][16] B[16][N], fp32 accumulators: warp w % 4 of the
// warpgroup holds rows 16 (w % 4) .. + 15, as the mma.m16n8k16 C layout of
// flash_attention_common.cuh repeated over the N/8 column blocks:
//   d[i][0..1] = D[g][8i + 2c .. + 1]   d[i][2..3] = D[g + 8][8i + 2c .. + 1]
// A from registers has the mma.m16n8k16 A layout on the warp's 16 rows, so a
// pair of S accumulator blocks is P's A operand as it is (a_from_c).
//
// Shared-memory operands are described by a 64-bit descriptor (PTX ISA,
// "Matrix Descriptor Format"): start address, leading-dimension and
// stride-dimension byte offsets (LBO, SBO; all three in 16-byte units) and
// the layout, here always the 128-byte swizzle: a tile is stored as column
// blocks of 64 bf16 (128 bytes per row), rows 128 bytes apart, the block's
// 1024-byte-aligned atoms of 8 rows, and the 16-byte chunk j of row r stored
// at chunk j ^ (r % 8) (the hardware XORs address bits 4-6 with bits 7-9).
// For such a [rows][64 * blocks] tile:
//   K-major operand (k runs along the row: Q and K for S = Q K^T): SBO = 1024
//     (8 rows), LBO unused (16); k-step kk starts at block kk / 4, byte
//     32 (kk % 4) of the row;
//   MN-major operand (n runs along the row: V for O += P V, trans-b): SBO =
//     1024 (the next 8 k rows), LBO = the column block's size in bytes (the
//     next 64 n); k-step kk starts at row 16 kk.
// Shared memory written by cp.async (the generic proxy) needs
// fence_proxy_async in each writing thread, then a barrier, before a wgmma
// (the async proxy) reads it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace kvs::cuda::flash {

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVS_NO_WGMMA 1  // a device pass for another target: the wrappers trap (never launched there)
#endif

// The descriptor of a 128-byte-swizzled operand starting at p.
__device__ __forceinline__ uint64_t wgmma_desc(const void* p, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16 |
         static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32 | uint64_t{1} << 62;
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef KVS_NO_WGMMA
  __trap();
#else
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef KVS_NO_WGMMA
  __trap();
#else
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef KVS_NO_WGMMA
  __trap();
#else
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Shared memory written by the generic proxy (st.shared, cp.async) and read
// next by wgmma (the async proxy): each writing thread fences before the barrier.
__device__ __forceinline__ void fence_proxy_async() {
#ifdef KVS_NO_WGMMA
  __trap();
#else
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// A compiler-only fence on one register (no instruction).
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }
template <int NT>
__device__ __forceinline__ void reg_fence(float (&d)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) reg_fence(d[i][e]);
}

// d (+)= A B, m64n64k16: A K-major from the descriptor a, B K-major from b
// (S = Q K^T: both tiles hold k along their rows). ScaleD 0: d = A B.
template <int ScaleD>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[8][4], uint64_t a, uint64_t b) {
  [[maybe_unused]] constexpr int kN = 64, kTransB = 0;
#ifdef KVS_NO_WGMMA
  __trap();
#else
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, %34, 1, 1, 0, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a), "l"(b), "n"(ScaleD));
#endif
}

// d (+)= A B, m64nNk16 (N = 64 or 128): A from registers (this thread's
// mma.m16n8k16 A fragment), B MN-major from the descriptor b (O += P V: V's
// tile holds n along its rows).
template <int N, int ScaleD>
__device__ __forceinline__ void wgmma_rs_trans_b(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b) {
  static_assert(N == 64 || N == 128, "wgmma_rs_trans_b: N = 64 or 128");
  [[maybe_unused]] constexpr int kN = N, kTransB = 1;
#ifdef KVS_NO_WGMMA
  __trap();
#else
  if constexpr (N == 64) {
      asm volatile(
          "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
          "{%0, %1, %2, %3, %4, %5, %6, %7, "
          "%8, %9, %10, %11, %12, %13, %14, %15, "
          "%16, %17, %18, %19, %20, %21, %22, %23, "
          "%24, %25, %26, %27, %28, %29, %30, %31}, "
          "{%32, %33, %34, %35}, %36, %37, 1, 1, 1;\n"
          : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
            "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
            "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
            "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
            "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
            "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
            "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
            "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(ScaleD));
  } else {
      asm volatile(
          "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
          "{%0, %1, %2, %3, %4, %5, %6, %7, "
          "%8, %9, %10, %11, %12, %13, %14, %15, "
          "%16, %17, %18, %19, %20, %21, %22, %23, "
          "%24, %25, %26, %27, %28, %29, %30, %31, "
          "%32, %33, %34, %35, %36, %37, %38, %39, "
          "%40, %41, %42, %43, %44, %45, %46, %47, "
          "%48, %49, %50, %51, %52, %53, %54, %55, "
          "%56, %57, %58, %59, %60, %61, %62, %63}, "
          "{%64, %65, %66, %67}, %68, %69, 1, 1, 1;\n"
          : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
            "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
            "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
            "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
            "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
            "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
            "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
            "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
            "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
            "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
            "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
            "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
            "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
            "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
            "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
            "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(ScaleD));
  }
#endif
}

}  // namespace kvs::cuda::flash
