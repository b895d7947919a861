// Context parallelism on the CUDA engine (parallel/context_parallel.h has the
// scheme, CpuEngine and model/cpu_block.cpp the reference it mirrors op for op):
//   - the batch: this rank's chunks r and 2 cp - 1 - r of every sequence,
//     rows [2 halves][B][Tc], Tc = T / (2 cp) (CpLayout, taken on the host);
//     every per-row op runs on them unchanged;
//   - the shift's halo: the last W raw q/k/v rows of each half (the fused
//     projection's rows, all columns) are all-gathered; each half's shift
//     reads the rows of the chunk before it (none before position 0: zeros);
//     in the backward the halo rows' fp32 gradients are all-gathered and each
//     owner adds those of its chunks into its last W rows (shift_halo_add);
//   - RoPE: each half from its chunk's first position (the tables + pos0 D/2);
//   - ring attention: the K̂/V̂ halves travel around the ring; for each query
//     half and key half the flash kernels attend the block (the diagonal
//     causally, an earlier chunk fully, a later one not at all) and
//     attention_merge folds the block's output and lse into an fp32 running
//     output and the layer's lse. In the backward every block runs the flash
//     backward with the merged output and lse (so delta and P are the whole
//     row's), dq adds up in fp32, and dK̂/dV̂ ride along with their block in
//     fp32 until it is home after a full turn;
//   - loss and token counts: the sum of the token losses over the group.
// Every transfer drains the engine's stream first (parallel/cuda_cp_exchange.h),
// except the ring's K̂/V̂ steps on NCCL, which travel while the step's blocks run.
#ifdef KVS_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "dist/comm.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "model/cuda_engine.h"

