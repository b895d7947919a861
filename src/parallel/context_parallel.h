// Context parallelism (docs/PARALLEL.md): every sequence of a micro-batch is
// split over the cp ranks of a context-parallel group, so no rank holds the
// activations of a whole long sequence.
//
// Load balance (Megatron-LM, torchtitan): a sequence of T positions is cut
// into 2*cp chunks of Tc = T / (2 cp) positions and rank r holds chunks r and
// 2cp-1-r, so every rank has the same share of the causal attention's work.
// A rank's rows are laid out chunk-major, [2 halves][B][Tc]: half 0 is chunk
// r of every sequence, half 1 chunk 2cp-1-r. Every per-row op (embedding,
// norms, projections, MLP, loss) runs on them unchanged; the three ops that
// look along the sequence need the other ranks:
//   - the KV shift: position t mixes the raw k, v (and q) of t-1..t-W, so each
//     chunk needs the last W raw rows of the chunk before it (the halo), and
//     the gradient of those rows goes back to their owner; position 0 of the
//     whole sequence still sees zeros;
//   - RoPE: each half at its chunk's positions;
//   - attention: ring attention. The K̂/V̂ blocks travel around the ring (rank
//     r sends to r+1, receives from r-1) while each rank attends its queries
//     to the block it holds; the partial outputs are merged by their
//     log-sum-exp. In the backward the blocks travel again with their dK̂/dV̂
//     accumulators, which arrive back at their owner after a full turn.
// The CPU engine's form (fp32 host buffers, kernels/cpu); at cp = 1 nothing
// here is used.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "parallel/tensor_parallel.h"

namespace kvs {

namespace dist {
class Communicator;
}

// This process's place in its context-parallel group.
struct ContextParallel {
  int rank = 0;
  int size = 1;
  dist::Communicator* comm = nullptr;
};

// Which rows of a [B, T] micro-batch a rank holds.
struct CpLayout {
  int cp = 1, rank = 0;
  int B = 0, T = 0, Tc = 0;  // Tc = T / (2 cp)
  CpLayout() = default;
  CpLayout(const ContextParallel& c, int B, int T);
  int chunk(int half) const { return half == 0 ? rank : 2 * cp - 1 - rank; }
  int pos0(int half) const { return chunk(half) * Tc; }
  size_t rows() const { return 2 * static_cast<size_t>(B) * Tc; }
  // The row of the full batch that local row (half, b, t) is.
  size_t full_row(int half, int b, int t) const { return static_cast<size_t>(b) * T + pos0(half) + t; }
  // local[(half, b, t)] = full[full_row(half, b, t)], `width` values per row.
  template <class X>
  void take(const X* full, X* local, size_t width) const {
    for (int h = 0; h < 2; ++h)
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tc; ++t) {
          const size_t l = (static_cast<size_t>(h) * B + b) * Tc + t;
          for (size_t i = 0; i < width; ++i) local[l * width + i] = full[full_row(h, b, t) * width + i];
        }
  }
};

// A batch's chunks must hold the KV shift window (each chunk but the first
// reads the previous chunk's last `window` raw rows): a sequence shorter than
// 2 x cp x window (an eval or a CLI forward below seq_len) is a one-line error
// instead of a halo read from before the chunk.
void check_cp_chunks_hold_the_window(const CpLayout& l, const ModelConfig& m);


class ContextParallelAttention {
 public:
  // d: this rank's (TP-local) sizes; window: the shift's W; max_B x T: the largest micro-batch.
  ContextParallelAttention(const ContextParallel& cp, const LocalDims& d, int window, int max_B, int T);
  const ContextParallel& group() const { return cp_; }

  // The halo of raw rows x [2][B][Tc][width] (width = H*D): for each half, the
  // last W rows of the chunk before it, [2][B][W][width] (zeros before
  // position 0). slot 0, 1, 2 keep q, k, v apart (valid until that slot's next call).
  const float* halo(int slot, const float* x, size_t width, const CpLayout& l);
  // A zeroed [2][B][W][width] buffer for the halo's gradient (slots as above).
  float* halo_grad(int slot, size_t width, const CpLayout& l);
  // The backward: dhalo [2][B][W][width] of every rank goes back to the rows
  // it came from; this rank's share is added into dx [2][B][Tc][width].
  void halo_backward(const float* dhalo, float* dx, size_t width, const CpLayout& l);

  // Ring attention of this rank's queries q [2][B][Tc][Hq*D] against every
  // rank's k̂, v̂ ([2][B][Tc][Hkv*D] here): out like q; att holds, per ring
  // step s and (query half, key half), the probabilities of that block
  // [cp][2][2][B][Hq][Tc][Tc], already scaled to the whole row's softmax
  // (zeros for blocks entirely after the queries). doc_start: [2][B][Tc]
  // absolute document starts (null: none).
  void forward(float* out, float* att, const float* q, const float* k, const float* v, const int32_t* doc_start,
               const CpLayout& l);
  // dq, dk, dv += the gradients.
  void backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* q, const float* k,
                const float* v, const float* att, const CpLayout& l);

  // Floats of att per layer for a micro-batch of B sequences of T positions.
  static size_t att_floats(int cp, int B, int Hq, int T);

 private:
  size_t block_floats(const CpLayout& l) const { return 2 * static_cast<size_t>(l.B) * l.Tc * Hkv_ * D_; }
  size_t pair_att(const CpLayout& l) const { return static_cast<size_t>(l.B) * Hq_ * l.Tc * l.Tc; }
  // The key half hk of the block that started at rank `origin` is chunk ...
  int key_chunk(int origin, int hk) const { return hk == 0 ? origin : 2 * cp_.size - 1 - origin; }
  void pass_on(std::vector<float>& cur, std::vector<float>& next, size_t n);

  ContextParallel cp_;
  int Hq_, Hkv_, D_, W_;
  std::vector<float> halo_[3], dhalo_[3], tails_, gathered_;
  std::vector<float> ring_, ring_next_;  // [k | v | dk | dv] of the block in hand
  std::vector<float> part_out_, acc_lse_, pair_lse_, delta_;
};

}  // namespace kvs
