#include "parallel/context_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "dist/comm.h"
#include "kernels/cpu/attention.h"

namespace kvs {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}

CpLayout::CpLayout(const ContextParallel& c, int B_, int T_)
    : cp(c.size), rank(c.rank), B(B_), T(T_), Tc(T_ / (2 * c.size)) {
  KVS_CHECK(T_ % (2 * c.size) == 0, "context parallelism: a sequence of {} positions does not split into 2 x {} chunks",
            T_, c.size);
}

void check_cp_chunks_hold_the_window(const CpLayout& l, const ModelConfig& m) {
  const int W = m.kv_shift.enabled ? m.kv_shift.window : 0;
  KVS_CHECK(l.Tc >= W,
            "context parallelism: a sequence of {} positions makes chunks of {} (2 x cp {}), shorter than the KV shift "
            "window {}: use sequences of at least {} positions",
            l.T, l.Tc, l.cp, W, 2 * l.cp * W);
}

ContextParallelAttention::ContextParallelAttention(const ContextParallel& cp, const LocalDims& d, int window, int max_B,
                                                   int T)
    : cp_(cp), Hq_(d.Hq), Hkv_(d.Hkv), D_(d.D), W_(window) {
  KVS_CHECK(cp.size > 1 && cp.comm && cp.comm->size() == cp.size && cp.comm->rank() == cp.rank,
            "context parallelism: rank {} of {} needs a communicator of that size and rank", cp.rank, cp.size);
  const CpLayout l(cp, max_B, T);
  KVS_CHECK(l.Tc >= W_, "context parallelism: chunks of {} positions are shorter than the shift window {}", l.Tc, W_);
  const size_t QD = static_cast<size_t>(Hq_) * D_, KD = static_cast<size_t>(Hkv_) * D_;
  const size_t halo_rows = 2 * static_cast<size_t>(max_B) * W_;
  for (int i = 0; i < 3; ++i) {
    halo_[i].resize(halo_rows * (i == 0 ? QD : KD));
    dhalo_[i].resize(halo_[i].size());
  }
  tails_.resize(halo_rows * QD);
  gathered_.resize(cp.size * halo_rows * QD);
  ring_.resize(4 * block_floats(l));
  ring_next_.resize(ring_.size());
  const size_t lse = 2 * static_cast<size_t>(max_B) * Hq_ * l.Tc;
  part_out_.resize(static_cast<size_t>(max_B) * l.Tc * QD);
  acc_lse_.resize(lse);
  pair_lse_.resize(2 * cp.size * lse);
  delta_.resize(lse);
}

size_t ContextParallelAttention::att_floats(int cp, int B, int Hq, int T) {
  const size_t Tc = T / (2 * cp);
  return static_cast<size_t>(cp) * 4 * B * Hq * Tc * Tc;
}

void ContextParallelAttention::pass_on(std::vector<float>& cur, std::vector<float>& next, size_t n) {
  const int r = cp_.rank, P = cp_.size;
  cp_.comm->send_recv(cur.data(), (r + 1) % P, next.data(), (r + P - 1) % P, n, dist::DType::F32);
  std::swap(cur, next);
}

// ---------------------------------------------------------------- the shift's halo

const float* ContextParallelAttention::halo(int slot, const float* x, size_t width, const CpLayout& l) {
  const int B = l.B, Tc = l.Tc, W = W_;
  const size_t n = 2 * static_cast<size_t>(B) * W * width;  // one rank's tails
  for (int h = 0; h < 2; ++h)
    for (int b = 0; b < B; ++b)
      std::memcpy(tails_.data() + (static_cast<size_t>(h) * B + b) * W * width,
                  x + ((static_cast<size_t>(h) * B + b) * Tc + Tc - W) * width, W * width * sizeof(float));
  cp_.comm->all_gather(tails_.data(), gathered_.data(), n, dist::DType::F32);
  float* out = halo_[slot].data();
  const int P = l.cp;
  for (int h = 0; h < 2; ++h) {
    const int prev = l.chunk(h) - 1;  // the chunk before this half's
    for (int b = 0; b < B; ++b) {
      float* dst = out + (static_cast<size_t>(h) * B + b) * W * width;
      if (prev < 0) {
        std::fill(dst, dst + W * width, 0.0f);  // the zeros before position 0
        continue;
      }
      const int owner = prev < P ? prev : 2 * P - 1 - prev, owner_half = prev < P ? 0 : 1;
      std::memcpy(dst, gathered_.data() + owner * n + (static_cast<size_t>(owner_half) * B + b) * W * width,
                  W * width * sizeof(float));
    }
  }
  return out;
}

