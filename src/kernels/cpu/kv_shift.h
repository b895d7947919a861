// KV shifting, generalised to a window of W past positions (CUDA: shift_rope.cu,
// fused with RoPE).
//
// Positions are the op's coordinates: rows 0..Tn-1 of each sequence are `in`;
// an optional halo holds the W raw rows of positions -W..-1 before them (the
// previous chunk's last rows, for context parallelism and chunked decoding).
// Without a halo those positions are zero, as at the start of a sequence.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/row_reduce.h"
#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

namespace detail {
// Row p of sequence b: in[b, p] for p >= 0, halo[b, W + p] for -W <= p < 0.
template <class T>
inline const T* shift_row(const T* in, const T* halo, int b, int p, int Tn, int W, size_t row) {
  return p >= 0 ? in + ((size_t)b * Tn + p) * row : halo + ((size_t)b * W + (W + p)) * row;
}
}  // namespace detail

// out[b, t, h, :] = sum_{w=0..W} coef[h, w] * x[b, t - W + w, h, :], summed oldest
// first, starting from 0, where x is `in` at positions >= 0 and `halo`
// ([B, W, H, D], positions -W..-1) before; a null halo means zeros there.
// coef is [H, W+1], oldest position first (window 1: coef[h,0] weights t-1, coef[h,1] weights t).
// Document boundaries: doc_start ([B, Tn]) is the first position of t's
// document in the same coordinates; rows before it count as zero too, so the
// shift restarts at every document as at the sequence start. doc_start 0
// excludes the halo; a document that continues from the halo has
// doc_start <= -W (any such value: all W halo rows count), and a document that
// starts inside the halo has its start there (-W < doc_start < 0).
template <class T>
void kv_shift_forward(T* out, const T* in, const T* coef, int B, int Tn, int H, int D, int W,
                      const int32_t* doc_start = nullptr, const T* halo = nullptr) {
  static_assert(detail::kSupported<T>);
  const size_t row = (size_t)H * D;
  const int first = halo ? -W : 0;  // the oldest position that has a row
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < Tn; ++t) {
      T* o = out + ((size_t)b * Tn + t) * row;
      // first row that is not zero history
      const int lo = doc_start ? std::max(first, (int)doc_start[(size_t)b * Tn + t]) : first;
      for (int h = 0; h < H; ++h) {
        T* oh = o + (size_t)h * D;
        for (int d = 0; d < D; ++d) oh[d] = T(0);
        for (int w = std::max(0, W - t + lo); w <= W; ++w) {
          const T c = coef[(size_t)h * (W + 1) + w];
          const T* x = detail::shift_row(in, halo, b, t - W + w, Tn, W, row) + (size_t)h * D;
          for (int d = 0; d < D; ++d) oh[d] += c * x[d];
        }
      }
    }
  }
}

// din[b,s,h,:]   += sum_w coef[h,w] dout[b,s+W-w,h,:]
// dhalo[b,W+p,h,:] += the same for the halo positions p = -W..-1 (parallel over (b, p));
//                   the gradient with respect to the halo rows (zeros when halo is null).
// dcoef[h,w]     += sum_{b,t,d} dout[b,t,h,d] x[b,t-W+w,h,d]  (in double; x reads the halo
//                   as the forward)
// din and dcoef come from one pass over the rows (b, t), in parallel blocks of
// kShiftRowBlock rows: each block writes its rows of din and sums its terms of
// dcoef, rows in order, into its own partial; dcoef then adds the partials in
// block order. The blocks are fixed, so nothing depends on the thread count.
// (dcoef as a second pass over dout and in, each row's dot reduced to a
// scalar, took 1.8x the time of din: lm-small's k, 2 threads, 0.153 -> 0.104 ms.)
// Terms that the forward's document boundaries drop are dropped here too.
// With overwrite_din, din is written instead of added into (each row is
// cleared, then its terms are added in the same order: the bits of adding
// into a zeroed buffer); dhalo and dcoef still accumulate.
namespace detail {
constexpr int kShiftRowBlock = 32;
}

