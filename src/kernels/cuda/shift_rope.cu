// Fused KV shift + RoPE and its adjoint.
//
// Both directions tile the (sequence, position) axis and group the heads:
// block (tile, g, b) handles positions t0 .. t0 + TT - 1 of sequence b for
// heads g * kHeadsPerBlock .. + kHeadsPerBlock - 1, one head after the other.
// A thread takes one "unit" of a row at a time: V consecutive columns, and
// with RoPE also the V columns half a head further (RoPE pairs column i with
// i + D/2). It reads the rows it needs straight from global memory and
// writes its outputs once:
//  - the shift's window rows t - W .. t - 1 are the neighbouring threads' own
//    rows, so each raw element comes from DRAM once and its W repeats from
//    L1/L2 (no shared-memory staging, no barrier);
//  - the RoPE tables are indexed by (position, column) only, so the block's
//    heads read the same table rows: from DRAM or L2 once per block, then L1.
// The first version staged fp32 rows in shared memory, one head per block;
// on an H200 it moved bytes at 0.59-0.64 (forward) and 0.38-0.45 (backward)
// of a device copy's rate (docs/PERFORMANCE.md).
//
// Rows outside [0, T) of sequence b are zeros (zero history before t = 0;
// nothing ever leaks between sequences).
//
// Vector width: V = 8 (16-byte global accesses) when D % 16 == 0, every row
// stride is a multiple of 8 elements and every pointer is 16-byte aligned;
// with ShiftRopeVector::k4, V = 4 (8-byte bf16 and 16-byte fp32 accesses)
// when D % 8 == 0, the strides are multiples of 4 and the bf16 pointers
// 8-byte aligned (the fp32 ones 16); V = 1 otherwise.
//
// Context parallelism: a sequence may be one chunk of a longer one. The W raw
// rows before its position 0 then come from `halo` ([B][W] rows, row stride
// ld_halo, oldest first) instead of zeros, and the backward writes their
// gradient into `dhalo` (fp32 [B][W] rows, row stride ld_dhalo, overwritten)
// from the tile at t0 = 0 (the gradient reaching a halo row comes from rows
// 0 .. W - 1). shift_halo_add returns such a gradient to the rows it came
// from (the chunk's last W rows).
//
// Documents (model.document_boundaries): with `doc` ([B][T] int32, the row
// where each position's document starts, in the same row coordinates, so
// negative when it began before a context-parallel chunk), the rows before
// an output row's document are zero history: the forward skips them, and the
// backward skips every term between two documents (dx, dcoef and dhalo), as
// kvs::cpu::kv_shift_forward/backward do with doc_start. A template switch
// (kDocs) of the unit kernels, so that the kernels without documents are the
// same code as before; the row walks take none (the launchers use the unit
// kernels then).
//
// Aliasing: a thread reads rows other threads write, so y must not alias x
// (nor dx alias dy) unless W == 0 (then every thread reads only the elements
// it writes, before it writes them).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vec.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kHeadsPerBlock = 4;  // heads per block: they share the RoPE table rows read
constexpr int kTileFloats = 2048;  // TT * D target: the rows of one head a block covers
constexpr int kMaxDcoefWindow = 8;  // dcoef partials live in registers: at most 9 per thread


int tile_rows(int D) { return std::clamp(kTileFloats / D, 1, 32); }
int head_groups(int H) { return (H + kHeadsPerBlock - 1) / kHeadsPerBlock; }


// V values of raw row tt of sequence b (p: its column in row 0 of the
// batch, row stride ld; seq = b * T) as fp32: rows inside [0, T), the halo
// rows -W .. -1 from `halo` (rows b W + W + tt, stride ld_halo; p's column)
// when given, zeros otherwise.
template <int V>
__device__ __forceinline__ void load_raw(float (&v)[V], const bf16* p, int ld, size_t seq, int tt, int T,
                                         const bf16* halo, int ld_halo, int W) {
  if (tt >= 0 && tt < T) {
    load_bf16<V>(v, p + (seq + tt) * ld);
  } else if (halo && tt < 0 && tt >= -W) {
    load_bf16<V>(v, halo + ((size_t)blockIdx.z * W + W + tt) * ld_halo);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = 0.0f;
  }
}