namespace kvs {

namespace {

using cuda::bf16;

constexpr cuda::ErrorCheck check{"CUDA engine (context parallel)"};

}  // namespace

const Batch& CudaEngine::cp_rows(const Batch& b) {
  if (cp_.size == 1) return b;
  cp_layout_ = CpLayout(cp_, b.B, b.T);
  check_cp_chunks_hold_the_window(cp_layout_, m_);
  const CpLayout& l = cp_layout_;
  const size_t n = l.rows();
  cp_inputs_.resize(n);
  l.take(b.inputs, cp_inputs_.data(), 1);
  if (b.targets) {
    cp_targets_.resize(n);
    l.take(b.targets, cp_targets_.data(), 1);
  }
  if (b.mask) {
    cp_mask_.resize(n);
    l.take(b.mask, cp_mask_.data(), 1);
  }
  cp_batch_ = {b.B, b.T / cp_.size, cp_inputs_.data(), b.targets ? cp_targets_.data() : nullptr,
               b.mask ? cp_mask_.data() : nullptr};
  return cp_batch_;
}

void CudaEngine::cp_gather_outputs(const Batch& b, float* token_losses, int32_t* argmax) {
  const CpLayout& l = cp_layout_;
  const size_t n = l.rows(), full = static_cast<size_t>(b.B) * b.T;
  std::vector<float> local(n);
  cp_gather_.resize(full);
  // Into the full batch's order from every rank's [2][B][Tc] rows (ids as
  // floats: exact below 2^24, and vocabularies are smaller).
  auto gather = [&](auto* out) {
    cp_.comm->all_gather(local.data(), cp_gather_.data(), n, dist::DType::F32);
    for (int r = 0; r < cp_.size; ++r) {
      const CpLayout lr({r, cp_.size, nullptr}, b.B, b.T);
      const float* src = cp_gather_.data() + r * n;
      for (int h = 0; h < 2; ++h)
        for (int s = 0; s < b.B; ++s)
          for (int t = 0; t < l.Tc; ++t)
            out[lr.full_row(h, s, t)] =
                static_cast<std::remove_pointer_t<decltype(out)>>(src[(static_cast<size_t>(h) * b.B + s) * l.Tc + t]);
    }
  };
  if (token_losses) {
    check(cudaMemcpyAsync(local.data(), at<float>(plan_.losses), n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "read losses");
    sync("read losses");
    gather(token_losses);
  }
  if (argmax) {
    std::vector<int32_t> ids(n);
    check(cudaMemcpyAsync(ids.data(), at<int32_t>(plan_.argmax), n * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
          "read argmax");
    sync("read argmax");
    for (size_t i = 0; i < n; ++i) local[i] = static_cast<float>(ids[i]);
    gather(argmax);
  }
}

void CudaEngine::cp_gather_halos(const CudaLayerActs& x, int B) {
  const CpLayout& l = cp_layout_;
  const int Tc = l.Tc, W = m_.kv_shift.window, QKV = d_.QD() + 2 * d_.KD();
  const size_t tail_rows = 2 * static_cast<size_t>(B) * W;
  bf16* tails = at<bf16>(plan_.cp_tails);
  for (int h = 0; h < 2; ++h)
    for (int b = 0; b < B; ++b)
      check(cudaMemcpyAsync(tails + (static_cast<size_t>(h) * B + b) * W * QKV,
                            x.qkv + ((static_cast<size_t>(h) * B + b) * Tc + Tc - W) * QKV,
                            static_cast<size_t>(W) * QKV * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_),
            "halo tails");
  cp_x_->all_gather(tails, at<bf16>(plan_.cp_halos), tail_rows * QKV * sizeof(bf16));
}

void CudaEngine::cp_attention_forward(const CudaLayerActs& x, const LayerCoefs& c, int B) {
  const CpLayout& l = cp_layout_;
  const CudaPlan& p = plan_;
  const int Tc = l.Tc, P = l.cp, Hq = d_.Hq, Hkv = d_.Hkv, D = d_.D, W = m_.kv_shift.window;
  const int QD = d_.QD(), KD = d_.KD(), QKV = QD + 2 * KD;
  const size_t half = static_cast<size_t>(B) * Tc;  // rows of one half
  const bool rope = m_.position_encoding == PositionEncoding::Rope;
  const bool shifted = c.q || c.k || c.v;
  if (shifted) cp_gather_halos(x, B);
  const int32_t* sdoc = shift_documents();  // [2][B][Tc], each half's row coordinates (negative: an earlier chunk)
  for (int h = 0; h < 2; ++h) {
    // The chunk before this half's, on rank `owner` as its half `owner_half`.
    const int prev = l.chunk(h) - 1;
    const bf16* halo = nullptr;
    if (shifted && prev >= 0) {
      const int owner = prev < P ? prev : 2 * P - 1 - prev, owner_half = prev < P ? 0 : 1;
      halo = at<bf16>(p.cp_halos) + ((static_cast<size_t>(owner) * 2 + owner_half) * B) * W * QKV;
    }
    const size_t at_pos = static_cast<size_t>(l.pos0(h)) * (D / 2);
    const float* cos = rope ? at<float>(p.rope_cos) + at_pos : nullptr;
    const float* sin = rope ? at<float>(p.rope_sin) + at_pos : nullptr;
    const bf16* in = x.qkv + h * half * QKV;
    auto halo_of = [&](const float* coef, int col) {
      return cuda::ShiftHalo{coef && halo ? halo + col : nullptr, QKV, nullptr, 0};
    };
    const auto units = cuda::ShiftRopeWalk::kUnits;
    const auto v8 = cuda::ShiftRopeVector::k8;
    const int32_t* hdoc = sdoc ? sdoc + h * half : nullptr;  // this half's starts
    cuda::shift_rope_forward(x.qhat + h * half * QD, QD, in, QKV, c.q, cos, sin, B, Tc, Hq, D, c.q ? W : 0, stream_,
                             halo_of(c.q, 0), v8, units, hdoc);
    cuda::shift_rope_forward(x.khat + h * half * KD, KD, in + QD, QKV, c.k, cos, sin, B, Tc, Hkv, D, c.k ? W : 0,
                             stream_, halo_of(c.k, QD), v8, units, hdoc);
    cuda::shift_rope_forward(x.vhat + h * half * KD, KD, in + QD + KD, QKV, c.v, nullptr, nullptr, B, Tc, Hkv, D,
                             c.v ? W : 0, stream_, halo_of(c.v, QD + KD), v8, units, hdoc);
  }

  // Ring attention: the block in hand is [k | v] of both halves of rank `origin`.
  const size_t kv = 2 * half * KD, kv_bytes = 2 * kv * sizeof(bf16);
  char* ring[2] = {at<char>(p.cp_ring[0]), at<char>(p.cp_ring[1])};
  check(cudaMemcpyAsync(ring[0], x.khat, kv * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_), "ring k");
  check(cudaMemcpyAsync(ring[0] + kv * sizeof(bf16), x.vhat, kv * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_),
        "ring v");
  float* acc = at<float>(p.cp_acc);
  const size_t half_lse = static_cast<size_t>(B) * Hq * Tc;
  cuda::fill_f32(x.lse, -std::numeric_limits<float>::infinity(), 2 * half_lse, stream_);
  bf16* part = at<bf16>(p.cp_part);
  float* part_lse = at<float>(p.cp_part_lse);
  const int32_t* doc = attention_documents();  // [2][B][Tc], each half's row coordinates
  for (int s = 0; s < P; ++s) {
    const int origin = (l.rank - s + P) % P;
    const bf16* rk = reinterpret_cast<const bf16*>(ring[0]);
    const bf16* rv = rk + kv;
    // The next step's block travels while this one's attention runs.
    if (s + 1 < P) cp_x_->start_pass_on(ring[0], ring[1], kv_bytes);
    for (int hq = 0; hq < 2; ++hq)
      for (int hk = 0; hk < 2; ++hk) {
        const int qc = l.chunk(hq), kc = hk == 0 ? origin : 2 * P - 1 - origin;
        if (kc > qc) continue;  // every key after every query
        const cuda::AttentionDocs docs{doc ? doc + hq * half : nullptr, (kc - qc) * Tc};
        attn_->forward_masked(part, part_lse, x.qhat + hq * half * QD, QD, rk + hk * half * KD, rv + hk * half * KD,
                              KD, B, Tc, Hq, Hkv, D, kc == qc, docs, stream_);
        cuda::attention_merge(acc + hq * half * QD, x.lse + hq * half_lse, part, part_lse, B, Tc, Hq, D, stream_);
      }
    if (s + 1 < P) {
      cp_x_->finish_pass_on();
      std::swap(ring[0], ring[1]);
    }
  }
  cuda::f32_to_bf16(x.attout, acc, 2 * half * QD, stream_);
}

void CudaEngine::cp_attention_backward(int l_index, const CudaLayerActs& x, const LayerCoefs& c, int B) {
  const CpLayout& l = cp_layout_;
  const CudaPlan& p = plan_;
  const int Tc = l.Tc, P = l.cp, Hq = d_.Hq, Hkv = d_.Hkv, D = d_.D, W = m_.kv_shift.window;
  const int QD = d_.QD(), KD = d_.KD(), QKV = QD + 2 * KD;
  const size_t W1 = static_cast<size_t>(W) + 1;
  const size_t half = static_cast<size_t>(B) * Tc, half_lse = static_cast<size_t>(B) * Hq * Tc;
  const bool rope = m_.position_encoding == PositionEncoding::Rope;
  const bool gated = m_.kv_shift.sigmoid_gate();
  const LayerOffsets& o = lo_[l_index];
  float* G = at<float>(p.grads);
  float* scratch = at<float>(p.scratch);
  const bf16* dattout = at<bf16>(p.dattout);
  bf16* dqhat = at<bf16>(p.dqhat);
  bf16* dkhat = at<bf16>(p.dkhat);
  bf16* dvhat = at<bf16>(p.dvhat);
  bf16* dqkv = at<bf16>(p.dqkv);

  // Ring attention backward: [k | v] bf16 then [dk | dv] fp32 travel together.
  const size_t kv = 2 * half * KD;
  char* ring[2] = {at<char>(p.cp_ring[0]), at<char>(p.cp_ring[1])};
  check(cudaMemcpyAsync(ring[0], x.khat, kv * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_), "ring k");
  check(cudaMemcpyAsync(ring[0] + kv * sizeof(bf16), x.vhat, kv * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_),
        "ring v");
  cuda::fill_f32(reinterpret_cast<float*>(ring[0] + 2 * kv * sizeof(bf16)), 0.0f, 2 * kv, stream_);
  float* dq_acc = at<float>(p.cp_acc);
  cuda::fill_f32(dq_acc, 0.0f, 2 * half * QD, stream_);
  bf16* part_dq = at<bf16>(p.cp_part);
  bf16* part_dk = at<bf16>(p.cp_dk);
  bf16* part_dv = at<bf16>(p.cp_dv);
  const int32_t* doc = attention_documents();
  for (int s = 0; s < P; ++s) {
    const int origin = (l.rank - s + P) % P;
    const bf16* rk = reinterpret_cast<const bf16*>(ring[0]);
    const bf16* rv = rk + kv;
    float* rdk = reinterpret_cast<float*>(ring[0] + 2 * kv * sizeof(bf16));
    float* rdv = rdk + kv;
    // The next step's K̂ and V̂ travel while this step's blocks run (their
    // gradients below only after them).
    if (s + 1 < P) cp_x_->start_pass_on(ring[0], ring[1], 2 * kv * sizeof(bf16));
    for (int hq = 0; hq < 2; ++hq)
      for (int hk = 0; hk < 2; ++hk) {
        const int qc = l.chunk(hq), kc = hk == 0 ? origin : 2 * P - 1 - origin;
        if (kc > qc) continue;
        const cuda::AttentionDocs docs{doc ? doc + hq * half : nullptr, (kc - qc) * Tc};
        attn_->backward_masked(part_dq, part_dk, part_dv, dattout + hq * half * QD, x.attout + hq * half * QD,
                               x.lse + hq * half_lse, x.qhat + hq * half * QD, QD, rk + hk * half * KD,
                               rv + hk * half * KD, KD, B, Tc, Hq, Hkv, D, kc == qc, docs, scratch, stream_);
        cuda::add_bf16_to_f32(dq_acc + hq * half * QD, part_dq, half * QD, stream_);
        cuda::add_bf16_to_f32(rdk + hk * half * KD, part_dk, half * KD, stream_);
        cuda::add_bf16_to_f32(rdv + hk * half * KD, part_dv, half * KD, stream_);
      }
    cp_x_->finish_pass_on();
    // The block's dK̂, dV̂ on to the next rank: after P steps each is home.
    cp_x_->pass_on(ring[0] + 2 * kv * sizeof(bf16), ring[1] + 2 * kv * sizeof(bf16), 2 * kv * sizeof(float));
    std::swap(ring[0], ring[1]);
  }
  const float* rdk = reinterpret_cast<const float*>(ring[0] + 2 * kv * sizeof(bf16));
  cuda::f32_to_bf16(dqhat, dq_acc, 2 * half * QD, stream_);
  cuda::f32_to_bf16(dkhat, rdk, kv, stream_);
  cuda::f32_to_bf16(dvhat, rdk + kv, kv, stream_);

  // Through RoPE and the shifts, per half, into the fused projection's
  // gradient; the halo rows' gradients into cp_dtails ([2][B][W][QKV]). The
  // coefficients' gradients read the halo rows: gathered again, since
  // cp_halos holds the last forward's layer (and, in a pipeline stage, the
  // last forward's micro-batch).
  const bool shifted = c.q || c.k || c.v;
  if (shifted) cp_gather_halos(x, B);
  float* dtails = at<float>(p.cp_dtails);
  if (shifted) cuda::fill_f32(dtails, 0.0f, 2 * static_cast<size_t>(B) * W * QKV, stream_);
  float* dcoef = at<float>(p.dcoef);
  const int32_t* sdoc = shift_documents();
  struct Part {
    bf16* dx;
    const bf16* dy;
    int ld_dy, col, H;
    const float* coef;
    bool has, rotate;
    size_t goff;
  };
  const Part parts[3] = {{dqkv, dqhat, QD, 0, Hq, c.q, o.has_q_shift, true, o.q_shift},
                         {dqkv + QD, dkhat, KD, QD, Hkv, c.k, o.has_k_shift, true, o.k_shift},
                         {dqkv + QD + KD, dvhat, KD, QD + KD, Hkv, c.v, o.has_v_shift, false, o.v_shift}};
  for (const Part& t : parts) {
    // The coefficient gradients of both halves go straight into the gradient
    // tensor, or for the sigmoid gate into dcoef and then through the gate.
    float* dc = t.has ? (gated ? dcoef : G + t.goff) : nullptr;
    if (t.has && gated) cuda::fill_f32(dcoef, 0.0f, static_cast<size_t>(t.H) * W1, stream_);
    for (int h = 0; h < 2; ++h) {
      const int prev = l.chunk(h) - 1;
      cuda::ShiftHalo halo;
      if (t.has && prev >= 0) {
        const int owner = prev < P ? prev : 2 * P - 1 - prev, owner_half = prev < P ? 0 : 1;
        halo.rows = at<bf16>(p.cp_halos) + ((static_cast<size_t>(owner) * 2 + owner_half) * B) * W * QKV + t.col;
        halo.ld = QKV;
        halo.grad = dtails + static_cast<size_t>(h) * B * W * QKV + t.col;
        halo.ld_grad = QKV;
      }
      const size_t at_pos = static_cast<size_t>(l.pos0(h)) * (D / 2);
      const float* cos = rope && t.rotate ? at<float>(p.rope_cos) + at_pos : nullptr;
      const float* sin = rope && t.rotate ? at<float>(p.rope_sin) + at_pos : nullptr;
      cuda::shift_rope_backward(t.dx + h * half * QKV, QKV, dc, t.dy + h * half * t.ld_dy, t.ld_dy,
                                x.qkv + h * half * QKV + t.col, QKV, t.coef, cos, sin, B, Tc, t.H, D, t.has ? W : 0,
                                scratch, stream_, halo, cuda::ShiftRopeVector::k8, cuda::ShiftRopeWalk::kUnits,
                                sdoc ? sdoc + h * half : nullptr);
    }
    if (t.has && gated) cuda::shift_gate_backward(G + t.goff, dcoef, fp32_param(t.goff), t.H, stream_);
  }
  if (!shifted) return;
  // The halo gradients back to their owners: every rank's, and this rank adds
  // those of the halves whose previous chunk is one of its own.
  const size_t tail = 2 * static_cast<size_t>(B) * W * QKV;
  float* dhalos = at<float>(p.cp_dhalos);
  cp_x_->all_gather(dtails, dhalos, tail * sizeof(float));
  for (int q = 0; q < P; ++q)
    for (int h = 0; h < 2; ++h) {
      const int prev = (h == 0 ? q : 2 * P - 1 - q) - 1;
      const int mine = prev == l.chunk(0) ? 0 : (prev == l.chunk(1) ? 1 : -1);
      if (prev < 0 || mine < 0) continue;
      cuda::shift_halo_add(dqkv + mine * half * QKV, QKV, dhalos + q * tail + static_cast<size_t>(h) * B * W * QKV,
                           QKV, B, Tc, QKV, W, stream_);
    }
}

}  // namespace kvs
#endif  // KVS_CUDA