template <class T>
void kv_shift_backward(T* din, T* dcoef, const T* dout, const T* in, const T* coef, int B, int Tn, int H, int D,
                       int W, const int32_t* doc_start = nullptr, const T* halo = nullptr, T* dhalo = nullptr,
                       bool overwrite_din = false) {
  static_assert(detail::kSupported<T>);
  const size_t row = (size_t)H * D;
  // d x_s for position s (>= -W) into dx: the outputs t = s + W - w in [0, Tn), increasing t.
  auto grad_row = [&](T* dx, int b, int s, bool overwrite) {
    if (overwrite) std::fill(dx, dx + row, T(0));
    for (int h = 0; h < H; ++h) {
      T* dxh = dx + (size_t)h * D;
      for (int w = W; w >= 0; --w) {
        const int t = s + W - w;
        if (t < 0) continue;
        if (t >= Tn) break;
        if (doc_start && doc_start[(size_t)b * Tn + t] > s) continue;  // s is before t's document
        const T c = coef[(size_t)h * (W + 1) + w];
        const T* g = dout + ((size_t)b * Tn + t) * row + (size_t)h * D;
        for (int d = 0; d < D; ++d) dxh[d] += c * g[d];
      }
    }
  };
  // Output row t's terms of dcoef, added lane by lane into acc [H, W+1] (one
  // kLanes-wide partial per coefficient; reducing each row's dot to a scalar
  // made a chain of kLanes dependent adds per term) and tail [H, W+1] (the last
  // D % kLanes channels).
  using Lanes = detail::Lanes<double>;
  constexpr int kL = detail::kLanes;
  const int d_full = D / kL * kL;
  const int first = halo ? -W : 0;
  auto coef_terms = [&](Lanes* acc, double* tail, int b, int t) {
    const T* gt = dout + ((size_t)b * Tn + t) * row;
    const int lo = doc_start ? std::max(first, (int)doc_start[(size_t)b * Tn + t]) : first;
    for (int w = std::max(0, W - t + lo); w <= W; ++w) {
      const T* x = detail::shift_row(in, halo, b, t - W + w, Tn, W, row);
      for (int h = 0; h < H; ++h) {
        const T* gh = gt + (size_t)h * D;
        const T* xh = x + (size_t)h * D;
        const size_t i = (size_t)h * (W + 1) + w;
        Lanes v = acc[i];
        for (int d = 0; d < d_full; d += kL) v += detail::load_lanes_as<double>(gh + d) * detail::load_lanes_as<double>(xh + d);
        acc[i] = v;
        for (int d = d_full; d < D; ++d) tail[i] += (double)gh[d] * (double)xh[d];
      }
    }
  };
  constexpr int kRows = detail::kShiftRowBlock;
  const int nrows = B * Tn, nblocks = (nrows + kRows - 1) / kRows;
  const size_t ncoef = (size_t)H * (W + 1);
  static thread_local std::vector<double> partials;  // [nblocks, H, W+1], reused across calls
  if (dcoef) partials.resize(std::max(partials.size(), (size_t)nblocks * ncoef));
  double* const part = dcoef ? partials.data() : nullptr;
  if (din || dcoef) {
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; ++blk) {
      static thread_local std::vector<Lanes> acc;  // this block's partials, per thread
      static thread_local std::vector<double> tail;
      if (part) {
        acc.assign(ncoef, Lanes{});
        tail.assign(ncoef, 0.0);
      }
      for (int r = blk * kRows; r < std::min(nrows, (blk + 1) * kRows); ++r) {
        const int b = r / Tn, t = r % Tn;
        if (din) grad_row(din + (size_t)r * row, b, t, overwrite_din);
        if (part) coef_terms(acc.data(), tail.data(), b, t);
      }
      if (part)
        for (size_t i = 0; i < ncoef; ++i) {
          double sum = tail[i];
          for (int j = 0; j < kL; ++j) sum += acc[i][j];
          part[(size_t)blk * ncoef + i] = sum;
        }
    }
  }
  if (dhalo) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < W; ++i) grad_row(dhalo + ((size_t)b * W + i) * row, b, i - W, false);
  }
  if (dcoef)
    for (size_t i = 0; i < ncoef; ++i) {
      double sum = 0.0;
      for (int blk = 0; blk < nblocks; ++blk) sum += part[(size_t)blk * ncoef + i];
      dcoef[i] += (T)sum;
    }
}

// sq[h,w] += sum_{b,t,d} (dout[b,t,h,d] x[b,t-W+w,h,d])^2: the squares of the
// terms kv_shift_backward sums into dcoef[h,w], over the same terms. A
// coefficient's gradient is one sum over every token and channel whose terms
// mostly cancel; sqrt(sq) is the size rounding errors in those terms are
// relative to (tests/model/engine_variants.h measures the CUDA engine's
// coefficient gradients against it).
template <class T>
void kv_shift_term_squares(double* sq, const T* dout, const T* in, int B, int Tn, int H, int D, int W,
                           const int32_t* doc_start = nullptr, const T* halo = nullptr) {
  static_assert(detail::kSupported<T>);
  const size_t row = (size_t)H * D;
  const int first = halo ? -W : 0;
#pragma omp parallel for schedule(static)
  for (int h = 0; h < H; ++h) {
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < Tn; ++t) {
        const T* g = dout + ((size_t)b * Tn + t) * row + (size_t)h * D;
        const int lo = doc_start ? std::max(first, (int)doc_start[(size_t)b * Tn + t]) : first;
        for (int w = std::max(0, W - t + lo); w <= W; ++w) {
          const T* x = detail::shift_row(in, halo, b, t - W + w, Tn, W, row) + (size_t)h * D;
          double s = 0;
          for (int d = 0; d < D; ++d) s += ((double)g[d] * x[d]) * ((double)g[d] * x[d]);
          sq[(size_t)h * (W + 1) + w] += s;
        }
      }
    }
  }
}

}  // namespace kvs::cpu
