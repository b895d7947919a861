// Fused KV shift + RoPE and its adjoint.
//
// Both directions tile the (sequence, position) axis: block (tile, h, b)
// handles positions t0 .. t0 + TT - 1 of head h in sequence b. It first stages
// the fp32 rows it needs in shared memory with coalesced (16-byte where the
// layout allows) loads, each raw element read from global memory once per
// tile: the TT own rows plus a W-row halo (before the tile for x, after it for
// the gradient), with zeros outside [0, T) of sequence b (zero history before
// t = 0; nothing ever leaks between sequences, whose rows are never staged
// together). Then it computes from shared memory and writes its TT rows.
// TT * D is about 2048 floats, so a block stages ~8 KiB (+ halo) per array.
//
// Work split inside a block: V = 8 consecutive columns per thread (16-byte
// global accesses, float4 shared accesses) when D % 16 == 0, every row stride
// is a multiple of 8 elements and every pointer is 16-byte aligned; V = 1
// otherwise. RoPE pairs column i with i + D/2, so with rotation a thread owns
// V columns of the first half and the matching V of the second half.
//
// Context parallelism: a sequence may be one chunk of a longer one. The W raw
// rows before its position 0 then come from `halo` ([B][W] rows, row stride
// ld_halo, oldest first) instead of zeros, and the backward writes their
// gradient into `dhalo` (fp32 [B][W] rows, row stride ld_dhalo, overwritten)
// from the tile at t0 = 0, whose staged ds rows 0 .. TT + W - 1 cover every
// output a halo row reaches (rows 0 .. W - 1). shift_halo_add returns such a
// gradient to the rows it came from (the chunk's last W rows).
//
// Aliasing: the halo rows of one tile are another tile's own rows, so y must
// not alias x (nor dx alias dy) unless W == 0 (then a block only reads the rows
// it writes, all read before the __syncthreads that precedes the writes).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vec.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kTileFloats = 2048;  // TT * D target per staged array
constexpr int kMaxDcoefWindow = 8;  // dcoef partials live in registers: at most 9 per thread


int tile_rows(int D) { return std::clamp(kTileFloats / D, 1, 32); }


// Stages dst[r][0..D) = src row of position t_first + r of the sequence whose
// first row is `seq` (row stride ld), for r < rows, as fp32; 0 outside [0, T),
// except positions -W .. -1 from halo (rows (b W + W + t) of stride ld_halo) when given.
template <int V>
__device__ void stage_rows(float* dst, const bf16* src, int ld, size_t seq, int t_first, int rows, int T, int D,
                           const bf16* halo = nullptr, int ld_halo = 0, int W = 0) {
  const int cpr = D / V;  // chunks per row
  for (int i = threadIdx.x; i < rows * cpr; i += blockDim.x) {
    const int r = i / cpr, d = (i % cpr) * V, t = t_first + r;
    float v[V];
    if (t >= 0 && t < T) {
      load_bf16<V>(v, src + (seq + t) * ld + d);
    } else if (halo && t < 0 && t >= -W) {
      load_bf16<V>(v, halo + ((size_t)blockIdx.z * W + W + t) * ld_halo + d);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = 0.0f;
    }
    store_f32<V>(dst + r * D + d, v);
  }
}

// As stage_rows, but stages RoPE_t^T of each row (the un-rotated gradient):
// ds1 = g1 cos + g2 sin, ds2 = g2 cos - g1 sin. Plain stage_rows without cos.
template <int V>
__device__ void stage_unrotated(float* dst, const bf16* src, int ld, size_t seq, int t_first, int rows, int T, int D,
                                const float* cos, const float* sin) {
  if (!cos) {
    stage_rows<V>(dst, src, ld, seq, t_first, rows, T, D);
    return;
  }
  const int half = D / 2, cpr = half / V;
  for (int i = threadIdx.x; i < rows * cpr; i += blockDim.x) {
    const int r = i / cpr, j = (i % cpr) * V, t = t_first + r;
    float d1[V], d2[V];
    if (t >= 0 && t < T) {
      float g1[V], g2[V], cs[V], sn[V];
      const bf16* row = src + (seq + t) * ld;
      load_bf16<V>(g1, row + j);
      load_bf16<V>(g2, row + half + j);
      load_f32<V>(cs, cos + (size_t)t * half + j);
      load_f32<V>(sn, sin + (size_t)t * half + j);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        d1[k] = g1[k] * cs[k] + g2[k] * sn[k];
        d2[k] = g2[k] * cs[k] - g1[k] * sn[k];
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) d1[k] = d2[k] = 0.0f;
    }
    store_f32<V>(dst + r * D + j, d1);
    store_f32<V>(dst + r * D + half + j, d2);
  }
}

