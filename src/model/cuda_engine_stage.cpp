// The CUDA engine as a pipeline stage (parallel/pipeline.h, docs/PARALLEL.md):
// the held layers in chunks, one micro-batch of one chunk at a time in one of
// the plan's slots. The math is forward_backward's, op for op: a chunk's first
// layer starts from its stored input (as a recomputed layer does), its last
// layer's residual add is the fused add + RMSNorm of the next layer with the
// norm thrown away, so a stage boundary changes no bits.
//
// Between stages the activations are the bf16 residual stream. Over a
// communicator that takes device memory (NCCL) the runner moves the engine's
// own buffers (stage_device_buffer: a chunk's input and output entries of
// the slot's resid, dresid for the incoming gradient, dstage for the outgoing
// one). Over MPI they come and go as host fp32 through the pinned h_stage_
// (bf16 -> fp32 -> bf16 is exact, so both paths give the same bits).
//
// Under context and sequence parallelism the stages pass this rank's rows of
// the residual stream, as CpuEngine's do: its two chunks of every sequence
// (cp_rows), then its N / tp of them (SP). The cp layout is the current
// micro-batch's; stage_backward rebuilds it from the slot's shape.
#ifdef KVS_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/op_stat.h"
#include "core/profile_range.h"
#include "core/safetensors.h"  // bf16_to_f32, f32_to_bf16
#include "kernels/cuda/check.h"
#include "model/cuda_engine.h"

namespace kvs {

namespace {
using cuda::bf16;
constexpr cuda::ErrorCheck check{"CUDA engine (pipeline stage)"};
}  // namespace

void CudaEngine::take_part(const ModelPart* part) {
  part_ = part ? *part : ModelPart::whole(m_);
  local_of_.assign(m_.num_hidden_layers, -1);
  stages_.chunk_of.clear();
  chunks_.clear();
  for (size_t li = 0; li < part_.layers.size(); ++li) {
    const int l = part_.layers[li];
    KVS_CHECK(l >= 0 && l < m_.num_hidden_layers, "engine: the pipeline stage holds layer {} of {}", l,
              m_.num_hidden_layers);
    local_of_[l] = static_cast<int>(li);
    const bool starts = li == 0 || part_.layers[li - 1] != l - 1;
    if (starts) chunks_.push_back({static_cast<int>(li), static_cast<int>(li), false, false});
    chunks_.back().last = static_cast<int>(li);
    stages_.chunk_of.push_back(static_cast<int>(chunks_.size()) - 1);
  }
  KVS_CHECK(!chunks_.empty(), "engine: a pipeline stage without layers");
  chunks_.front().embedding = part_.embedding;
  chunks_.back().head = part_.head;
  stages_.head = part_.head;
  stages_.staged = part != nullptr;
}

void CudaEngine::use_slot(int slot) {
  KVS_CHECK(slot >= 0 && slot < plan0_.slots, "engine: activation slot {} of {}", slot, plan0_.slots);
  plan_ = plan0_.in_slot(slot);
  slot_tokens_.resize(plan0_.slots);
  slot_shape_.resize(plan0_.slots, {0, 0});
}

bf16* CudaEngine::chunk_input(const CudaPlan& p, int chunk) const {
  return at<bf16>(p.resid + p.resid_index[chunks_.at(chunk).first] * p.resid_stride);
}

bf16* CudaEngine::chunk_output(const CudaPlan& p, int chunk) const {
  return at<bf16>(p.resid + (p.resid_index[chunks_.at(chunk).last] + 1) * p.resid_stride);
}

void CudaEngine::stage_upload(bf16* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) h_stage_[i] = f32_to_bf16(src[i]);
  check(cudaMemcpyAsync(dst, h_stage_, n * sizeof(bf16), cudaMemcpyHostToDevice, stream_), "upload stage input");
}

void CudaEngine::stage_download(float* dst, const bf16* src, size_t n) {
  check(cudaMemcpyAsync(h_stage_, src, n * sizeof(bf16), cudaMemcpyDeviceToHost, stream_), "download stage output");
  sync("download stage output");
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h_stage_[i]);
}

// This rank's residual rows: its cp chunks of every sequence, then its N / tp
// of them under sequence parallelism.
size_t CudaEngine::stage_floats(const Batch& b) const {
  return region_->local_rows(static_cast<size_t>(b.B) * b.T / cp_.size) * d_.C;
}