// s = sum_{w=0..W} c[w] x_{t-W+w}, oldest first (the CPU's order), over the
// rows from lo on (t's document start; earlier rows are zero history);
// c null: W = 0, s = x_t.
template <int V>
__device__ __forceinline__ void shifted(float (&s)[V], const bf16* p, int ld, size_t seq, int t, int T, int W,
                                        const float* c, const bf16* halo, int ld_halo, int lo) {
  if (!c) {
    load_raw<V>(s, p, ld, seq, t, T, halo, ld_halo, W);
    return;
  }
#pragma unroll
  for (int k = 0; k < V; ++k) s[k] = 0.0f;
  for (int w = 0; w <= W; ++w) {
    if (t - W + w < lo) continue;  // before t's document: a zero term
    float v[V];
    load_raw<V>(v, p, ld, seq, t - W + w, T, halo, ld_halo, W);
    const float cw = c[w];
#pragma unroll
    for (int k = 0; k < V; ++k) s[k] += cw * v[k];
  }
}

// The unrotated gradient ds_r = RoPE_r^T dy_r of a unit (g1: V columns at
// p, g2: V columns at p + half): ds1 = g1 cos + g2 sin, ds2 = g2 cos - g1 sin;
// without RoPE (cos null) ds1 = dy at p, ds2 = 0. Zero from r = T on.
template <int V>
__device__ __forceinline__ void unrotated(float (&d1)[V], float (&d2)[V], const bf16* p, int ld, size_t seq, int r,
                                          int T, int half, int j, const float* cos, const float* sin) {
  if (r >= T) {
#pragma unroll
    for (int k = 0; k < V; ++k) d1[k] = d2[k] = 0.0f;
    return;
  }
  const bf16* row = p + (seq + r) * ld;
  if (!cos) {
    load_bf16<V>(d1, row);
#pragma unroll
    for (int k = 0; k < V; ++k) d2[k] = 0.0f;
    return;
  }
  float g1[V], g2[V], cs[V], sn[V];
  load_bf16<V>(g1, row);
  load_bf16<V>(g2, row + half);
  load_f32<V>(cs, cos + (size_t)r * half + j);
  load_f32<V>(sn, sin + (size_t)r * half + j);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    d1[k] = g1[k] * cs[k] + g2[k] * sn[k];
    d2[k] = g2[k] * cs[k] - g1[k] * sn[k];
  }
}

// y = RoPE_t(s) of a unit, in fp32 (y1 = s1 cos - s2 sin, y2 = s2 cos + s1 sin
// with cos/sin of position t at cos_t, sin_t), stored as bf16 at p and p + half.
template <int V>
__device__ __forceinline__ void rotate_store(bf16* p, int half, const float (&s1)[V], const float (&s2)[V],
                                             const float* cos_t, const float* sin_t) {
  float cs[V], sn[V], y1[V], y2[V];
  load_f32<V>(cs, cos_t);
  load_f32<V>(sn, sin_t);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    y1[k] = s1[k] * cs[k] - s2[k] * sn[k];
    y2[k] = s2[k] * cs[k] + s1[k] * sn[k];
  }
  store_bf16<V>(p, y1);
  store_bf16<V>(p + half, y2);
}

// Forward: per unit, the shifted s of its columns in fp32, rotated in fp32
// (RoPE pairs i, i + D/2 with cos/sin of position t), written once in bf16.
template <int V, bool kDocs = false>
__global__ void __launch_bounds__(kThreads) shift_rope_forward_kernel(bf16* y, int ld_out, const bf16* x, int ld_in,
                                                                      const float* coef, const float* cos,
                                                                      const float* sin, int T, int H, int D, int W,
                                                                      int TT, const bf16* halo, int ld_halo,
                                                                      const int32_t* doc = nullptr) {
  const int t0 = blockIdx.x * TT, nt = min(TT, T - t0);
  const size_t seq = (size_t)blockIdx.z * T;  // first row of sequence b
  const int half = D / 2, units = cos ? half / V : D / V;  // units per row
  const int h_end = min(H, (int)(blockIdx.y + 1) * kHeadsPerBlock);
  for (int h = blockIdx.y * kHeadsPerBlock; h < h_end; ++h) {
    const int col = h * D;
    const float* c = coef ? coef + (size_t)h * (W + 1) : nullptr;
    const bf16* hx = halo ? halo + col : nullptr;
    for (int i = threadIdx.x; i < nt * units; i += blockDim.x) {
      const int j = (i % units) * V, t = t0 + i / units;
      const int lo = kDocs ? doc[seq + t] : INT_MIN;
      bf16* yr = y + (seq + t) * ld_out + col;
      if (cos) {
        float s1[V], s2[V];
        shifted<V>(s1, x + col + j, ld_in, seq, t, T, W, c, hx ? hx + j : nullptr, ld_halo, lo);
        shifted<V>(s2, x + col + half + j, ld_in, seq, t, T, W, c, hx ? hx + half + j : nullptr, ld_halo, lo);
        rotate_store<V>(yr + j, half, s1, s2, cos + (size_t)t * half + j, sin + (size_t)t * half + j);
      } else {
        float s[V];
        shifted<V>(s, x + col + j, ld_in, seq, t, T, W, c, hx ? hx + j : nullptr, ld_halo, lo);
        store_bf16<V>(yr + j, s);
      }
    }
  }
}