float* ContextParallelAttention::halo_grad(int slot, size_t width, const CpLayout& l) {
  float* g = dhalo_[slot].data();
  std::fill(g, g + 2 * static_cast<size_t>(l.B) * W_ * width, 0.0f);
  return g;
}

void ContextParallelAttention::halo_backward(const float* dhalo, float* dx, size_t width, const CpLayout& l) {
  const int B = l.B, Tc = l.Tc, W = W_, P = l.cp;
  const size_t n = 2 * static_cast<size_t>(B) * W * width;
  cp_.comm->all_gather(dhalo, gathered_.data(), n, dist::DType::F32);
  // Every rank's halves whose previous chunk is one of this rank's.
  for (int q = 0; q < P; ++q)
    for (int h = 0; h < 2; ++h) {
      const int prev = (h == 0 ? q : 2 * P - 1 - q) - 1;
      const int mine = prev == l.chunk(0) ? 0 : (prev == l.chunk(1) ? 1 : -1);
      if (prev < 0 || mine < 0) continue;
      for (int b = 0; b < B; ++b) {
        const float* src = gathered_.data() + q * n + (static_cast<size_t>(h) * B + b) * W * width;
        float* dst = dx + ((static_cast<size_t>(mine) * B + b) * Tc + Tc - W) * width;
        for (size_t i = 0; i < W * width; ++i) dst[i] += src[i];
      }
    }
}

// ---------------------------------------------------------------- ring attention

void ContextParallelAttention::forward(float* out, float* att, const float* q, const float* k, const float* v,
                                       const int32_t* doc_start, const CpLayout& l) {
  const int B = l.B, Tc = l.Tc, P = l.cp, Hq = Hq_, Hkv = Hkv_, D = D_;
  const size_t QD = static_cast<size_t>(Hq) * D, KD = static_cast<size_t>(Hkv) * D;
  const size_t half_rows = static_cast<size_t>(B) * Tc, blk = block_floats(l), pa = pair_att(l);
  const size_t half_lse = static_cast<size_t>(B) * Hq * Tc;
  std::memcpy(ring_.data(), k, blk * sizeof(float));
  std::memcpy(ring_.data() + blk, v, blk * sizeof(float));
  std::fill(out, out + 2 * half_rows * QD, 0.0f);
  std::fill(acc_lse_.begin(), acc_lse_.begin() + 2 * half_lse, kNegInf);
  for (int s = 0; s < P; ++s) {
    const int origin = (l.rank - s + P) % P;
    for (int hq = 0; hq < 2; ++hq)
      for (int hk = 0; hk < 2; ++hk) {
        const int qc = l.chunk(hq), kc = key_chunk(origin, hk);
        float* A = att + ((static_cast<size_t>(s) * 2 + hq) * 2 + hk) * pa;
        float* lse = pair_lse_.data() + ((static_cast<size_t>(s) * 2 + hq) * 2 + hk) * half_lse;
        if (kc > qc) {  // every key after every query: nothing to see
          std::fill(A, A + pa, 0.0f);
          continue;
        }
        cpu::attention_forward(part_out_.data(), A, lse, q + hq * half_rows * QD, ring_.data() + hk * half_rows * KD,
                               ring_.data() + blk + hk * half_rows * KD, B, Tc, Tc, Hq, Hkv, D, qc * Tc, kc * Tc,
                               doc_start ? doc_start + hq * half_rows : nullptr);
        // Merge by log-sum-exp: out = sum_j exp(lse_j - lse) out_j, lse = log sum_j exp(lse_j).
        float* o = out + hq * half_rows * QD;
        float* acc = acc_lse_.data() + hq * half_lse;
#pragma omp parallel for collapse(2) schedule(static)
        for (int b = 0; b < B; ++b)
          for (int h = 0; h < Hq; ++h)
            for (int t = 0; t < Tc; ++t) {
              const size_t r = (static_cast<size_t>(b) * Hq + h) * Tc + t;
              const float pl = lse[r], al = acc[r];
              if (pl == kNegInf) continue;  // no visible key in this block
              float* orow = o + (static_cast<size_t>(b) * Tc + t) * QD + static_cast<size_t>(h) * D;
              const float* prow = part_out_.data() + (static_cast<size_t>(b) * Tc + t) * QD + static_cast<size_t>(h) * D;
              if (al == kNegInf) {
                std::copy(prow, prow + D, orow);
                acc[r] = pl;
                continue;
              }
              const float m = std::max(al, pl);
              const float merged = m + std::log(std::exp(al - m) + std::exp(pl - m));
              const float wa = std::exp(al - merged), wp = std::exp(pl - merged);
              for (int d = 0; d < D; ++d) orow[d] = wa * orow[d] + wp * prow[d];
              acc[r] = merged;
            }
      }
    if (s + 1 < P) pass_on(ring_, ring_next_, 2 * blk);
  }
  // Each block's probabilities scaled from its own softmax to the whole row's.
  for (int s = 0; s < P; ++s)
    for (int hq = 0; hq < 2; ++hq)
      for (int hk = 0; hk < 2; ++hk) {
        const int origin = (l.rank - s + P) % P;
        if (key_chunk(origin, hk) > l.chunk(hq)) continue;
        float* A = att + ((static_cast<size_t>(s) * 2 + hq) * 2 + hk) * pa;
        const float* lse = pair_lse_.data() + ((static_cast<size_t>(s) * 2 + hq) * 2 + hk) * half_lse;
        const float* acc = acc_lse_.data() + hq * half_lse;
#pragma omp parallel for schedule(static)
        for (size_t r = 0; r < half_lse; ++r) {
          const float f = lse[r] == kNegInf ? 0.0f : std::exp(lse[r] - acc[r]);
          float* row = A + r * Tc;
          for (int c = 0; c < Tc; ++c) row[c] *= f;
        }
      }
}

