// Linear layers: out = inp W^T and its backward. float runs on the CPU's GEMM
// library (gemm_library.h: OpenBLAS or oneDNN), double on OpenBLAS (CUDA:
// matmul.cu / matmul.h, cuBLASLt). The same bits for a fixed library, kernel
// family and thread count; OpenBLAS's not across thread counts (some shapes'
// K blocking follows the threads: docs/KERNELS.md). Called from outside any
// OpenMP region.
#pragma once
#include <cblas.h>

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "kernels/cpu/gemm_library.h"
#include "kernels/cpu/op_profile.h"
#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

namespace detail {
template <class T>
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, T alpha, const T* A, int lda,
                 const T* Bm, int ldb, T beta, T* Cm, int ldc) {
  if constexpr (std::is_same_v<T, float>)
    sgemm(ta == CblasTrans, tb == CblasTrans, M, N, K, alpha, A, lda, Bm, ldb, beta, Cm, ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, Bm, ldb, beta, Cm, ldc);
}
}  // namespace detail

// out[N, OC] = inp[N, C] @ W[OC, C]^T  (overwrites out).
template <class T> void matmul_forward(T* out, const T* inp, const T* W, int N, int C, int OC) {
  static_assert(detail::kSupported<T>);
  if (N == 0 || OC == 0) return;
  if (C == 0) {
    std::fill(out, out + (size_t)N * OC, T(0));
    return;
  }
  // beta = 0: out is never read
  const profile::GemmScope timed("fwd", N, OC, C);
  detail::gemm<T>(CblasNoTrans, CblasTrans, N, OC, C, T(1), inp, C, W, C, T(0), out, OC);
}

// dinp[N, C] += dout @ W ; dW[OC, C] += dout^T @ inp. With overwrite_dinp,
// dinp = dout @ W instead (the caller need not zero it first).
template <class T>
void matmul_backward(T* dinp, T* dW, const T* dout, const T* inp, const T* W, int N, int C, int OC,
                     bool overwrite_dinp = false) {
  static_assert(detail::kSupported<T>);
  if (N == 0 || C == 0) return;
  if (OC == 0) {
    if (dinp && overwrite_dinp) std::fill(dinp, dinp + (size_t)N * C, T(0));
    return;
  }
  if (dinp) {
    const profile::GemmScope timed("bwd dinp", N, C, OC);
    detail::gemm<T>(CblasNoTrans, CblasNoTrans, N, C, OC, T(1), dout, OC, W, C, overwrite_dinp ? T(0) : T(1), dinp,
                    C);
  }
  if (dW) {
    const profile::GemmScope timed("bwd dW", OC, C, N);
    detail::gemm<T>(CblasTrans, CblasNoTrans, OC, C, N, T(1), dout, OC, inp, C, T(1), dW, C);
  }
}

}  // namespace kvs::cpu
