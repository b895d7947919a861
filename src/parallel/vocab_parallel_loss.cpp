#include "parallel/vocab_parallel_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dist/comm.h"
#include "kernels/cpu/ops.h"

namespace kvs {

void vocab_parallel_cross_entropy(float* losses, float* dlogits, int32_t* argmax, const float* logits,
                                  const int32_t* targets, const float* mask, int N, const LocalDims& d,
                                  double grad_scale, dist::Communicator& comm, std::vector<double>& scratch) {
  using dist::DType;
  using dist::ReduceOp;
  const int V = d.V;                                          // local columns (padding included)
  const int valid = std::clamp(d.v_valid - d.v_begin, 0, V);  // local columns that are real tokens
  const double lowest = -std::numeric_limits<double>::infinity();
  scratch.assign(4 * static_cast<size_t>(N), 0.0);
  double* row_max = scratch.data();     // [N]
  double* sums = row_max + N;           // [2N]: sum of exp, target logit
  double* candidate = sums + 2 * N;     // [N]: minus the global index of a local maximum

  // 1. Row maxima over the real columns of every rank.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = logits + static_cast<size_t>(n) * V;
    float mx = -std::numeric_limits<float>::infinity();
    int at = -1;
    for (int v = 0; v < valid; ++v)
      if (x[v] > mx) {
        mx = x[v];
        at = v;
      }
    row_max[n] = mx;
    candidate[n] = at;  // local index for now
  }
  if (argmax) {
    // Kept aside: step 2 overwrites row_max with the global maximum.
    for (int n = 0; n < N; ++n) sums[n] = row_max[n];
  }
  comm.all_reduce(row_max, N, DType::F64, ReduceOp::Max);
  if (argmax) {
    for (int n = 0; n < N; ++n)
      candidate[n] = candidate[n] >= 0 && sums[n] == row_max[n] ? -(d.v_begin + candidate[n]) : lowest;
    comm.all_reduce(candidate, N, DType::F64, ReduceOp::Max);
    for (int n = 0; n < N; ++n) argmax[n] = static_cast<int32_t>(-candidate[n]);
  }

  // 2. Sum of exp(x - max) and the target's logit, local parts, then summed.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = logits + static_cast<size_t>(n) * V;
    float* dx = dlogits ? dlogits + static_cast<size_t>(n) * V : nullptr;
    const double m = mask ? mask[n] : 1.0;
    const int t = targets[n] - d.v_begin;
    sums[N + n] = m != 0.0 && t >= 0 && t < valid ? static_cast<double>(x[t]) : 0.0;  // read before dx is written
    // exp eight lanes at a time (exp_shifted: the scalar exp_fast's bits),
    // into dx or a chunk on the stack, summed one by one in double as before.
    double s = 0.0;
    const float mx = static_cast<float>(row_max[n]);
    constexpr int kChunk = 256;
    float chunk[kChunk];
    for (int v0 = 0; v0 < valid; v0 += kChunk) {
      const int nv = std::min(kChunk, valid - v0);
      float* e = dx ? dx + v0 : chunk;
      cpu::detail::exp_shifted(e, x + v0, nv, mx);
      for (int v = 0; v < nv; ++v) s += e[v];
    }
    if (dx)
      for (int v = valid; v < V; ++v) dx[v] = 0.0f;
    sums[n] = m != 0.0 ? s : 0.0;
  }
  comm.all_reduce(sums, 2 * static_cast<size_t>(N), DType::F64, ReduceOp::Sum);

  // 3. Losses and dlogits = (softmax - onehot(target)) * mask * grad_scale.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const double m = mask ? mask[n] : 1.0;
    float* dx = dlogits ? dlogits + static_cast<size_t>(n) * V : nullptr;
    if (m == 0.0) {
      if (losses) losses[n] = 0.0f;
      if (dx) std::fill(dx, dx + V, 0.0f);
      continue;
    }
    if (dx) {
      const float k = static_cast<float>(m * grad_scale / sums[n]);
      for (int v = 0; v < valid; ++v) dx[v] *= k;
      const int t = targets[n] - d.v_begin;
      if (t >= 0 && t < valid) dx[t] -= static_cast<float>(m * grad_scale);
    }
    if (losses) losses[n] = static_cast<float>(m * (row_max[n] + std::log(sums[n]) - sums[N + n]));
  }
}

}  // namespace kvs