void ContextParallelAttention::backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                        const float* q, const float* k, const float* v, const float* att,
                                        const CpLayout& l) {
  const int B = l.B, Tc = l.Tc, P = l.cp, Hq = Hq_, Hkv = Hkv_, D = D_;
  const size_t QD = static_cast<size_t>(Hq) * D, KD = static_cast<size_t>(Hkv) * D;
  const size_t half_rows = static_cast<size_t>(B) * Tc, blk = block_floats(l), pa = pair_att(l);
  const size_t half_lse = static_cast<size_t>(B) * Hq * Tc;
  // The whole row's sum_s P dP = dO . O, which no single block can form.
  for (int hq = 0; hq < 2; ++hq)
    cpu::attention_row_delta(delta_.data() + hq * half_lse, dout + hq * half_rows * QD, out + hq * half_rows * QD, B,
                             Tc, Hq, D);
  float* ring = ring_.data();
  std::memcpy(ring, k, blk * sizeof(float));
  std::memcpy(ring + blk, v, blk * sizeof(float));
  std::fill(ring + 2 * blk, ring + 4 * blk, 0.0f);
  for (int s = 0; s < P; ++s) {
    const int origin = (l.rank - s + P) % P;
    ring = ring_.data();
    for (int hq = 0; hq < 2; ++hq)
      for (int hk = 0; hk < 2; ++hk) {
        const int qc = l.chunk(hq), kc = key_chunk(origin, hk);
        if (kc > qc) continue;
        const float* A = att + ((static_cast<size_t>(s) * 2 + hq) * 2 + hk) * pa;
        const size_t ko = hk * half_rows * KD;
        cpu::attention_backward(dq + hq * half_rows * QD, ring + 2 * blk + ko, ring + 3 * blk + ko,
                                dout + hq * half_rows * QD, q + hq * half_rows * QD, ring + ko, ring + blk + ko, A, B,
                                Tc, Tc, Hq, Hkv, D, qc * Tc, kc * Tc, delta_.data() + hq * half_lse);
      }
    pass_on(ring_, ring_next_, 4 * blk);  // after P steps every block is home with all its dK̂, dV̂
  }
  ring = ring_.data();
  for (size_t i = 0; i < blk; ++i) dk[i] += ring[2 * blk + i];
  for (size_t i = 0; i < blk; ++i) dv[i] += ring[3 * blk + i];
}

}  // namespace kvs