// Backward, per unit of row s, with ds = RoPE^T dy (0 from T on):
//   dx_s = sum_{w=W..0} c_w ds_{s+W-w}    (bf16, overwritten)
// and, when dcoef is wanted, per w the products ds_s . x_{s-W+w} of the
// unit's columns, summed in fp32 registers (one per w) over the thread's
// units of the head; a block reduction per (head, w) gives the tile's value,
// stored in partial[h][b, tile][w]. shift_dcoef_reduce_kernel sums the
// (b, tile) partials in a fixed order.
template <int V, bool kDocs = false>
__global__ void __launch_bounds__(kThreads) shift_rope_backward_kernel(
    bf16* dx, int ld_dx, float* partial, const bf16* dy, int ld_dy, const bf16* x, int ld_x, const float* coef,
    const float* cos, const float* sin, int T, int H, int D, int W, int TT, const bf16* halo, int ld_halo,
    float* dhalo, int ld_dhalo, const int32_t* doc = nullptr) {
  __shared__ float red[32];
  const int t0 = blockIdx.x * TT, nt = min(TT, T - t0);
  const size_t seq = (size_t)blockIdx.z * T;
  const int half = D / 2, units = cos ? half / V : D / V;
  const int h_end = min(H, (int)(blockIdx.y + 1) * kHeadsPerBlock);
  const size_t nblk = (size_t)gridDim.z * gridDim.x, blk = (size_t)blockIdx.z * gridDim.x + blockIdx.x;
  for (int h = blockIdx.y * kHeadsPerBlock; h < h_end; ++h) {
    const int col = h * D;
    const float* c = coef ? coef + (size_t)h * (W + 1) : nullptr;
    const bf16* dyh = dy + col;
    float acc[kMaxDcoefWindow + 1] = {};
    for (int i = threadIdx.x; i < nt * units; i += blockDim.x) {
      const int j = (i % units) * V, t = t0 + i / units;
      const int lo = kDocs ? doc[seq + t] : INT_MIN;
      float a1[V] = {}, a2[V] = {}, s1[V], s2[V];  // s: ds_t, for the partials
      for (int w = W; w >= 0; --w) {  // position t + W - w, increasing
        const int r = t + W - w;  // r = t at w = W: never another document
        if (kDocs && r < T && doc[seq + r] > t) continue;  // t is before r's document
        float d1[V], d2[V];
        unrotated<V>(d1, d2, dyh + j, ld_dy, seq, t + W - w, T, half, j, cos, sin);
        if (w == W) {
#pragma unroll
          for (int k = 0; k < V; ++k) s1[k] = d1[k], s2[k] = d2[k];
        }
        const float cw = c ? c[w] : 1.0f;
#pragma unroll
        for (int k = 0; k < V; ++k) a1[k] += cw * d1[k], a2[k] += cw * d2[k];
      }
      bf16* dxr = dx + (seq + t) * ld_dx + col;
      store_bf16<V>(dxr + j, a1);
      if (cos) store_bf16<V>(dxr + half + j, a2);
      if (partial) {
        const bf16* hx = halo ? halo + col + j : nullptr;
        // Unrolled to the largest window so that acc is indexed by constants
        // (a run-time index would move it to local memory).
#pragma unroll
        for (int w = 0; w <= kMaxDcoefWindow; ++w) {
          if (w > W) break;
          if (kDocs && t - W + w < lo) continue;  // before t's document: no term
          float x1[V], x2[V];
          load_raw<V>(x1, x + col + j, ld_x, seq, t - W + w, T, hx, ld_halo, W);
          float p = 0.0f;
#pragma unroll
          for (int k = 0; k < V; ++k) p += s1[k] * x1[k];
          if (cos) {
            load_raw<V>(x2, x + col + half + j, ld_x, seq, t - W + w, T, hx ? hx + half : nullptr, ld_halo, W);
#pragma unroll
            for (int k = 0; k < V; ++k) p += s2[k] * x2[k];
          }
          acc[w] += p;
        }
      }
    }
    // The halo rows r = -W .. -1: d x_r = sum_w c_w ds_{r+W-w} over the
    // outputs r + W - w >= 0 (rows of the first tile).
    if (dhalo && blockIdx.x == 0) {
      for (int i = threadIdx.x; i < W * units; i += blockDim.x) {
        const int j = (i % units) * V, r = i / units - W;
        float a1[V] = {}, a2[V] = {};
        for (int w = W; w >= 0; --w) {
          if (r + W - w < 0) continue;
          if (kDocs && r + W - w < T && doc[seq + r + W - w] > r) continue;  // r is before that row's document
          float d1[V], d2[V];
          unrotated<V>(d1, d2, dyh + j, ld_dy, seq, r + W - w, T, half, j, cos, sin);
          const float cw = c ? c[w] : 1.0f;
#pragma unroll
          for (int k = 0; k < V; ++k) a1[k] += cw * d1[k], a2[k] += cw * d2[k];
        }
        float* dh = dhalo + ((size_t)blockIdx.z * W + W + r) * ld_dhalo + col;
        store_f32<V>(dh + j, a1);
        if (cos) store_f32<V>(dh + half + j, a2);
      }
    }
    if (partial) {  // uniform across the block
      float* out = partial + ((size_t)h * nblk + blk) * (W + 1);
#pragma unroll
      for (int w = 0; w <= kMaxDcoefWindow; ++w) {
        if (w > W) break;
        const float s = block_sum(acc[w], red);
        if (threadIdx.x == 0) out[w] = s;
      }
    }
  }
}