// s[0..V) = sum_{w=0..W} c[w] xs[tl + w][d..d+V), oldest first from 0 (the
// CPU's order); xs row tl + w holds position t0 + tl - W + w. c null: W = 0, s = xs[tl].
template <int V>
__device__ __forceinline__ void shift_at(float (&s)[V], const float* xs, int tl, int d, int D, int W,
                                         const float* c) {
  if (!c) {
    load_f32<V>(s, xs + tl * D + d);
    return;
  }
#pragma unroll
  for (int k = 0; k < V; ++k) s[k] = 0.0f;
  for (int w = 0; w <= W; ++w) {
    float v[V];
    load_f32<V>(v, xs + (tl + w) * D + d);
    const float cw = c[w];
#pragma unroll
    for (int k = 0; k < V; ++k) s[k] += cw * v[k];
  }
}

// Forward: stage x rows t0 - W .. t0 + TT - 1 (the W-row halo before the
// tile), then each thread forms the shifted s for its columns of a row and
// rotates it in fp32 (RoPE pairs i, i + D/2 with cos/sin of position t), and
// writes y once in bf16.
template <int V>
__global__ void shift_rope_forward_kernel(bf16* y, int ld_out, const bf16* x, int ld_in, const float* coef,
                                          const float* cos, const float* sin, int T, int D, int W, int TT,
                                          const bf16* halo, int ld_halo) {
  extern __shared__ __align__(16) float xs[];  // [TT + W][D]: row r = position t0 - W + r
  const int t0 = blockIdx.x * TT, h = blockIdx.y;
  const size_t seq = (size_t)blockIdx.z * T;  // first row of sequence b
  const int col = h * D;
  stage_rows<V>(xs, x + col, ld_in, seq, t0 - W, TT + W, T, D, halo ? halo + col : nullptr, ld_halo, W);
  __syncthreads();
  const int nt = min(TT, T - t0);
  const float* c = coef ? coef + (size_t)h * (W + 1) : nullptr;
  if (cos) {
    const int half = D / 2, cpr = half / V;
    for (int i = threadIdx.x; i < nt * cpr; i += blockDim.x) {
      const int tl = i / cpr, j = (i % cpr) * V, t = t0 + tl;
      float s1[V], s2[V], cs[V], sn[V], y1[V], y2[V];
      shift_at<V>(s1, xs, tl, j, D, W, c);
      shift_at<V>(s2, xs, tl, half + j, D, W, c);
      load_f32<V>(cs, cos + (size_t)t * half + j);
      load_f32<V>(sn, sin + (size_t)t * half + j);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        y1[k] = s1[k] * cs[k] - s2[k] * sn[k];
        y2[k] = s2[k] * cs[k] + s1[k] * sn[k];
      }
      bf16* yr = y + (seq + t) * ld_out + col;
      store_bf16<V>(yr + j, y1);
      store_bf16<V>(yr + half + j, y2);
    }
  } else {
    const int cpr = D / V;
    for (int i = threadIdx.x; i < nt * cpr; i += blockDim.x) {
      const int tl = i / cpr, d = (i % cpr) * V;
      float s[V];
      shift_at<V>(s, xs, tl, d, D, W, c);
      store_bf16<V>(y + (seq + t0 + tl) * ld_out + col + d, s);
    }
  }
}

