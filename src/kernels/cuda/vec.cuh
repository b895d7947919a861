// Vectorised row access shared by the elementwise kernels: V consecutive
// values per thread, one 16-byte access for V == 8 (the caller checks the
// alignment with aligned16 and falls back to V == 1), 8-byte bf16 and 16-byte
// fp32 accesses for V == 4 (aligned8 and aligned16), fp32 in registers.
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
inline bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

// V consecutive bf16 <-> fp32 (V == 8: one 16-byte access; p 16-byte aligned).
template <int V>
__device__ __forceinline__ void load_bf16(float (&v)[V], const bf16* p) {
  if constexpr (V == 8 || V == 4) {  // one 16- or 8-byte access
    using Packed = std::conditional_t<V == 8, uint4, uint2>;
    const Packed packed = *reinterpret_cast<const Packed*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
    for (int k = 0; k < V / 2; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      v[2 * k] = f.x;
      v[2 * k + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = to_f32(p[k]);
  }
}
template <int V>
__device__ __forceinline__ void store_bf16(bf16* p, const float (&v)[V]) {
  if constexpr (V == 8 || V == 4) {
    using Packed = std::conditional_t<V == 8, uint4, uint2>;
    Packed packed;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
    for (int k = 0; k < V / 2; ++k) h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
    *reinterpret_cast<Packed*>(p) = packed;
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) p[k] = to_bf16(v[k]);
  }
}
// V consecutive fp32 (global or shared; V == 8: two float4 accesses).
template <int V>
__device__ __forceinline__ void load_f32(float (&v)[V], const float* p) {
  if constexpr (V == 8) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else if constexpr (V == 4) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = p[k];
  }
}
template <int V>
__device__ __forceinline__ void store_f32(float* p, const float (&v)[V]) {
  if constexpr (V == 8) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else if constexpr (V == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) p[k] = v[k];
  }
}

}  // namespace kvs::cuda