// Row walks (ShiftRopeWalk::kRows; window W <= 1, no halo). A warp's 32
// lanes cover the units of one row for 32 / U consecutive heads (U units per
// head, a divisor of 32), and each lane walks kWalkRows consecutive rows of
// its unit, keeping the window's previous row in registers: each x, dy and
// cos/sin row is read once per walk (plus the one row before or after it),
// where the unit kernels read W + 1 rows per output row. A block's 4 warps
// walk 4 consecutive runs of rows: grid (ceil(T / kWalkBlockRows),
// ceil(H / (32 / U)), B). Per element the math is the unit kernels' in the
// same order, so y and dx are the same bits; dcoef's partials are grouped
// by block differently (one per (head, block) in the same layout, for
// shift_dcoef_reduce_kernel), so dcoef may differ in its last bits.
constexpr int kWalkRows = 8;
constexpr int kWalkBlockRows = kWalkRows * kThreads / 32;

template <int V, int W>
__global__ void __launch_bounds__(kThreads) shift_rope_forward_walk_kernel(bf16* y, int ld_out, const bf16* x,
                                                                           int ld_in, const float* coef,
                                                                           const float* cos, const float* sin, int T,
                                                                           int H, int D) {
  static_assert(W == 0 || W == 1, "the walk keeps one previous row");
  const int half = D / 2, U = (cos ? half : D) / V, heads_per_warp = 32 / U;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int h = blockIdx.y * heads_per_warp + lane / U, j = (lane % U) * V;
  const int t_begin = blockIdx.x * kWalkBlockRows + warp * kWalkRows, t_end = min(T, t_begin + kWalkRows);
  if (h >= H || t_begin >= t_end) return;  // nothing block-wide follows
  const size_t seq = (size_t)blockIdx.z * T;
  const float* c = coef ? coef + (size_t)h * (W + 1) : nullptr;
  const bf16* xh = x + h * D + j;
  bf16* yh = y + h * D + j;
  float p1[V] = {}, p2[V] = {};  // x_{t-1} (W == 1)
  if constexpr (W == 1) {
    load_raw<V>(p1, xh, ld_in, seq, t_begin - 1, T, nullptr, 0, W);
    if (cos) load_raw<V>(p2, xh + half, ld_in, seq, t_begin - 1, T, nullptr, 0, W);
  }
  for (int t = t_begin; t < t_end; ++t) {
    float x1[V], x2[V] = {}, s1[V], s2[V];
    load_bf16<V>(x1, xh + (seq + t) * ld_in);
    if (cos) load_bf16<V>(x2, xh + half + (seq + t) * ld_in);
    // shifted(): s = x without coefficients, else 0 + c_0 x_{t-W} (+ c_1 x_t), oldest first.
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (!c) {
        s1[k] = x1[k], s2[k] = x2[k];
        continue;
      }
      s1[k] = 0.0f, s2[k] = 0.0f;
      if constexpr (W == 1) s1[k] += c[0] * p1[k], s2[k] += c[0] * p2[k];
      s1[k] += c[W] * x1[k], s2[k] += c[W] * x2[k];
    }
    bf16* yr = yh + (seq + t) * ld_out;
    if (cos) {
      rotate_store<V>(yr, half, s1, s2, cos + (size_t)t * half + j, sin + (size_t)t * half + j);
    } else {
      store_bf16<V>(yr, s1);
    }
    if constexpr (W == 1) {
#pragma unroll
      for (int k = 0; k < V; ++k) p1[k] = x1[k], p2[k] = x2[k];
    }
  }
}