// Backward: stage ds = RoPE^T dy for rows t0 .. t0 + TT - 1 + W (the halo
// after the tile: dx_s needs ds_s .. ds_{s+W}; 0 from T on) and, when dcoef
// is wanted, x for rows t0 - W .. t0 + TT - 1 as in the forward. Then
//   dx_s = sum_{w=W..0} c_w ds_{s+W-w}    (bf16, overwritten)
// and, per w, the tile's partial sum_{t in tile, d} ds_t x_{t-W+w}: each
// thread accumulates its elements in fp32 registers (one per w), a block
// reduction per w gives the tile's value, stored in partial[h][b, tile][w].
// shift_dcoef_reduce_kernel sums the (b, tile) partials in a fixed order.
template <int V>
__global__ void shift_rope_backward_kernel(bf16* dx, int ld_dx, float* partial, const bf16* dy, int ld_dy,
                                           const bf16* x, int ld_x, const float* coef, const float* cos,
                                           const float* sin, int T, int D, int W, int TT, const bf16* halo,
                                           int ld_halo, float* dhalo, int ld_dhalo) {
  extern __shared__ __align__(16) float smem[];
  const int rows = TT + W;
  float* gs = smem;             // [rows][D]: row r = ds at position t0 + r
  float* xs = smem + rows * D;  // [rows][D]: row r = x at position t0 - W + r (only with partial)
  const int t0 = blockIdx.x * TT, h = blockIdx.y;
  const size_t seq = (size_t)blockIdx.z * T;
  const int col = h * D;
  stage_unrotated<V>(gs, dy + col, ld_dy, seq, t0, rows, T, D, cos, sin);
  if (partial) stage_rows<V>(xs, x + col, ld_x, seq, t0 - W, rows, T, D, halo ? halo + col : nullptr, ld_halo, W);
  __syncthreads();

  const int nt = min(TT, T - t0);
  const float* c = coef ? coef + (size_t)h * (W + 1) : nullptr;
  const int cpr = D / V;
  for (int i = threadIdx.x; i < nt * cpr; i += blockDim.x) {
    const int tl = i / cpr, d = (i % cpr) * V;
    float acc[V] = {};
    for (int w = W; w >= 0; --w) {  // position tl + W - w of the tile, increasing
      float g[V];
      load_f32<V>(g, gs + (tl + W - w) * D + d);
      const float cw = c ? c[w] : 1.0f;
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += cw * g[k];
    }
    store_bf16<V>(dx + (seq + t0 + tl) * ld_dx + col + d, acc);
  }
  // The halo rows j = -W .. -1: d x_j = sum_w c_w ds_{j+W-w} over the outputs
  // j + W - w >= 0 (gs rows; row r is position r in the first tile).
  if (dhalo && blockIdx.x == 0) {
    for (int i = threadIdx.x; i < W * cpr; i += blockDim.x) {
      const int j = i / cpr - W, d = (i % cpr) * V;
      float acc[V] = {};
      for (int w = W; w >= 0; --w) {
        const int r = j + W - w;
        if (r < 0) continue;
        float g[V];
        load_f32<V>(g, gs + r * D + d);
        const float cw = c ? c[w] : 1.0f;
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += cw * g[k];
      }
      store_f32<V>(dhalo + ((size_t)blockIdx.z * W + W + j) * ld_dhalo + col + d, acc);
    }
  }
  if (!partial) return;  // uniform across the block

  // Rows tl >= nt of gs are zero, so the whole TT x D tile can be summed.
  float acc[kMaxDcoefWindow + 1] = {};
  for (int e = threadIdx.x; e < TT * D; e += blockDim.x) {
    const float g = gs[e];  // ds at (tl, d) = (e / D, e % D); x_{t-W+w} is xs row tl + w
#pragma unroll
    for (int w = 0; w <= kMaxDcoefWindow; ++w)
      if (w <= W) acc[w] += g * xs[e + w * D];
  }
  __shared__ float red[32];
  const size_t nblk = (size_t)gridDim.z * gridDim.x, blk = (size_t)blockIdx.z * gridDim.x + blockIdx.x;
  float* out = partial + ((size_t)h * nblk + blk) * (W + 1);
#pragma unroll
  for (int w = 0; w <= kMaxDcoefWindow; ++w) {
    if (w > W) break;
    const float s = block_sum(acc[w], red);
    if (threadIdx.x == 0) out[w] = s;
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

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    KVS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

void check_shape(const char* op, const float* cos, const float* sin, int B, int H, int D, int W) {
  KVS_CHECK((cos == nullptr) == (sin == nullptr), "{}: cos and sin must both be given or both be null", op);
  KVS_CHECK(!cos || D % 2 == 0, "{}: RoPE needs an even head dim, got {}", op, D);
  KVS_CHECK(W >= 0, "{}: negative window {}", op, W);
  KVS_CHECK(B <= 65535 && H <= 65535, "{}: B = {} and H = {} must be at most 65535 (grid y/z)", op, B, H);
}

}  // namespace

void shift_rope_forward(bf16* y, int ld_out, const bf16* x, int ld_in, const float* coef, const float* cos,
                        const float* sin, int B, int T, int H, int D, int W, cudaStream_t stream, ShiftHalo halo) {
  if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
  if (!coef) W = 0;
  const bf16* hx = W > 0 ? halo.rows : nullptr;
  check_shape("shift_rope_forward", cos, sin, B, H, D, W);
  const int TT = tile_rows(D);
  const dim3 grid(ceil_div(T, TT), H, B);
  const size_t smem = (size_t)(TT + W) * D * sizeof(float);
  const bool vec = D % 16 == 0 && ld_in % 8 == 0 && ld_out % 8 == 0 && aligned16(x) && aligned16(y) &&
                   (!cos || (aligned16(cos) && aligned16(sin))) && (!hx || (halo.ld % 8 == 0 && aligned16(hx)));
  auto launch = [&](auto kernel) {
    allow_smem(kernel, smem);
    kernel<<<grid, kThreads, smem, stream>>>(y, ld_out, x, ld_in, coef, cos, sin, T, D, W, TT, hx, halo.ld);
  };
  if (vec) {
    launch(shift_rope_forward_kernel<8>);
  } else {
    launch(shift_rope_forward_kernel<1>);
  }
  KVS_CUDA_LAUNCH_CHECK("shift_rope_forward_kernel", stream);
}

size_t shift_rope_backward_scratch_floats(int B, int T, int H, int D, int W) {
  if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return 0;
  const size_t tiles = ceil_div(T, tile_rows(D));
  return (size_t)H * B * tiles * (W + 1);
}

void shift_rope_backward(bf16* dx, int ld_dx, float* dcoef, const bf16* dy, int ld_dy, const bf16* x, int ld_x,
                         const float* coef, const float* cos, const float* sin, int B, int T, int H, int D, int W,
                         float* scratch, cudaStream_t stream, ShiftHalo halo) {
  if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
  if (!coef) W = 0;
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
  const dim3 grid(ceil_div(T, TT), H, B);
  const size_t smem = (size_t)(partial ? 2 : 1) * (TT + W) * D * sizeof(float);
  const bool vec = D % 16 == 0 && ld_dx % 8 == 0 && ld_dy % 8 == 0 && aligned16(dx) && aligned16(dy) &&
                   (!partial || (ld_x % 8 == 0 && aligned16(x))) && (!cos || (aligned16(cos) && aligned16(sin))) &&
                   (!partial || !hx || (halo.ld % 8 == 0 && aligned16(hx))) &&
                   (!dh || (halo.ld_grad % 8 == 0 && aligned16(dh)));
  auto launch = [&](auto kernel) {
    allow_smem(kernel, smem);
    kernel<<<grid, kThreads, smem, stream>>>(dx, ld_dx, partial, dy, ld_dy, x, ld_x, coef, cos, sin, T, D, W, TT, hx,
                                             halo.ld, dh, halo.ld_grad);
  };
  if (vec) {
    launch(shift_rope_backward_kernel<8>);
  } else {
    launch(shift_rope_backward_kernel<1>);
  }
  KVS_CUDA_LAUNCH_CHECK("shift_rope_backward_kernel", stream);
  if (partial) {
    const int nblk = (int)(grid.x * grid.z);
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
