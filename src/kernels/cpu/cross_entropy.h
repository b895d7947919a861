// Masked cross-entropy with its gradient in one pass (CUDA: cross_entropy.cu;
// the vocabulary-parallel form lives in model/vocab_parallel_loss.cpp and
// kernels/cuda/vocab_parallel_ce.cu).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/exp_fast.h"
#include "kernels/cpu/row_reduce.h"
#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

// Masked cross-entropy over rows of logits [N, V]:
// losses[n] = mask[n] * (logsumexp(logits[n]) - logits[n, targets[n]]).
// If dlogits is non-null it is set (overwritten) to
// mask[n] * grad_scale * (softmax(logits[n]) - onehot(targets[n])); it may alias logits.
// If argmax is non-null it receives each row's argmax (first maximum).
//
// Per row (parallel over rows): pass 1 reads max, first argmax and the target
// logit; pass 2 computes e_v = exp(x_v - max) in chunks through a stack buffer
// (vectorised exp), sums them in double and copies them into dlogits when
// wanted (safe under aliasing: x_v is read first); pass 3 scales. A null mask
// means all ones. Rows with mask 0 get loss 0 and a zero gradient row, and
// their target is never read (it may be e.g. -1).
template <class T>
void cross_entropy_forward_backward(T* losses, T* dlogits, int32_t* argmax, const T* logits, const int32_t* targets,
                                    const float* mask, int N, int V, double grad_scale) {
  static_assert(detail::kSupported<T>);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = logits + (size_t)n * V;
    const double m = mask ? (double)mask[n] : 1.0;
    T mx = x[0];
    int amax = 0;
    for (int v = 1; v < V; ++v) {
      if (x[v] > mx) {
        mx = x[v];
        amax = v;
      }
    }
    if (argmax) argmax[n] = amax;
    if (m == 0.0) {
      if (losses) losses[n] = T(0);
      if (dlogits) {
        T* dx = dlogits + (size_t)n * V;
        for (int v = 0; v < V; ++v) dx[v] = T(0);
      }
      continue;
    }
    const int tgt = targets[n];
    const double xt = (double)x[tgt];
    double sum = 0.0;
    constexpr int kChunk = 256;
    T e[kChunk];
    T* dx = dlogits ? dlogits + (size_t)n * V : nullptr;
    for (int v0 = 0; v0 < V; v0 += kChunk) {
      const int nv = std::min(kChunk, V - v0);
      detail::exp_shifted(e, x + v0, nv, mx);  // read before dx is written
      sum += detail::row_sum<T, double>(e, nv);
      if (dx)
        for (int j = 0; j < nv; ++j) dx[v0 + j] = e[j];
    }
    if (dx) {
      const T k = (T)(m * grad_scale / sum);
      for (int v = 0; v < V; ++v) dx[v] *= k;
      dx[tgt] -= (T)(m * grad_scale);
    }
    if (losses) losses[n] = (T)(m * ((double)mx + std::log(sum) - xt));
  }
}

}  // namespace kvs::cpu