// The backward walk: with ds_t = RoPE_t^T dy_t (0 from T on), dx_t = 0 +
// c_W ds_t (+ c_0 ds_{t+1}) as the unit kernel sums it, and per w the products
// ds_t . x_{t-W+w} summed in registers over the walk; then per (head, w) over
// the head's lanes (shuffles), and over the 4 warps in order: partial[h][b,
// tile][w].
template <int V, int W>
__global__ void __launch_bounds__(kThreads) shift_rope_backward_walk_kernel(bf16* dx, int ld_dx, float* partial,
                                                                            const bf16* dy, int ld_dy, const bf16* x,
                                                                            int ld_x, const float* coef,
                                                                            const float* cos, const float* sin, int T,
                                                                            int H, int D) {
  static_assert(W == 0 || W == 1, "the walk keeps one further row");
  __shared__ float red[kThreads / 32][32][W + 1];
  const int half = D / 2, U = (cos ? half : D) / V, heads_per_warp = 32 / U;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, hl = lane / U;
  const int h = blockIdx.y * heads_per_warp + hl, j = (lane % U) * V;
  const int t_begin = blockIdx.x * kWalkBlockRows + warp * kWalkRows, t_end = min(T, t_begin + kWalkRows);
  const size_t seq = (size_t)blockIdx.z * T;
  float acc[W + 1] = {};
  if (h < H && t_begin < t_end) {
    const float* c = coef ? coef + (size_t)h * (W + 1) : nullptr;
    const float c_new = c ? c[W] : 1.0f, c_old = c ? c[0] : 1.0f;  // the weights of ds_t and ds_{t+1}
    const bf16* dyh = dy + h * D + j;
    const bf16* xh = x + h * D + j;
    bf16* dxh = dx + h * D + j;
    float d1[V], d2[V];  // ds_t (W == 1: carried over from the previous row)
    if constexpr (W == 1) unrotated<V>(d1, d2, dyh, ld_dy, seq, t_begin, T, half, j, cos, sin);
    float p1[V] = {}, p2[V] = {};  // x_{t-1}, for the partials (W == 1)
    if (W == 1 && partial) {
      load_raw<V>(p1, xh, ld_x, seq, t_begin - 1, T, nullptr, 0, W);
      if (cos) load_raw<V>(p2, xh + half, ld_x, seq, t_begin - 1, T, nullptr, 0, W);
    }
    for (int t = t_begin; t < t_end; ++t) {
      float n1[V] = {}, n2[V] = {};  // ds_{t+1} (W == 1)
      if constexpr (W == 1) unrotated<V>(n1, n2, dyh, ld_dy, seq, t + 1, T, half, j, cos, sin);
      else unrotated<V>(d1, d2, dyh, ld_dy, seq, t, T, half, j, cos, sin);
      float a1[V] = {}, a2[V] = {};
#pragma unroll
      for (int k = 0; k < V; ++k) {
        a1[k] += c_new * d1[k], a2[k] += c_new * d2[k];
        if constexpr (W == 1) a1[k] += c_old * n1[k], a2[k] += c_old * n2[k];
      }
      bf16* dxr = dxh + (seq + t) * ld_dx;
      store_bf16<V>(dxr, a1);
      if (cos) store_bf16<V>(dxr + half, a2);
      if (partial) {
        float x1[V], x2[V] = {};
        load_bf16<V>(x1, xh + (seq + t) * ld_x);
        if (cos) load_bf16<V>(x2, xh + half + (seq + t) * ld_x);
        auto dot = [&](const float(&r1)[V], const float(&r2)[V]) {  // ds_t . x_r, as the unit kernel sums it
          float p = 0.0f;
#pragma unroll
          for (int k = 0; k < V; ++k) p += d1[k] * r1[k];
          if (cos) {
#pragma unroll
            for (int k = 0; k < V; ++k) p += d2[k] * r2[k];
          }
          return p;
        };
        if constexpr (W == 1) acc[0] += dot(p1, p2);  // x_{t-1}
        acc[W] += dot(x1, x2);                        // x_t
        if constexpr (W == 1) {
#pragma unroll
          for (int k = 0; k < V; ++k) p1[k] = x1[k], p2[k] = x2[k];
        }
      }
      if constexpr (W == 1) {
#pragma unroll
        for (int k = 0; k < V; ++k) d1[k] = n1[k], d2[k] = n2[k];
      }
    }
  }
  if (partial) {  // uniform across the block; every lane takes part in the shuffles
    const size_t nblk = (size_t)gridDim.z * gridDim.x, blk = (size_t)blockIdx.z * gridDim.x + blockIdx.x;
#pragma unroll
    for (int w = 0; w <= W; ++w) {
      float v = acc[w];
      for (int o = 1; o < U; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);  // the head's lanes
      if (lane % U == 0) red[warp][hl][w] = v;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < heads_per_warp * (W + 1); i += blockDim.x) {
      const int hi = i / (W + 1), w = i % (W + 1), hh = blockIdx.y * heads_per_warp + hi;
      if (hh >= H) continue;
      float s = 0.0f;
      for (int q = 0; q < kThreads / 32; ++q) s += red[q][hi][w];
      partial[((size_t)hh * nblk + blk) * (W + 1) + w] = s;
    }
  }
}