Engine::DeviceBuffer CudaEngine::stage_device_buffer(int slot, int chunk, StageTensor which, const Batch& b) {
  KVS_CHECK(plan0_.staged, "engine: stage buffers need a pipeline stage (a ModelPart)");
  KVS_CHECK(slot >= 0 && slot < plan0_.slots, "engine: activation slot {} of {}", slot, plan0_.slots);
  const CudaPlan p = plan0_.in_slot(slot);
  const size_t bytes = stage_floats(b) * sizeof(bf16);
  switch (which) {
    case StageTensor::Input: return {chunk_input(p, chunk), bytes};
    case StageTensor::Output: return {chunk_output(p, chunk), bytes};
    case StageTensor::GradOutput: return {at<bf16>(p.dresid), bytes};
    case StageTensor::GradInput: return {at<bf16>(p.dstage), bytes};
  }
  fail("engine: unknown stage buffer");
}

double CudaEngine::stage_forward(int slot, int chunk, const Batch& b, const float* input, float* output,
                                 double grad_scale, float* token_losses, int32_t* argmax) {
  KVS_CHECK(plan0_.staged, "engine: stage_forward needs a pipeline stage (a ModelPart)");
  use_slot(slot);
  validate_batch(b, m_, max_B_, max_T_);
  // This rank's chunks under context parallelism (cp_layout_ for this
  // micro-batch; stage_backward rebuilds it from the slot's shape).
  const Batch& lb = cp_rows(b);
  const StageChunk& c = chunks_.at(chunk);
  const int B = lb.B, T = lb.T, N = B * T, C = d_.C, V = d_.V, Nl = static_cast<int>(region_->local_rows(N));
  KVS_CHECK(Nl * tp_.size == N || !region_->sequence_parallel(),
            "engine: sequence parallelism needs micro-batch rows ({} x {}) divisible by tp ({})", B, T, tp_.size);
  const float eps = static_cast<float>(m_.rms_norm_eps);
  const CudaPlan& p = plan_;
  const bf16* P16 = at<bf16>(p.params16);
  slot_shape_[slot] = {B, T};
  const bool targets = c.head && lb.targets != nullptr;
  if (c.embedding || targets) upload_batch(lb, targets);
  upload_documents(b);  // every stage shifts (b: whole sequences; cp_rows set this micro-batch's layout)
  bf16* in = chunk_input(p, chunk);
  if (c.embedding) {
    join_optimizer(embed_off_);
    // The embedding's backward groups positions by token on the host: keep this slot's.
    slot_tokens_[slot].assign(lb.inputs, lb.inputs + N);
    // Vocab-parallel: the sum over the group (sequence parallel: its rows of it).
    if (region_->sequence_parallel()) {
      cuda::embedding_forward_vocab_slice(at<bf16>(p.sp_full), at<int32_t>(p.tokens), P16 + embed_off_, N, C,
                                          d_.v_begin, d_.V, stream_);
      region_->scatter_sum_bf16(at<bf16>(p.sp_full), in, static_cast<size_t>(Nl) * C);
    } else {
      cuda::embedding_forward_vocab_slice(in, at<int32_t>(p.tokens), P16 + embed_off_, N, C, d_.v_begin, d_.V,
                                          stream_);
      region_->exit_forward(in, static_cast<size_t>(N) * C);
    }
  } else if (input) {
    stage_upload(in, input, static_cast<size_t>(Nl) * C);
  }  // else the previous stage's activations were received into `in` (stage_device_buffer)
  for (int li = c.first; li <= c.last; ++li) forward_layer(part_.layers[li], B, T);
  bf16* out = chunk_output(p, chunk);
  const bf16* mid = p.layer(base_, c.last).res_mid;
  if (!c.head) {
    // The last layer's residual add, which the next layer would fuse into its
    // norm: the same kernel, its normalised output discarded.
    cuda::residual_rmsnorm_forward(out, at<bf16>(p.dln), at<float>(p.stage_rstd), mid, at<bf16>(p.proj),
                                   fp32_param(lo_[part_.layers[c.last]].ln1), Nl, C, eps, stream_);
    if (output) {
      stage_download(output, out, static_cast<size_t>(Nl) * C);
    } else {
      sync("stage forward");
    }
    return 0.0;
  }
  join_optimizer();  // the final norm and the LM head
  cuda::residual_rmsnorm_forward(out, at<bf16>(p.lnf), at<float>(p.rstdf), mid, at<bf16>(p.proj), fp32_param(norm_off_),
                                 Nl, C, eps, stream_);
  {
    const kvs::profile::GemmLabel gemm_label("lm head");
    linear_->column_forward(at<bf16>(p.logits), V, at<bf16>(p.lnf), C, P16 + lm_head_off_, N, C, V);
  }
  if (!lb.targets) {
    sync("stage forward");
    return 0.0;
  }
  const bool train = grad_scale >= 0;
  loss(N, train, train ? static_cast<float>(grad_scale) : 1.0f, !train && argmax != nullptr);
  if (cp_.size > 1) {
    // The whole micro-batch's token outputs from every rank's chunks; the loss summed over the group.
    if (!train) cp_gather_outputs(b, token_losses, argmax);
    return cp_x_->sum(device_sum_losses(N));
  }
  if (!train && token_losses)
    check(cudaMemcpyAsync(token_losses, at<float>(p.losses), N * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "read losses");
  if (!train && argmax)
    check(cudaMemcpyAsync(argmax, at<int32_t>(p.argmax), N * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
          "read argmax");
  return device_sum_losses(N);
}

void CudaEngine::stage_backward(int slot, int chunk, const float* doutput, float* dinput) {
  KVS_CHECK(plan0_.staged, "engine: stage_backward needs a pipeline stage (a ModelPart)");
  use_slot(slot);
  const StageChunk& c = chunks_.at(chunk);
  const auto [B, T] = slot_shape_[slot];  // this rank's rows (its chunks under context parallelism)
  KVS_CHECK(B > 0, "engine: stage_backward of slot {} before its forward", slot);
  join_optimizer();
  join_zeroing();  // the head's gradients below are written before backward_layer's join
  // Other micro-batches ran since this one's forward: its chunks' layout again.
  if (cp_.size > 1) cp_layout_ = CpLayout(cp_, B, T * cp_.size);
  const int N = B * T, C = d_.C, V = d_.V, Nl = static_cast<int>(region_->local_rows(N));
  const CudaPlan& p = plan_;
  const bf16* P16 = at<bf16>(p.params16);
  float* G = at<float>(p.grads);
  bf16* dresid = at<bf16>(p.dresid);
  if (c.head) {
    // LM head and final norm (the loss wrote dlogits over the slot's logits).
    bf16* dln = at<bf16>(p.dln);
    {
      const kvs::profile::GemmLabel gemm_label("lm head");
      linear_->column_backward(dln, G + lm_head_off_, at<bf16>(p.logits), V, at<bf16>(p.lnf), C, P16 + lm_head_off_,
                               N, C, V);
    }
    cuda::rmsnorm_backward(dresid, norm_grad(norm_off_, 0), dln, nullptr, chunk_output(p, chunk), fp32_param(norm_off_),
                           at<float>(p.rstdf), Nl, C, at<float>(p.scratch), stream_);
    sum_norm_grads({norm_off_});
  } else if (doutput) {
    stage_upload(dresid, doutput, static_cast<size_t>(Nl) * C);
  }  // else the next stage's gradient was received into dresid (stage_device_buffer)
  for (int li = c.last; li >= c.first; --li) backward_layer(part_.layers[li], B, T);
  if (c.embedding) {
    // Sequence parallel: every rank's rows of the gradient gathered first (embedding_backward).
    std::memcpy(h_tokens_, slot_tokens_[slot].data(), N * sizeof(int32_t));
    embedding_backward(N);
    sync("stage backward");
  } else if (dinput) {
    stage_download(dinput, dresid, static_cast<size_t>(Nl) * C);
  } else {
    check(cudaMemcpyAsync(at<bf16>(p.dstage), dresid, static_cast<size_t>(Nl) * C * sizeof(bf16),
                          cudaMemcpyDeviceToDevice, stream_),
          "stage input gradient");
    sync("stage backward");
  }
}

}  // namespace kvs
#endif  // KVS_CUDA