// dcoef[h, w] += sum over the nblk (b, tile) partials of (h, w). Block h*(W+1)+w;
// its threads take the partials j = threadIdx.x, + blockDim.x, ... in order,
// then a block reduction (fixed order) gives the total.
__global__ void shift_dcoef_reduce_kernel(float* dcoef, const float* partial, int nblk, int W) {
  __shared__ float red[32];
  const int hw = blockIdx.x, h = hw / (W + 1), w = hw % (W + 1);
  const float* p = partial + (size_t)h * nblk * (W + 1) + w;
  float s = 0.0f;
  for (int j = threadIdx.x; j < nblk; j += blockDim.x) s += p[(size_t)j * (W + 1)];
  s = block_sum(s, red);
  if (threadIdx.x == 0) dcoef[hw] += s;
}

// dx[b, T - W + j, c] = bf16(dx + dtail[b, j, c]) for j < W, c < width: one thread per element.
__global__ void shift_halo_add_kernel(bf16* dx, int ld_dx, const float* dtail, int ld_tail, int T, int width, int W,
                                      size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t row = i / width;  // b * W + j
    const int c = (int)(i % width);
    const size_t b = row / W, j = row % W;
    bf16* p = dx + (b * T + T - W + j) * ld_dx + c;
    *p = to_bf16(__bfloat162float(*p) + dtail[row * ld_tail + c]);
  }
}

void check_shape(const char* op, const float* cos, const float* sin, int B, int H, int D, int W) {
  KVS_CHECK((cos == nullptr) == (sin == nullptr), "{}: cos and sin must both be given or both be null", op);
  KVS_CHECK(!cos || D % 2 == 0, "{}: RoPE needs an even head dim, got {}", op, D);
  KVS_CHECK(W >= 0, "{}: negative window {}", op, W);
  KVS_CHECK(B <= 65535 && H <= 65535, "{}: B = {} and H = {} must be at most 65535 (grid y/z)", op, B, H);
}

}  // namespace

// The row walks' conditions: a window of at most one previous row, and a
// unit count per head that divides a warp (heads never straddle warps).
bool walk_fits(int D, bool rope, int W, int V) {
  const int width = rope ? D / 2 : D;
  if (W > 1 || width % V != 0) return false;
  const int units = width / V;
  return units >= 1 && units <= 32 && 32 % units == 0;
}
dim3 walk_grid(int T, int H, int D, bool rope, int V, int B) {
  const int heads_per_warp = 32 / ((rope ? D / 2 : D) / V);
  return dim3(ceil_div(T, kWalkBlockRows), ceil_div(H, heads_per_warp), B);
}
// Calls f(v) with decltype(v)::value == V (8, 4 or 1): a kernel template's width.
template <class F>
void with_width(int V, F f) {
  if (V == 8) f(std::integral_constant<int, 8>{});
  else if (V == 4) f(std::integral_constant<int, 4>{});
  else f(std::integral_constant<int, 1>{});
}
// Calls f(v, w) with decltype(v)::value == V and decltype(w)::value == W (V in {8, 4, 1}, W in {0, 1}).
template <class F>
void with_walk_kernel(int V, int W, F f) {
  with_width(V, [&](auto v) {
    if (W == 1) f(v, std::integral_constant<int, 1>{});
    else f(v, std::integral_constant<int, 0>{});
  });
}

// The vector width the launchers use: `want` where `fits(V)` (V = 8 or 4), else 1.
template <class Fits>
int pick_width(ShiftRopeVector want, Fits fits) {
  const int v = want == ShiftRopeVector::k4 ? 4 : 8;
  return fits(v) ? v : 1;
}

void shift_rope_forward(bf16* y, int ld_out, const bf16* x, int ld_in, const float* coef, const float* cos,
                        const float* sin, int B, int T, int H, int D, int W, cudaStream_t stream, ShiftHalo halo,
                        ShiftRopeVector vector, ShiftRopeWalk walk, const int32_t* doc) {
  if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
  if (!coef) W = 0;
  const bf16* hx = W > 0 ? halo.rows : nullptr;
  check_shape("shift_rope_forward", cos, sin, B, H, D, W);
  const int TT = tile_rows(D);
  const dim3 grid(ceil_div(T, TT), head_groups(H), B);
  const int V = pick_width(vector, [&](int v) {
    const auto bf = [v](const void* p) { return v == 8 ? aligned16(p) : aligned8(p); };
    return D % (2 * v) == 0 && ld_in % v == 0 && ld_out % v == 0 && bf(x) && bf(y) &&
           (!cos || (aligned16(cos) && aligned16(sin))) && (!hx || (halo.ld % v == 0 && bf(hx)));
  });
  if (!coef) doc = nullptr;  // no window: nothing crosses a document
  if (walk == ShiftRopeWalk::kRows && walk_fits(D, cos != nullptr, W, V) && !hx && !doc) {
    const dim3 wgrid = walk_grid(T, H, D, cos != nullptr, V, B);
    auto launch = [&](auto kernel) {
      kernel<<<wgrid, kThreads, 0, stream>>>(y, ld_out, x, ld_in, coef, cos, sin, T, H, D);
    };
    with_walk_kernel(V, W, [&](auto v, auto w) {
      launch(shift_rope_forward_walk_kernel<decltype(v)::value, decltype(w)::value>);
    });
    KVS_CUDA_LAUNCH_CHECK("shift_rope_forward_walk_kernel", stream);
    return;
  }
  auto launch = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, stream>>>(y, ld_out, x, ld_in, coef, cos, sin, T, H, D, W, TT, hx, halo.ld, doc);
  };
  with_width(V, [&](auto v) {
    if (doc)
      launch(shift_rope_forward_kernel<decltype(v)::value, true>);
    else
      launch(shift_rope_forward_kernel<decltype(v)::value>);
  });
  KVS_CUDA_LAUNCH_CHECK("shift_rope_forward_kernel", stream);
}

size_t shift_rope_backward_scratch_floats(int B, int T, int H, int D, int W) {
  if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return 0;
  const size_t tiles = ceil_div(T, tile_rows(D));
  return (size_t)H * B * tiles * (W + 1);
}

void shift_rope_backward(bf16* dx, int ld_dx, float* dcoef, const bf16* dy, int ld_dy, const bf16* x, int ld_x,
                         const float* coef, const float* cos, const float* sin, int B, int T, int H, int D, int W,
                         float* scratch, cudaStream_t stream, ShiftHalo halo, ShiftRopeVector vector,
                         ShiftRopeWalk walk, const int32_t* doc) {
  if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
  if (!coef) W = 0, doc = nullptr;
  const bf16* hx = W > 0 ? halo.rows : nullptr;
  float* dh = W > 0 ? halo.grad : nullptr;
  KVS_CHECK(!dh || T >= W, "shift_rope_backward: a halo gradient needs T >= W, got T = {}, W = {}", T, W);
  check_shape("shift_rope_backward", cos, sin, B, H, D, W);
  float* partial = coef && dcoef ? scratch : nullptr;
  if (coef && dcoef) {
    KVS_CHECK(scratch, "shift_rope_backward: dcoef needs scratch of shift_rope_backward_scratch_floats() floats");
    KVS_CHECK(W <= kMaxDcoefWindow, "shift_rope_backward: dcoef supports windows up to {}, got {}",
              kMaxDcoefWindow, W);
  }
  const int TT = tile_rows(D);
  const dim3 grid(ceil_div(T, TT), head_groups(H), B);
  const int V = pick_width(vector, [&](int v) {
    const auto bf = [v](const void* p) { return v == 8 ? aligned16(p) : aligned8(p); };
    return D % (2 * v) == 0 && ld_dx % v == 0 && ld_dy % v == 0 && bf(dx) && bf(dy) &&
           (!partial || (ld_x % v == 0 && bf(x))) && (!cos || (aligned16(cos) && aligned16(sin))) &&
           (!partial || !hx || (halo.ld % v == 0 && bf(hx))) && (!dh || (halo.ld_grad % v == 0 && aligned16(dh)));
  });
  int nblk = (int)(grid.x * grid.z);  // the dcoef partials' blocks
  if (walk == ShiftRopeWalk::kRows && walk_fits(D, cos != nullptr, W, V) && !hx && !dh && !doc) {
    const dim3 wgrid = walk_grid(T, H, D, cos != nullptr, V, B);
    nblk = (int)(wgrid.x * wgrid.z);  // at most grid's: kWalkBlockRows >= tile_rows(D)
    auto launch = [&](auto kernel) {
      kernel<<<wgrid, kThreads, 0, stream>>>(dx, ld_dx, partial, dy, ld_dy, x, ld_x, coef, cos, sin, T, H, D);
    };
    with_walk_kernel(V, W, [&](auto v, auto w) {
      launch(shift_rope_backward_walk_kernel<decltype(v)::value, decltype(w)::value>);
    });
    KVS_CUDA_LAUNCH_CHECK("shift_rope_backward_walk_kernel", stream);
  } else {
    auto launch = [&](auto kernel) {
      kernel<<<grid, kThreads, 0, stream>>>(dx, ld_dx, partial, dy, ld_dy, x, ld_x, coef, cos, sin, T, H, D, W, TT,
                                            hx, halo.ld, dh, halo.ld_grad, doc);
    };
    with_width(V, [&](auto v) {
      if (doc)
        launch(shift_rope_backward_kernel<decltype(v)::value, true>);
      else
        launch(shift_rope_backward_kernel<decltype(v)::value>);
    });
    KVS_CUDA_LAUNCH_CHECK("shift_rope_backward_kernel", stream);
  }
  if (partial) {
    shift_dcoef_reduce_kernel<<<H * (W + 1), 256, 0, stream>>>(dcoef, partial, nblk, W);
    KVS_CUDA_LAUNCH_CHECK("shift_dcoef_reduce_kernel", stream);
  }
}

void shift_halo_add(bf16* dx, int ld_dx, const float* dtail, int ld_tail, int B, int T, int width, int W,
                    cudaStream_t stream) {
  if (B <= 0 || width <= 0 || W <= 0) return;
  KVS_CHECK(T >= W, "shift_halo_add: T = {} rows are fewer than W = {}", T, W);
  const size_t n = (size_t)B * W * width;
  const unsigned blocks = (unsigned)std::min<size_t>((n + 255) / 256, 1u << 16);
  shift_halo_add_kernel<<<blocks, 256, 0, stream>>>(dx, ld_dx, dtail, ld_tail, T, width, W, n);
  KVS_CUDA_LAUNCH_CHECK("shift_halo_add_kernel", stream);
}

}  // namespace kvs::cuda
