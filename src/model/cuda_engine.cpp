// The Llama + KV shifting forward and backward on one GPU. The op list is
// CpuEngine's (cpu_engine.cpp) with three fusions that change no math:
//   - Q, K and V come from one GEMM against the adjacent q/k/v_proj weights
//     ([QD + 2 KD, C] in the parameter layout), gate and up from one GEMM
//     against gate/up_proj ([2F, C]); their backward is one GEMM each too;
//   - each residual add is fused into the RMSNorm that follows it
//     (res_mid = resid + o_proj, ln2 = norm(res_mid); resid' = res_mid +
//     down_proj, ln1' = norm(resid'));
//   - the KV shift and RoPE are one kernel (shift_rope), reading Q, K and V
//     straight out of the fused projection.
// Every kernel is asynchronous on one stream; the host synchronises only to
// read the loss sum, the gradient norm or results the caller asked for.
#ifdef KVS_CUDA
#include "model/cuda_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/op_stat.h"
#include "core/profile_range.h"
#include "core/safetensors.h"  // bf16_to_f32, f32_to_bf16
#include "dist/nccl_comm.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernel_profile.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/vocab_parallel_ce.h"
#include "model/rope_frequencies.h"

namespace kvs {

namespace {

// After a failed cudaMalloc: clears its error and returns the device's free GiB, for the message.
double free_gib_after_failed_malloc() {
  cudaGetLastError();
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  return free_b / 1073741824.0;
}

using cuda::bf16;

constexpr cuda::ErrorCheck check{"CUDA engine"};

// The shift+RoPE kernels the layers run (ops.h; each falls back to the unit
// kernels where a row walk does not fit: windows over 1, documents,
// context-parallel halos). On an H200 (bench-attention, B 4, 16 heads of
// 128, 2026-11-29) the row walks beat the 8-wide unit kernels at every T
// from 1k to 8k: forward 0.73-0.90 of copy bandwidth against 0.59-0.72,
// backward 0.58-0.76 against 0.34-0.47; the forward 8-wide walk was best at
// 3 of the 4 lengths, the backward 4-wide at all 4 (tied at 8k). y and dx
// are the same bits in every variant.
constexpr auto kShiftWalk = cuda::ShiftRopeWalk::kRows;
constexpr auto kShiftForwardVector = cuda::ShiftRopeVector::k8;
constexpr auto kShiftBackwardVector = cuda::ShiftRopeVector::k4;

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

CudaPlan CudaPlan::build(const ModelConfig& m, const LocalDims& d, int tp, const ParamLayout& layout, int B, int T,
                         Recompute recompute, int sp, int cp) {
  return build(m, d, tp, layout, B, T, recompute, CudaStages::whole(m), sp, cp);
}

CudaPlan CudaPlan::build(const ModelConfig& m, const LocalDims& d, int tp, const ParamLayout& layout, int B, int T,
                         Recompute recompute, const CudaStages& stages, int sp, int cp) {
  CudaPlan p;
  const size_t N = static_cast<size_t>(B) * T / cp, L = stages.chunk_of.size(), C = d.C;
  const size_t Nl = N / sp;  // the residual stream's rows on this rank
  const size_t QD = d.QD(), KD = d.KD(), F = d.F, V = d.V;
  const size_t Hq = d.Hq, Hkv = d.Hkv, D = d.D;
  const size_t W1 = static_cast<size_t>(m.kv_shift.window) + 1;
  const size_t P = layout.total;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align256(bytes);
    return at;
  };
  const size_t h2 = sizeof(bf16), f4 = sizeof(float);
  p.grads = take(P * f4);
  p.params16 = take(P * h2);

  p.resid_stride = align256(Nl * C * h2);
  p.ln_stride = p.resid_stride;
  p.qkv_stride = align256(N * (QD + 2 * KD) * h2);
  p.q_stride = align256(N * QD * h2);
  p.kv_stride = align256(N * KD * h2);
  p.ffn2_stride = align256(N * 2 * F * h2);
  p.ffn_stride = align256(N * F * h2);
  p.rstd_stride = align256(Nl * f4);
  p.lse_stride = align256(static_cast<size_t>(B) * Hq * (T / cp) * f4);
  p.attn_slots = recompute == Recompute::None ? static_cast<int>(L) : 1;
  p.rest_slots = recompute == Recompute::Full ? 1 : static_cast<int>(L);
  const size_t A = p.attn_slots, R = p.rest_slots;
  // Pipeline slots: what one micro-batch keeps from its forward to its
  // backward is taken once per slot; a recomputed group is shared by the
  // slots (a staged backward recomputes every layer).
  p.slots = stages.slots;
  p.staged = stages.staged;
  const size_t runs = L ? static_cast<size_t>(stages.chunk_of.back()) + 1 : 1;
  for (size_t li = 0; li < L; ++li) p.resid_index.push_back(static_cast<int>(li) + stages.chunk_of[li]);
  auto per_slot = [&](size_t CudaPlan::*field, size_t bytes) {
    p.*field = take(static_cast<size_t>(p.slots) * align256(bytes));
    p.slot_fields.push_back({field, align256(bytes)});
  };
  auto group = [&](size_t CudaPlan::*field, size_t count, size_t stride, bool kept) {
    if (kept)
      per_slot(field, count * stride);
    else
      p.*field = take(count * stride);
  };
  const bool attn_kept = recompute == Recompute::None, rest_kept = recompute != Recompute::Full;
  per_slot(&CudaPlan::resid, (L + runs) * p.resid_stride);  // layer inputs: always kept
  group(&CudaPlan::res_mid, R, p.resid_stride, rest_kept);
  group(&CudaPlan::ln1, R, p.ln_stride, rest_kept);
  group(&CudaPlan::ln2, R, p.ln_stride, rest_kept);
  group(&CudaPlan::qkv, R, p.qkv_stride, rest_kept);
  group(&CudaPlan::qhat, A, p.q_stride, attn_kept);
  group(&CudaPlan::khat, A, p.kv_stride, attn_kept);
  group(&CudaPlan::vhat, A, p.kv_stride, attn_kept);
  group(&CudaPlan::attout, A, p.q_stride, attn_kept);
  group(&CudaPlan::gate_up, R, p.ffn2_stride, rest_kept);
  group(&CudaPlan::h, R, p.ffn_stride, rest_kept);
  group(&CudaPlan::rstd1, R, p.rstd_stride, rest_kept);
  group(&CudaPlan::rstd2, R, p.rstd_stride, rest_kept);
  group(&CudaPlan::lse, A, p.lse_stride, attn_kept);

  const size_t head = stages.head ? 1 : 0;  // the final norm, LM head and loss (the last stage's)
  per_slot(&CudaPlan::lnf, head * Nl * C * h2);
  per_slot(&CudaPlan::rstdf, head * Nl * f4);
  per_slot(&CudaPlan::logits, head * N * V * h2);
  per_slot(&CudaPlan::losses, head * N * f4);
  p.dstage = take(p.staged ? Nl * C * h2 : 0);
  p.stage_rstd = take(p.staged ? Nl * f4 : 0);
  p.proj = take(Nl * C * h2);
  p.coef_stride = align256((Hq + 2 * Hkv) * W1 * f4);
  p.coef = take(L * p.coef_stride);
  p.rope_cos = take(static_cast<size_t>(T) * D / 2 * f4);
  p.rope_sin = take(static_cast<size_t>(T) * D / 2 * f4);

  p.dresid = take(Nl * C * h2);
  p.dln = take(Nl * C * h2);
  if (sp > 1) {
    p.sp_full = take(N * C * h2);
    p.sp_full2 = take(N * C * h2);
    p.norm_grads = take(2 * C * f4);
  }
  if (cp > 1) {
    const size_t Tc = T / (2 * cp), R = 2 * static_cast<size_t>(B) * (W1 - 1), QKV = QD + 2 * KD;
    const size_t kv = 2 * B * Tc * KD;  // one of k, v, dk, dv: both halves
    p.cp_tails = take(R * QKV * h2);
    p.cp_halos = take(cp * R * QKV * h2);
    p.cp_dtails = take(R * QKV * f4);
    p.cp_dhalos = take(cp * R * QKV * f4);
    p.cp_ring_bytes = 2 * kv * h2 + 2 * kv * f4;
    p.cp_ring[0] = take(p.cp_ring_bytes);
    p.cp_ring[1] = take(p.cp_ring_bytes);
    p.cp_acc = take(N * QD * f4);
    p.cp_part = take(B * Tc * QD * h2);
    p.cp_part_lse = take(B * Hq * Tc * f4);
    p.cp_dk = take(B * Tc * KD * h2);
    p.cp_dv = take(B * Tc * KD * h2);
  }
  p.dh = take(N * F * h2);
  p.dgate_up = take(N * 2 * F * h2);
  p.dattout = take(N * QD * h2);
  p.dqhat = take(N * QD * h2);
  p.dkhat = take(N * KD * h2);
  p.dvhat = take(N * KD * h2);
  p.dqkv = take(N * (QD + 2 * KD) * h2);
  p.dcoef = take((Hq + 2 * Hkv) * W1 * f4);
  const int Bi = B, Ti = T, Ci = static_cast<int>(C), Di = static_cast<int>(D), W = m.kv_shift.window;
  p.scratch_floats = std::max({cuda::rmsnorm_backward_scratch_floats(static_cast<int>(N), Ci),
                               cuda::shift_rope_backward_scratch_floats(Bi, Ti, static_cast<int>(Hq), Di, W),
                               cuda::shift_rope_backward_scratch_floats(Bi, Ti, static_cast<int>(Hkv), Di, W),
                               cuda::flash_attention_backward_scratch_floats(Bi, Ti, static_cast<int>(Hq), Di),
                               size_t{1}});
  p.scratch = take(p.scratch_floats * f4);
  p.dscratch_doubles = std::max(cuda::sum_scratch_doubles(N), cuda::sum_scratch_doubles(P));
  p.dscratch = take(p.dscratch_doubles * sizeof(double));
  p.dsum = take(sizeof(double));

  per_slot(&CudaPlan::tokens, N * sizeof(int32_t));
  per_slot(&CudaPlan::targets, N * sizeof(int32_t));
  per_slot(&CudaPlan::mask, N * f4);
  if (m.document_boundaries != DocumentBoundaries::None) per_slot(&CudaPlan::doc, N * sizeof(int32_t));
  p.emb_uniq = take(N * sizeof(int32_t));
  p.emb_offsets = take((N + 1) * sizeof(int32_t));
  p.emb_positions = take(N * sizeof(int32_t));
  p.argmax = take(N * sizeof(int32_t));
  if (tp > 1) p.ce_stats = take(cuda::VocabCeStats::floats(N) * f4);

  size_t chunks = 0;
  for (const ParamTensor& t : layout.tensors) chunks += (t.numel + cuda::kAdamWChunkElems - 1) / cuda::kAdamWChunkElems;
  p.num_chunks = static_cast<int>(chunks);
  p.chunks = take(chunks * sizeof(cuda::AdamWChunk));
  p.range_chunks = take(chunks * sizeof(cuda::AdamWChunk));
  p.total = off;
  return p;
}

CudaPlan CudaPlan::in_slot(int s) const {
  CudaPlan p = *this;
  for (const auto& [field, bytes] : slot_fields) p.*field += static_cast<size_t>(s) * bytes;
  return p;
}

CudaLayerActs CudaPlan::layer(char* base, int l) const {
  // Recomputation keeps one slot of a group for every layer.
  const size_t r = rest_slots == 1 ? 0 : l, a = attn_slots == 1 ? 0 : l;
  auto h = [&](size_t offset) { return reinterpret_cast<bf16*>(base + offset); };
  auto f = [&](size_t offset) { return reinterpret_cast<float*>(base + offset); };
  CudaLayerActs x;
  x.resid = h(resid + resid_index[l] * resid_stride);
  x.res_mid = h(res_mid + r * resid_stride);
  x.ln1 = h(ln1 + r * ln_stride);
  x.ln2 = h(ln2 + r * ln_stride);
  x.qkv = h(qkv + r * qkv_stride);
  x.gate_up = h(gate_up + r * ffn2_stride);
  x.h = h(this->h + r * ffn_stride);
  x.rstd1 = f(rstd1 + r * rstd_stride);
  x.rstd2 = f(rstd2 + r * rstd_stride);
  x.qhat = h(qhat + a * q_stride);
  x.khat = h(khat + a * kv_stride);
  x.vhat = h(vhat + a * kv_stride);
  x.attout = h(attout + a * q_stride);
  x.lse = f(lse + a * lse_stride);
  return x;
}

CudaEngine::CudaEngine(const ModelConfig& m, int max_batch, int max_seq_len, int device, Recompute recompute,
                       AttentionImpl attention_backend, TensorParallel tp, ContextParallel cp,
                       const ModelPart* part, int slots)
    : m_(m),
      tp_(tp),
      cp_(cp),
      d_(LocalDims::of(m, tp.rank, tp.size)),
      layout_(ParamLayout::build(m, tp.rank, tp.size, part)),
      max_B_(max_batch),
      max_T_(max_seq_len),
      recompute_(recompute) {
  // A throw part-way (no memory, a bad backend, a layout check) must not leak
  // what was already allocated: the destructor does not run for it.
  try {
    take_part(part);
    stages_.slots = slots;
    init(device, attention_backend);
  } catch (...) {
    release();
    throw;
  }
}

void CudaEngine::init(int device, AttentionImpl attention_backend) {
  KVS_CHECK(max_B_ >= 1 && max_T_ >= 1, "engine: batch and sequence length must be positive");
  KVS_CHECK(tp_.size == 1 || (tp_.comm && tp_.comm->size() == tp_.size && tp_.comm->rank() == tp_.rank),
            "engine: tensor-parallel rank {} of {} needs a communicator of that size and rank", tp_.rank, tp_.size);
  check_tensor_parallel(m_, tp_.size, "engine");
  const bool sp = tp_.sequence_parallel && tp_.size > 1;
  KVS_CHECK(!sp || static_cast<int64_t>(max_B_) * max_T_ % tp_.size == 0,
            "engine: sequence parallelism needs micro-batch rows ({} x {}) divisible by tp ({})", max_B_, max_T_,
            tp_.size);
  if (cp_.size > 1) {
    KVS_CHECK(attention_backend != AttentionImpl::Cudnn,
              "device 'cuda': context parallelism runs ring attention on the flash kernels (train.attention_backend "
              "\"flash\" or \"flash-mma\"), got \"{}\"",
              attention_backend);
    KVS_CHECK(max_T_ % (2 * cp_.size) == 0,
              "context parallelism: a sequence of {} positions does not split into 2 x {} chunks", max_T_, cp_.size);
    KVS_CHECK(max_T_ / (2 * cp_.size) >= m_.kv_shift.window,
              "context parallelism: chunks of {} positions are shorter than the shift window {}",
              max_T_ / (2 * cp_.size), m_.kv_shift.window);
  }
  KVS_CHECK(m_.document_boundaries != DocumentBoundaries::ShiftAndAttention || attention_backend != AttentionImpl::Cudnn,
            "device 'cuda': model.document_boundaries \"{}\" masks attention with our flash kernels; "
            "train.attention_backend \"cudnn\" has no document masks here",
            m_.document_boundaries);
  const int D = m_.head_dim();
  KVS_CHECK(D == 16 || D == 32 || D == 64 || D == 128,
            "device 'cuda': head_dim {} (hidden_size / num_attention_heads) is not supported by the flash attention "
            "kernels (16, 32, 64 or 128)",
            D);
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  int least_priority = 0, greatest_priority = 0;
  check(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority), "cudaDeviceGetStreamPriorityRange");
  check(cudaStreamCreateWithPriority(&zero_stream_, cudaStreamNonBlocking, least_priority), "cudaStreamCreate");
  check(cudaEventCreateWithFlags(&zero_after_, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventCreateWithFlags(&zero_done_, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaStreamCreateWithPriority(&opt_stream_, cudaStreamNonBlocking, greatest_priority), "cudaStreamCreate");
  check(cudaEventCreateWithFlags(&opt_after_, cudaEventDisableTiming), "cudaEventCreate");
  // This rank's heads: under tensor parallelism a slice of whole GQA groups.
  attn_ = cuda::make_attention_backend(attention_backend, max_B_, max_T_, d_.Hq, d_.Hkv, D, d_.QD(), d_.KD());
  KVS_CHECK(stages_.slots >= 1, "engine: {} activation slots", stages_.slots);
  plan_ = CudaPlan::build(m_, d_, tp_.size, layout_, max_B_, max_T_, recompute_, stages_, sp ? tp_.size : 1, cp_.size);
  plan0_ = plan_;
  // The AdamW moments are allocated on first use (ensure_moments): by then
  // ZeRO-1 has narrowed them to this rank's shard, so the full moments never
  // exist beside the weights and activations on a rank that keeps a shard.
  void* base = nullptr;
  if (cudaMalloc(&base, plan_.total) != cudaSuccess) {
    fail("device 'cuda': cannot allocate the {:.2f} GiB this model needs at micro-batch {} x {} ({:.2f} GiB free; "
         "the fp32 master weights and AdamW moments come on top: {:.2f} GiB, divided by the data-parallel ranks "
         "under ZeRO-1): lower train.micro_batch_size or train.seq_len, or set train.recompute (\"attention\" or "
         "\"full\")",
         plan_.total / 1073741824.0, max_B_, max_T_, free_gib_after_failed_malloc(),
         3.0 * layout_.total * sizeof(float) / 1073741824.0);
  }
  base_ = static_cast<char*>(base);
  moments_ = nullptr;
  moments_ready_ = false;
  opt_begin_ = 0;
  opt_end_ = layout_.total;
  master_ = nullptr;  // on first use too (ensure_master), after a keep_master_range if ZeRO-1 shards it
  master_ready_ = false;
  master_sharded_ = false;
  master_begin_ = 0;
  master_end_ = layout_.total;
  check(cudaMemsetAsync(base_, 0, plan_.total, stream_), "cudaMemset");
  mm_ = std::make_unique<cuda::Matmul>();
  {
    const size_t N = static_cast<size_t>(max_B_) * max_T_;
    region_ = std::make_unique<CudaTpRegion>(tp_, stream_, std::max(N * d_.C, 2 * N) / cp_.size, sp);
    linear_ = std::make_unique<CudaParallelLinear>(*mm_, *region_, stream_, sp ? at<bf16>(plan_.sp_full) : nullptr,
                                                   sp ? at<bf16>(plan_.sp_full2) : nullptr);
  }

  if (cp_.size > 1) {
    const size_t halo_bytes = cp_.size * 2 * static_cast<size_t>(max_B_) * m_.kv_shift.window *
                              (d_.QD() + 2 * d_.KD()) * sizeof(float);
    cp_x_ = std::make_unique<CudaCpExchange>(cp_, stream_, std::max(plan_.cp_ring_bytes, halo_bytes));
  }

  // Tensor offsets.
  auto off = [&](const std::string& name) -> size_t {
    const ParamTensor* t = layout_.find(name);
    KVS_CHECK(t != nullptr, "CUDA engine: parameter {} missing from the layout", name);
    return t->offset;
  };
  // A pipeline stage holds the embedding (first stage, or the last one's
  // tied LM head), the head (last stage) and its layers only.
  const bool head = part_.head, embedding = part_.embedding || (head && m_.tie_word_embeddings);
  embed_off_ = embedding ? off("model.embed_tokens.weight") : 0;
  norm_off_ = head ? off("model.norm.weight") : 0;
  lm_head_off_ = !head ? 0 : m_.tie_word_embeddings ? embed_off_ : off("lm_head.weight");
  for (int l = 0; l < m_.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerOffsets o{};
    if (local_of_[l] < 0) {  // not held by this stage
      lo_.push_back(o);
      continue;
    }
    o.ln1 = off(p + "input_layernorm.weight");
    o.wqkv = off(p + "self_attn.q_proj.weight");
    KVS_CHECK(off(p + "self_attn.k_proj.weight") == o.wqkv + static_cast<size_t>(d_.QD()) * d_.C &&
                  off(p + "self_attn.v_proj.weight") ==
                      off(p + "self_attn.k_proj.weight") + static_cast<size_t>(d_.KD()) * d_.C,
              "CUDA engine: q/k/v_proj are not adjacent in the parameter layout");
    o.wo = off(p + "self_attn.o_proj.weight");
    o.ln2 = off(p + "post_attention_layernorm.weight");
    o.wgu = off(p + "mlp.gate_proj.weight");
    KVS_CHECK(off(p + "mlp.up_proj.weight") == o.wgu + static_cast<size_t>(d_.F) * d_.C,
              "CUDA engine: gate/up_proj are not adjacent in the parameter layout");
    o.wdown = off(p + "mlp.down_proj.weight");
    auto opt = [&](const char* name, size_t* dst) {
      const ParamTensor* t = layout_.find(p + name);
      if (t) *dst = t->offset;
      return t != nullptr;
    };
    o.has_q_shift = opt("self_attn.q_shift", &o.q_shift);
    o.has_k_shift = opt("self_attn.k_shift", &o.k_shift);
    o.has_v_shift = opt("self_attn.v_shift", &o.v_shift);
    lo_.push_back(o);
  }
  // Overlap buckets in backward order; each layer's tensors are contiguous,
  // from its input_layernorm to the next layer's (params.cpp). A pipeline
  // stage announces none (announces_ready_grads).
  const int L = plan_.staged ? 0 : m_.num_hidden_layers;
  buckets_.push_back({norm_off_, layout_.total});
  for (int l = L - 1; l >= 0; --l) buckets_.push_back({lo_[l].ln1, l + 1 < L ? lo_[l + 1].ln1 : norm_off_});
  buckets_.push_back({0, L > 0 ? lo_[0].ln1 : norm_off_});
  events_.resize(buckets_.size(), nullptr);
  for (auto& ev : events_) check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");

  // RoPE tables: the CPU function (one definition of HF's fp32 recipe).
  const size_t half = static_cast<size_t>(max_T_) * D / 2;
  std::vector<float> cos(half), sin(half);
  cpu::rope_tables(cos.data(), sin.data(), max_T_, D, rope_frequencies(m_));
  check(cudaMemcpyAsync(at<float>(plan_.rope_cos), cos.data(), half * sizeof(float), cudaMemcpyHostToDevice, stream_),
        "upload RoPE cos");
  check(cudaMemcpyAsync(at<float>(plan_.rope_sin), sin.data(), half * sizeof(float), cudaMemcpyHostToDevice, stream_),
        "upload RoPE sin");

  // AdamW chunk table: every chunk inside one tensor, with its flags.
  std::vector<cuda::AdamWChunk> chunks;
  const bool clamp = m_.kv_shift.enabled && m_.kv_shift.parametrization == ShiftParametrization::Clamp01;
  for (const ParamTensor& t : layout_.tensors) {
    uint32_t flags = t.decay() ? cuda::kAdamWDecay : 0u;
    if (t.kind == ParamKind::Shift && clamp) flags |= cuda::kAdamWClamp01;
    for (size_t b = 0; b < t.numel; b += cuda::kAdamWChunkElems)
      chunks.push_back({t.offset + b, t.offset + std::min(t.numel, b + cuda::kAdamWChunkElems), flags});
  }
  check(cudaMemcpyAsync(at<cuda::AdamWChunk>(plan_.chunks), chunks.data(), chunks.size() * sizeof(cuda::AdamWChunk),
                        cudaMemcpyHostToDevice, stream_),
        "upload AdamW chunks");
  chunk_table_ = chunks;  // kept for ZeRO-1's clipped tables
  plan_optimizer_ranges();

  const size_t N = static_cast<size_t>(max_B_) * max_T_;
  check(cudaMallocHost(&h_tokens_, (3 * N + 1) * sizeof(int32_t)), "cudaMallocHost");
  check(cudaMallocHost(&h_positions_, N * sizeof(int32_t)), "cudaMallocHost");
  check(cudaMallocHost(&h_sum_, sizeof(double)), "cudaMallocHost");
  if (m_.document_boundaries != DocumentBoundaries::None)
    check(cudaMallocHost(&h_docs_, N * sizeof(int32_t)), "cudaMallocHost");
  if (plan_.staged) check(cudaMallocHost(&h_stage_, N * d_.C * sizeof(uint16_t)), "cudaMallocHost");
  check(cudaStreamSynchronize(stream_), "engine set-up");
}

CudaEngine::~CudaEngine() { release(); }

void CudaEngine::release() {
  // A memset or an update still queued writes the memory freed below; so
  // does a ZeRO-1 gather on its communicator's stream.
  if (zero_stream_) cudaStreamSynchronize(zero_stream_);
  if (opt_stream_) cudaStreamSynchronize(opt_stream_);
  if (gather_watch_ && optimizer_in_flight()) cudaEventSynchronize(opt_events_.back());
  gather_watch_ = nullptr;
  linear_.reset();
  mm_.reset();
  attn_.reset();
  if (h_tokens_) cudaFreeHost(h_tokens_);
  if (h_positions_) cudaFreeHost(h_positions_);
  if (h_docs_) cudaFreeHost(h_docs_);
  if (h_sum_) cudaFreeHost(h_sum_);
  if (h_stage_) cudaFreeHost(h_stage_);
  if (base_) cudaFree(base_);
  if (moments_) cudaFree(moments_);
  if (master_) cudaFree(master_);
  if (fp32_buf_) cudaFree(fp32_buf_);
  for (cudaEvent_t ev : events_)
    if (ev) cudaEventDestroy(ev);
  for (cudaEvent_t ev : opt_events_)
    if (ev) cudaEventDestroy(ev);
  for (cudaEvent_t ev : {zero_after_, zero_done_, opt_after_})
    if (ev) cudaEventDestroy(ev);
  if (zero_stream_) cudaStreamDestroy(zero_stream_);
  if (opt_stream_) cudaStreamDestroy(opt_stream_);
  if (stream_) cudaStreamDestroy(stream_);
  h_tokens_ = nullptr;
  h_positions_ = nullptr;
  h_docs_ = nullptr;
  h_sum_ = nullptr;
  h_stage_ = nullptr;
  base_ = nullptr;
  moments_ = nullptr;
  moments_ready_ = false;
  master_ = nullptr;
  master_ready_ = false;
  fp32_buf_ = nullptr;
  fp32_held_.clear();
  events_.clear();
  zero_after_ = zero_done_ = nullptr;
  zero_stream_ = nullptr;
  zero_pending_ = false;
  opt_events_.clear();
  opt_ranges_.clear();
  opt_after_ = nullptr;
  opt_stream_ = nullptr;
  opt_joined_ = 0;
  stream_ = nullptr;
}

// ---------------------------------------------------------------- host copies

void CudaEngine::read_params_range(size_t begin, size_t n, float* host) const {
  KVS_CHECK(begin + n <= layout_.total, "read_params_range: [{}, {}) past the {} parameters", begin, begin + n,
            layout_.total);
  join_optimizer();
  ensure_master();
  if (!master_sharded_) {
    check(cudaMemcpyAsync(host, master_ + begin, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "read params");
    sync("read params");
    return;
  }
  // Sharded: the master's part, then the fp32 copies' (the same values where both hold them).
  const HeldPart h = held_part(begin, n, master_begin_, master_end_);
  size_t held = h.n;
  if (h.n)
    check(cudaMemcpyAsync(host + h.at, master_base() + begin + h.at, h.n * sizeof(float), cudaMemcpyDeviceToHost,
                          stream_),
          "read params");
  for (const Fp32Held& t : fp32_held_) {
    const HeldPart c = held_part(begin, n, t.offset, t.offset + t.n);
    if (!c.n) continue;
    check(cudaMemcpyAsync(host + c.at, fp32_buf_ + t.at + (begin + c.at - t.offset), c.n * sizeof(float),
                          cudaMemcpyDeviceToHost, stream_),
          "read params");
    held += c.n - held_part(begin + c.at, c.n, master_begin_, master_end_).n;
  }
  sync("read params");
  KVS_CHECK(held == n,
            "read_params_range: [{}, {}) is not all held here: with the fp32 master sharded (train.shard_master) this "
            "rank keeps [{}, {}) and the tensors read in fp32; ZeRO-1 gathers the rest from their owners",
            begin, begin + n, master_begin_, master_end_);
}
void CudaEngine::write_params_range(size_t begin, size_t n, const float* host) {
  KVS_CHECK(begin + n <= layout_.total, "write_params_range: [{}, {}) past the {} parameters", begin, begin + n,
            layout_.total);
  join_optimizer();
  ensure_master();
  if (!master_sharded_) {
    check(cudaMemcpyAsync(master_ + begin, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_), "write params");
    cuda::f32_to_bf16(at<bf16>(plan_.params16) + begin, master_ + begin, n, stream_);
    sync("write params");
    return;
  }
  // Sharded: the bf16 copy of all of it (rounded on the host, as
  // stage_upload does: the same round-to-nearest-even as f32_to_bf16 on the
  // device; no device buffer of the whole), the master's part and the fp32 copies' parts.
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < n; ++i) bits[i] = f32_to_bf16(host[i]);
  check(cudaMemcpyAsync(at<bf16>(plan_.params16) + begin, bits.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice,
                        stream_),
        "write params");
  const HeldPart h = held_part(begin, n, master_begin_, master_end_);
  if (h.n)
    check(cudaMemcpyAsync(master_base() + begin + h.at, host + h.at, h.n * sizeof(float), cudaMemcpyHostToDevice,
                          stream_),
          "write params");
  for (const Fp32Held& t : fp32_held_) {
    const HeldPart c = held_part(begin, n, t.offset, t.offset + t.n);
    if (c.n)
      check(cudaMemcpyAsync(fp32_buf_ + t.at + (begin + c.at - t.offset), host + c.at, c.n * sizeof(float),
                            cudaMemcpyHostToDevice, stream_),
            "write params");
  }
  sync("write params");  // before `bits` goes: a pageable copy may still read it
}
void CudaEngine::read_grads(float* host) const {
  join_optimizer();
  join_zeroing();
  check(cudaMemcpyAsync(host, at<float>(plan_.grads), layout_.total * sizeof(float), cudaMemcpyDeviceToHost, stream_),
        "read grads");
  sync("read grads");
}
// Only [opt_begin_, opt_end_) is held (keep_optimizer_range): zeros elsewhere on read.
void CudaEngine::read_optimizer_range(size_t begin, size_t n, float* m, float* v) const {
  KVS_CHECK(begin + n <= layout_.total, "read_optimizer_range: [{}, {}) past the {} parameters", begin, begin + n,
            layout_.total);
  join_optimizer();
  if (m) std::fill(m, m + n, 0.0f);
  if (v) std::fill(v, v + n, 0.0f);
  const HeldPart h = held_part(begin, n, opt_begin_, opt_end_);
  if (!moments_ready_ || !h.n) return;  // not allocated yet (zeros), or none of it held
  const size_t skip = begin + h.at - opt_begin_;
  if (m)
    check(cudaMemcpyAsync(m + h.at, exp_avg_base() + skip, h.n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "read exp_avg");
  if (v)
    check(cudaMemcpyAsync(v + h.at, exp_avg_sq_base() + skip, h.n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "read exp_avg_sq");
  sync("read optimizer state");
}
void CudaEngine::write_optimizer_range(size_t begin, size_t n, const float* m, const float* v) {
  KVS_CHECK(begin + n <= layout_.total, "write_optimizer_range: [{}, {}) past the {} parameters", begin, begin + n,
            layout_.total);
  join_optimizer();
  ensure_moments();
  const HeldPart h = held_part(begin, n, opt_begin_, opt_end_);
  if (!h.n) return;
  const size_t skip = begin + h.at - opt_begin_;
  if (m)
    check(cudaMemcpyAsync(exp_avg_base() + skip, m + h.at, h.n * sizeof(float), cudaMemcpyHostToDevice, stream_),
          "write exp_avg");
  if (v)
    check(cudaMemcpyAsync(exp_avg_sq_base() + skip, v + h.at, h.n * sizeof(float), cudaMemcpyHostToDevice, stream_),
          "write exp_avg_sq");
  sync("write optimizer state");
}
// 4 bytes per parameter written: 2.0 ms of the 1.5B step on an H100 when it
// ran on the engine's stream (the first two GPU profiles counted it as the
// batch's copy, the op after it). On zero_stream_ it overlaps the forward;
// the profile does not time it (an op's time there would run from the
// previous step's memset).
void CudaEngine::zero_grad() {
  check(cudaEventRecord(zero_after_, stream_), "cudaEventRecord");  // after whatever read the gradients
  check(cudaStreamWaitEvent(zero_stream_, zero_after_, 0), "cudaStreamWaitEvent");
  if (optimizer_in_flight())  // the update reads the gradients too
    check(cudaStreamWaitEvent(zero_stream_, opt_events_.back(), 0), "cudaStreamWaitEvent");
  check(cudaMemsetAsync(at<float>(plan_.grads), 0, layout_.total * sizeof(float), zero_stream_), "zero grads");
  check(cudaEventRecord(zero_done_, zero_stream_), "cudaEventRecord");
  zero_pending_ = true;
}

void CudaEngine::set_time_gemm_algorithms(bool on) { mm_->set_timed_algorithms(on); }

// The candidates run on the Matmul's own stream and scratch; the engine's
// work (an update or a ZeRO-1 gather still in flight) is waited for first,
// so they are timed on an otherwise idle GPU.
std::string CudaEngine::time_gemm_algorithms() {
  if (!mm_->has_new_shapes()) return {};  // the usual case: every step after the first
  join_optimizer();
  sync("timing GEMM algorithms");
  const cuda::Matmul::TimingReport r = mm_->time_new_shapes();
  std::string line;
  if (!r.chosen.empty()) {
    int other = 0, candidates = 0;
    double first = 0, best = 0;
    for (const cuda::Matmul::TimedChoice& c : r.chosen) {
      other += c.rank != 0;
      candidates = std::max(candidates, c.candidates);
      first += c.first_ms;
      best += c.best_ms;
    }
    line = fmt::format("GEMM algorithms timed for {} shapes (up to {} candidates each): {} of them take another "
                       "than cuBLASLt's first; their medians summed {:.2f} ms -> {:.2f} ms ({:.3f}x)",
                       r.chosen.size(), candidates, other, first, best, best > 0 ? first / best : 1.0);
  }
  if (!r.skipped.empty()) line += (line.empty() ? "" : "; ") + r.skipped;
  return line;
}

void CudaEngine::join_zeroing() const {
  if (!zero_pending_) return;
  check(cudaStreamWaitEvent(stream_, zero_done_, 0), "cudaStreamWaitEvent");
  zero_pending_ = false;
}

// Their users run on other streams: the memset and an update in flight are done on return.
float* CudaEngine::flat_grads() {
  if (zero_pending_ || optimizer_in_flight()) {
    join_optimizer();
    sync("flat grads");
  }
  return at<float>(plan_.grads);
}

float* CudaEngine::flat_params() {
  KVS_CHECK(!master_sharded_, "internal error: flat_params() with the fp32 master sharded (use flat_params16)");
  if (optimizer_in_flight() || !master_ready_) {  // an update in flight, or a first allocation's memset
    join_optimizer();
    ensure_master();
    sync("flat params");
  }
  return master_;
}

uint16_t* CudaEngine::flat_params16() {
  if (optimizer_in_flight()) {
    join_optimizer();
    sync("flat params16");
  }
  return reinterpret_cast<uint16_t*>(at<bf16>(plan_.params16));
}

Engine::ParamArrival CudaEngine::param_arrival() {
  join_optimizer();
  sync("param arrival");
  ParamArrival a;
  for (size_t i = 0; i < opt_ranges_.size(); ++i) {
    a.ends.push_back(opt_ranges_[i].end);
    a.events.push_back(opt_events_[i]);
  }
  return a;
}

void CudaEngine::params_arriving(dist::AsyncDeviceCollectives* watch) {
  KVS_CHECK(!optimizer_in_flight() && watch, "internal error: params_arriving with {}",
            watch ? "an update or a gather in flight" : "nothing to watch it by");
  opt_joined_ = -1;  // every range's event is pending
  gather_watch_ = watch;
}

std::vector<Engine::Fp32Copy> CudaEngine::fp32_copies() {
  KVS_CHECK(master_sharded_, "internal error: fp32_copies() with the fp32 master whole (keep_master_range first)");
  std::vector<Fp32Copy> out;
  for (const Fp32Held& t : fp32_held_) out.push_back({t.offset, t.n, fp32_buf_ + t.at});
  return out;
}

// ---------------------------------------------------------------- batch

void CudaEngine::upload_batch(const Batch& b, bool with_targets) {
  const size_t N = static_cast<size_t>(b.B) * b.T;
  // Pinned staging, so the copies are truly asynchronous; the stream is idle
  // here (every public call ends synchronised), so reusing it is safe.
  std::memcpy(h_tokens_, b.inputs, N * sizeof(int32_t));
  check(cudaMemcpyAsync(at<int32_t>(plan_.tokens), h_tokens_, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
        "upload tokens");
  if (with_targets) {
    check(cudaMemcpyAsync(at<int32_t>(plan_.targets), b.targets, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
          "upload targets");
    if (b.mask)
      check(cudaMemcpyAsync(at<float>(plan_.mask), b.mask, N * sizeof(float), cudaMemcpyHostToDevice, stream_),
            "upload mask");
  }
  cuda::profile::mark("copy: batch to the GPU", stream_);
  if (with_targets && !b.mask) cuda::fill_f32(at<float>(plan_.mask), 1.0f, N, stream_);
}

void CudaEngine::upload_documents(const Batch& b) {
  if (m_.document_boundaries == DocumentBoundaries::None) return;
  size_t rows = static_cast<size_t>(b.B) * b.T;
  // The stream is idle here (every public call ends synchronised): h_docs_ is free to refill.
  if (cp_.size == 1) {
    find_document_starts(b, m_.bos_token_id, h_docs_);
  } else {
    // This rank's rows (cp_rows' layout), each half in its own row
    // coordinates: a document begun in an earlier chunk starts below 0. The
    // shift reads them so (its halo rows are -W..-1), and ring attention
    // tells the flash kernels where each key chunk lies in them.
    const CpLayout& l = cp_layout_;
    cp_doc_full_.resize(rows);
    find_document_starts(b, m_.bos_token_id, cp_doc_full_.data());
    l.take(cp_doc_full_.data(), h_docs_, 1);
    rows = l.rows();
    for (int h = 0; h < 2; ++h)
      for (size_t i = h * rows / 2; i < (h + 1) * rows / 2; ++i) h_docs_[i] -= l.pos0(h);
  }
  check(cudaMemcpyAsync(at<int32_t>(plan_.doc), h_docs_, rows * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
        "upload document starts");
}

const int32_t* CudaEngine::shift_documents() const {
  return m_.document_boundaries == DocumentBoundaries::None ? nullptr : at<int32_t>(plan_.doc);
}

const int32_t* CudaEngine::attention_documents() const {
  return m_.document_boundaries == DocumentBoundaries::ShiftAndAttention ? at<int32_t>(plan_.doc) : nullptr;
}

CudaEngine::LayerCoefs CudaEngine::layer_coefs(int l, bool compute) {
  const LayerOffsets& o = lo_[l];
  const int Hq = d_.Hq, Hkv = d_.Hkv;
  const size_t W1 = static_cast<size_t>(m_.kv_shift.window) + 1;
  LayerCoefs c{nullptr, nullptr, nullptr};
  if (!m_.kv_shift.sigmoid_gate()) {
    if (o.has_q_shift) c.q = fp32_param(o.q_shift);
    if (o.has_k_shift) c.k = fp32_param(o.k_shift);
    if (o.has_v_shift) c.v = fp32_param(o.v_shift);
    return c;
  }
  float* eff = at<float>(plan_.coef + local_of_[l] * plan_.coef_stride);
  float* eq = eff;
  float* ek = eff + Hq * W1;
  float* ev = eff + (Hq + Hkv) * W1;
  if (o.has_q_shift) {
    if (compute) cuda::shift_gate_forward(eq, fp32_param(o.q_shift), Hq, stream_);
    c.q = eq;
  }
  if (o.has_k_shift) {
    if (compute) cuda::shift_gate_forward(ek, fp32_param(o.k_shift), Hkv, stream_);
    c.k = ek;
  }
  if (o.has_v_shift) {
    if (compute) cuda::shift_gate_forward(ev, fp32_param(o.v_shift), Hkv, stream_);
    c.v = ev;
  }
  return c;
}

// ---------------------------------------------------------------- forward

void CudaEngine::forward_layer(int l, int B, int T, LayerPass pass) {
  ProfileRange range(pass == LayerPass::Forward ? "forward layer" : "recompute layer", l);
  // This rank's sizes: under tensor parallelism its heads and FFN columns; Nl
  // rows of the residual stream (N / tp under sequence parallelism).
  const int N = B * T, C = d_.C, F = d_.F, Nl = static_cast<int>(region_->local_rows(N));
  const int Hq = d_.Hq, Hkv = d_.Hkv, D = d_.D;
  const int QD = d_.QD(), KD = d_.KD(), QKV = QD + 2 * KD, W = m_.kv_shift.window;
  const float eps = static_cast<float>(m_.rms_norm_eps);
  const CudaPlan& p = plan_;
  const bf16* P16 = at<bf16>(p.params16);
  const bool rope = m_.position_encoding == PositionEncoding::Rope;
  const float* cos = rope ? at<float>(p.rope_cos) : nullptr;
  const float* sin = rope ? at<float>(p.rope_sin) : nullptr;
  bf16* proj = at<bf16>(p.proj);
  const LayerOffsets& o = lo_[l];
  const int li = local_of_[l];  // among the held layers
  KVS_CHECK(li >= 0, "CUDA engine: layer {} is not held by this pipeline stage", l);
  join_optimizer(o.ln1);  // this layer's parameters updated (an overlapped AdamW)
  const CudaLayerActs x = p.layer(base_, li);
  // The forward computes the effective (gated) coefficients; recomputation reuses them.
  const LayerCoefs c = layer_coefs(l, pass == LayerPass::Forward);

  if (pass != LayerPass::RecomputeAttention) {
    // ln1 = norm(resid_l). In the forward, for l > 0, resid_l = res_mid_{l-1} +
    // down_proj output (in proj) is added here; recomputation starts from the
    // stored resid_l, whose normalisation gives the same bits. A chunk's
    // first layer (a pipeline stage's) starts from its stored input too.
    const bool chunk_start = li == 0 || part_.layers[li - 1] != l - 1;
    if (chunk_start || pass == LayerPass::RecomputeLayer) {
      cuda::residual_rmsnorm_forward(nullptr, x.ln1, x.rstd1, x.resid, nullptr, fp32_param(o.ln1), Nl, C, eps, stream_);
    } else {
      const bf16* prev_mid = p.layer(base_, li - 1).res_mid;
      cuda::residual_rmsnorm_forward(x.resid, x.ln1, x.rstd1, prev_mid, proj, fp32_param(o.ln1), Nl, C, eps, stream_);
    }
    {
      const kvs::profile::GemmLabel gemm_label("qkv proj");
      linear_->column_forward(x.qkv, QKV, x.ln1, C, P16 + o.wqkv, N, C, QKV);
    }
  }
  // Shift (before RoPE), then RoPE; V is shifted only. Each writes a contiguous tensor.
  if (cp_.size > 1) {
    cp_attention_forward(x, c, B);  // per chunk, with the halos; ring attention
  } else {
    const int32_t* doc = shift_documents();
    const auto vec = kShiftForwardVector;
    cuda::shift_rope_forward(x.qhat, QD, x.qkv, QKV, c.q, cos, sin, B, T, Hq, D, c.q ? W : 0, stream_, {}, vec,
                             kShiftWalk, doc);
    cuda::shift_rope_forward(x.khat, KD, x.qkv + QD, QKV, c.k, cos, sin, B, T, Hkv, D, c.k ? W : 0, stream_, {}, vec,
                             kShiftWalk, doc);
    cuda::shift_rope_forward(x.vhat, KD, x.qkv + QD + KD, QKV, c.v, nullptr, nullptr, B, T, Hkv, D, c.v ? W : 0,
                             stream_, {}, vec, kShiftWalk, doc);
    if (const int32_t* adoc = attention_documents())  // document masks: the flash backends
      attn_->forward_masked(x.attout, x.lse, x.qhat, QD, x.khat, x.vhat, KD, B, T, Hq, Hkv, D, true, {adoc, 0},
                            stream_);
    else
      attn_->forward(x.attout, x.lse, x.qhat, QD, x.khat, x.vhat, KD, B, T, Hq, Hkv, D, stream_);
  }
  if (pass == LayerPass::RecomputeAttention) return;
  {
    const kvs::profile::GemmLabel gemm_label("o proj");
    linear_->row_forward(proj, x.attout, QD, P16 + o.wo, N, QD, C);
  }
  cuda::residual_rmsnorm_forward(x.res_mid, x.ln2, x.rstd2, x.resid, proj, fp32_param(o.ln2), Nl, C, eps, stream_);
  {
    const kvs::profile::GemmLabel gemm_label("gate,up proj");
    linear_->column_forward(x.gate_up, 2 * F, x.ln2, C, P16 + o.wgu, N, C, 2 * F);
  }
  cuda::swiglu_forward(x.h, x.gate_up, N, F, stream_);
  // The backward does not need the down projection's output.
  if (pass == LayerPass::Forward) {
    const kvs::profile::GemmLabel gemm_label("down proj");
    linear_->row_forward(proj, x.h, F, P16 + o.wdown, N, F, C);
  }
}

void CudaEngine::forward_to_logits(int B, int T) {
  const int N = B * T, C = d_.C, V = d_.V, Nl = static_cast<int>(region_->local_rows(N));
  KVS_CHECK(Nl * tp_.size == N || !region_->sequence_parallel(),
            "engine: sequence parallelism needs micro-batch rows ({} x {}) divisible by tp ({})", B, T, tp_.size);
  const float eps = static_cast<float>(m_.rms_norm_eps);
  const CudaPlan& p = plan_;
  const bf16* P16 = at<bf16>(p.params16);
  join_optimizer(embed_off_);
  // Vocab-parallel embedding: each token's row lives on one rank, the others
  // write zeros; the sum over the group (sequence parallel: its rows of it).
  if (region_->sequence_parallel()) {
    cuda::embedding_forward_vocab_slice(at<bf16>(p.sp_full), at<int32_t>(p.tokens), P16 + embed_off_, N, C,
                                        d_.v_begin, d_.V, stream_);
    region_->scatter_sum_bf16(at<bf16>(p.sp_full), at<bf16>(p.resid), static_cast<size_t>(Nl) * C);
  } else {
    cuda::embedding_forward_vocab_slice(at<bf16>(p.resid), at<int32_t>(p.tokens), P16 + embed_off_, N, C,
                                        d_.v_begin, d_.V, stream_);
    region_->exit_forward(at<bf16>(p.resid), static_cast<size_t>(N) * C);
  }
  for (int l = 0; l < m_.num_hidden_layers; ++l) forward_layer(l, B, T);
  join_optimizer();  // the final norm and the LM head
  const int L = m_.num_hidden_layers;
  bf16* last = at<bf16>(p.resid + L * p.resid_stride);
  const bf16* mid = p.layer(base_, L - 1).res_mid;
  cuda::residual_rmsnorm_forward(last, at<bf16>(p.lnf), at<float>(p.rstdf), mid, at<bf16>(p.proj),
                                 fp32_param(norm_off_), Nl, C, eps, stream_);
  {
    const kvs::profile::GemmLabel gemm_label("lm head");
    linear_->column_forward(at<bf16>(p.logits), V, at<bf16>(p.lnf), C, P16 + lm_head_off_, N, C, V);
  }
}

// ---------------------------------------------------------------- backward

void CudaEngine::backward_from_dlogits(int B, int T) {
  join_zeroing();  // (the forward before it has waited for any update in flight)
  const int N = B * T, C = d_.C, V = d_.V, Nl = static_cast<int>(region_->local_rows(N));
  const CudaPlan& p = plan_;
  const bf16* P16 = at<bf16>(p.params16);
  float* G = at<float>(p.grads);
  bf16* dresid = at<bf16>(p.dresid);
  bf16* dln = at<bf16>(p.dln);
  const bf16* dlogits = at<bf16>(p.logits);  // written over the logits by the loss

  // LM head (column-parallel over the vocabulary) and final norm.
  {
    const kvs::profile::GemmLabel gemm_label("lm head");
    linear_->column_backward(dln, G + lm_head_off_, dlogits, V, at<bf16>(p.lnf), C, P16 + lm_head_off_, N, C, V);
  }
  const int L = m_.num_hidden_layers;
  cuda::rmsnorm_backward(dresid, norm_grad(norm_off_, 0), dln, nullptr, at<bf16>(p.resid + L * p.resid_stride),
                         fp32_param(norm_off_), at<float>(p.rstdf), Nl, C, at<float>(p.scratch), stream_);
  sum_norm_grads({norm_off_});
  grads_final(0);  // final norm and (untied) LM head
  for (int l = L - 1; l >= 0; --l) backward_layer(l, B, T);
  embedding_backward(N);
  grads_final(L + 1);  // the embedding (and a tied LM head)
}

void CudaEngine::embedding_backward(int N) {
  join_zeroing();
  const CudaPlan& p = plan_;
  float* G = at<float>(p.grads);
  bf16* dresid = at<bf16>(p.dresid);
  const int C = d_.C, Nl = static_cast<int>(region_->local_rows(N));
  // Embedding: positions grouped by token on the host (deterministic, no atomics).
  const int U = cuda::embedding_backward_plan(h_tokens_, N, h_tokens_ + N, h_tokens_ + 2 * N, h_positions_);
  // Under tensor parallelism this rank scatters only into its vocabulary rows:
  // the plan lists tokens by ascending id, so they are one run [u0, u1) of it,
  // renumbered to local rows (the offsets into `positions` stay absolute).
  int32_t* uniq = h_tokens_ + N;
  const int u0 = static_cast<int>(std::lower_bound(uniq, uniq + U, d_.v_begin) - uniq);
  const int u1 = static_cast<int>(std::lower_bound(uniq, uniq + U, d_.v_begin + d_.V) - uniq);
  for (int u = u0; u < u1; ++u) uniq[u] -= d_.v_begin;
  check(cudaMemcpyAsync(at<int32_t>(p.emb_uniq), h_tokens_ + N, U * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
        "upload embedding plan");
  check(cudaMemcpyAsync(at<int32_t>(p.emb_offsets), h_tokens_ + 2 * N, (U + 1) * sizeof(int32_t),
                        cudaMemcpyHostToDevice, stream_),
        "upload embedding plan");
  check(cudaMemcpyAsync(at<int32_t>(p.emb_positions), h_positions_, N * sizeof(int32_t), cudaMemcpyHostToDevice,
                        stream_),
        "upload embedding plan");
  cuda::profile::mark("copy: embedding plan to the GPU", stream_);
  const bf16* demb = dresid;  // sequence parallel: every rank's rows of it
  if (region_->sequence_parallel()) {
    region_->gather_bf16(dresid, at<bf16>(p.sp_full), static_cast<size_t>(Nl) * C);
    demb = at<bf16>(p.sp_full);
  }
  cuda::embedding_backward(G + embed_off_, demb, at<int32_t>(p.emb_uniq) + u0, at<int32_t>(p.emb_offsets) + u0,
                           at<int32_t>(p.emb_positions), u1 - u0, C, stream_);
}

void CudaEngine::backward_layer(int l, int B, int T) {
  ProfileRange range("backward layer", l);
  join_optimizer();
  join_zeroing();
  const int N = B * T, C = d_.C, F = d_.F, Nl = static_cast<int>(region_->local_rows(N));
  const int Hq = d_.Hq, Hkv = d_.Hkv, D = d_.D;
  const int QD = d_.QD(), KD = d_.KD(), QKV = QD + 2 * KD, W = m_.kv_shift.window;
  const size_t W1 = static_cast<size_t>(W) + 1;
  const CudaPlan& p = plan_;
  const int L = m_.num_hidden_layers;
  // Recompute what this layer did not keep (train.recompute). The last
  // layer's values are still in the single slots from the forward (not in a
  // pipeline stage, whose other micro-batches ran in between).
  const bool kept = l == L - 1 && !p.staged;
  if (p.rest_slots == 1 && !kept && recompute_ == Recompute::Full) {
    forward_layer(l, B, T, LayerPass::RecomputeLayer);
  } else if (p.attn_slots == 1 && !kept && recompute_ != Recompute::None) {
    forward_layer(l, B, T, LayerPass::RecomputeAttention);
  }
  const bf16* P16 = at<bf16>(p.params16);
  float* G = at<float>(p.grads);
  const bool rope = m_.position_encoding == PositionEncoding::Rope;
  const bool gated = m_.kv_shift.sigmoid_gate();
  const float* cos = rope ? at<float>(p.rope_cos) : nullptr;
  const float* sin = rope ? at<float>(p.rope_sin) : nullptr;
  float* scratch = at<float>(p.scratch);
  bf16* dresid = at<bf16>(p.dresid);  // d of the layer's output on entry, of its input on return
  bf16* dln = at<bf16>(p.dln);
  const LayerOffsets& o = lo_[l];
  const CudaLayerActs x = p.layer(base_, local_of_[l]);
  const LayerCoefs c = layer_coefs(l, false);  // computed by this step's forward

  // MLP: resid_{l+1} = res_mid + down(swiglu(gate_up(ln2))).
  bf16* dh = at<bf16>(p.dh);
  bf16* dgu = at<bf16>(p.dgate_up);
  {
    const kvs::profile::GemmLabel gemm_label("down proj");
    linear_->row_backward(dh, G + o.wdown, dresid, x.h, F, P16 + o.wdown, N, F, C);
  }
  cuda::swiglu_backward(dgu, dh, x.gate_up, N, F, stream_);
  {
    const kvs::profile::GemmLabel gemm_label("gate,up proj");
    linear_->column_backward(dln, G + o.wgu, dgu, 2 * F, x.ln2, C, P16 + o.wgu, N, C, 2 * F);
  }
  cuda::rmsnorm_backward(dresid, norm_grad(o.ln2, 0), dln, dresid, x.res_mid, fp32_param(o.ln2), x.rstd2, Nl, C,
                         scratch, stream_);

  // Attention: res_mid = resid_l + o_proj(attout); dresid is d res_mid.
  bf16* dattout = at<bf16>(p.dattout);
  bf16* dqhat = at<bf16>(p.dqhat);
  bf16* dkhat = at<bf16>(p.dkhat);
  bf16* dvhat = at<bf16>(p.dvhat);
  bf16* dqkv = at<bf16>(p.dqkv);
  {
    const kvs::profile::GemmLabel gemm_label("o proj");
    linear_->row_backward(dattout, G + o.wo, dresid, x.attout, QD, P16 + o.wo, N, QD, C);
  }
  if (cp_.size > 1) {
    cp_attention_backward(l, x, c, B);  // ring attention, then the shifts with the halos, into dqkv
  } else {
    if (const int32_t* adoc = attention_documents())
      attn_->backward_masked(dqhat, dkhat, dvhat, dattout, x.attout, x.lse, x.qhat, QD, x.khat, x.vhat, KD, B, T, Hq,
                             Hkv, D, true, {adoc, 0}, scratch, stream_);
    else
      attn_->backward(dqhat, dkhat, dvhat, dattout, x.attout, x.lse, x.qhat, QD, x.khat, x.vhat, KD, B, T, Hq, Hkv, D,
                      scratch, stream_);
    // Through RoPE and the shifts into the fused projection's gradient. The
    // coefficient gradients go straight into the gradient tensor, or for the
    // sigmoid gate into dcoef and then through the gate.
    float* dcoef = at<float>(p.dcoef);
    auto unshift = [&](bf16* dx, const bf16* dy, int ld_dy, const bf16* in, const float* coef, bool has, size_t goff,
                       const float* rc, const float* rs, int H) {
      float* dc = nullptr;
      if (has) {
        if (gated) {
          cuda::fill_f32(dcoef, 0.0f, static_cast<size_t>(H) * W1, stream_);
          dc = dcoef;
        } else {
          dc = G + goff;
        }
      }
      cuda::shift_rope_backward(dx, QKV, dc, dy, ld_dy, in, QKV, coef, rc, rs, B, T, H, D, has ? W : 0, scratch,
                                stream_, {}, kShiftBackwardVector, kShiftWalk,
                                shift_documents());
      if (has && gated) cuda::shift_gate_backward(G + goff, dcoef, fp32_param(goff), H, stream_);
    };
    unshift(dqkv, dqhat, QD, x.qkv, c.q, o.has_q_shift, o.q_shift, cos, sin, Hq);
    unshift(dqkv + QD, dkhat, KD, x.qkv + QD, c.k, o.has_k_shift, o.k_shift, cos, sin, Hkv);
    unshift(dqkv + QD + KD, dvhat, KD, x.qkv + QD + KD, c.v, o.has_v_shift, o.v_shift, nullptr, nullptr, Hkv);
  }
  {
    const kvs::profile::GemmLabel gemm_label("qkv proj");
    linear_->column_backward(dln, G + o.wqkv, dqkv, QKV, x.ln1, C, P16 + o.wqkv, N, C, QKV);
  }
  cuda::rmsnorm_backward(dresid, norm_grad(o.ln1, 1), dln, dresid, x.resid, fp32_param(o.ln1), x.rstd1, Nl, C, scratch,
                         stream_);
  sum_norm_grads({o.ln2, o.ln1});
  grads_final(L - l);  // every weight gradient of layer l is written
}

void CudaEngine::sync(const char* what) const {
  join_zeroing();
  if (gather_watch_) {  // the stream may be waiting for ZeRO-1's gather: bounded by its communicator's timeout
    gather_watch_->wait_for_stream(stream_, what);
    if (!optimizer_in_flight()) gather_watch_ = nullptr;  // every range joined, and the stream is idle
    return;
  }
  region_->wait(what);
}

float* CudaEngine::norm_grad(size_t offset, int i) {
  if (!region_->sequence_parallel()) return at<float>(plan_.grads) + offset;
  float* part = at<float>(plan_.norm_grads) + static_cast<size_t>(i) * d_.C;
  cuda::fill_f32(part, 0.0f, d_.C, stream_);
  return part;
}

void CudaEngine::sum_norm_grads(std::initializer_list<size_t> offsets) {
  if (!region_->sequence_parallel()) return;
  // Each rank's gains saw only its rows: the gradient is the sum over the
  // group, the same on every rank (the gains stay replicated).
  const size_t C = d_.C;
  float* parts = at<float>(plan_.norm_grads);
  region_->reduce_f32(parts, offsets.size() * C, dist::ReduceOp::Sum);
  size_t i = 0;
  for (size_t off : offsets) cuda::add_f32(at<float>(plan_.grads) + off, parts + C * i++, C, stream_);
}

void CudaEngine::grads_final(int i) {
  if (!hook_) return;
  check(cudaEventRecord(events_[i], stream_), "cudaEventRecord");
  hook_->grads_ready(buckets_[i].begin, buckets_[i].end, events_[i]);
}

double CudaEngine::device_sum_losses(size_t N) {
  cuda::sum_f32(at<double>(plan_.dsum), at<float>(plan_.losses), N, at<double>(plan_.dscratch), stream_);
  check(cudaMemcpyAsync(h_sum_, at<double>(plan_.dsum), sizeof(double), cudaMemcpyDeviceToHost, stream_), "loss sum");
  sync("step");
  return *h_sum_;
}

void CudaEngine::loss(int N, bool with_dlogits, float grad_scale, bool with_argmax) {
  ProfileRange range("loss");
  bf16* logits = at<bf16>(plan_.logits);
  bf16* dlogits = with_dlogits ? logits : nullptr;
  float* losses = at<float>(plan_.losses);
  int32_t* argmax = with_argmax ? at<int32_t>(plan_.argmax) : nullptr;
  const int32_t* targets = at<int32_t>(plan_.targets);
  const float* mask = at<float>(plan_.mask);
  if (tp_.size == 1) {
    cuda::cross_entropy_forward_backward(losses, dlogits, argmax, logits, targets, mask, N, m_.vocab_size, grad_scale,
                                         stream_);
    return;
  }
  // Vocab-parallel: every rank ends with the same token losses (and argmax).
  const int valid = std::clamp(d_.v_valid - d_.v_begin, 0, d_.V);
  const cuda::VocabCeStats st = cuda::VocabCeStats::at(at<float>(plan_.ce_stats), N);
  cuda::vocab_parallel_ce_local(st, logits, targets, mask, N, d_.V, valid, d_.v_begin, with_argmax, stream_);
  region_->reduce_f32(st.gmax, N, dist::ReduceOp::Max);
  cuda::vocab_parallel_ce_rescale(st, mask, N, d_.v_begin, stream_);
  region_->reduce_f32(st.sums, 2 * static_cast<size_t>(N), dist::ReduceOp::Sum);
  if (with_argmax) region_->reduce_f32(st.cand, N, dist::ReduceOp::Max);
  cuda::vocab_parallel_ce_finish(losses, dlogits, argmax, st, logits, targets, mask, N, d_.V, valid, d_.v_begin,
                                 grad_scale, stream_);
}

double CudaEngine::forward_backward(const Batch& b, double grad_scale) {
  KVS_CHECK(!plan_.staged, "engine: forward_backward needs the whole model (a pipeline stage runs stage_forward)");
  validate_batch(b, m_, max_B_, max_T_);
  KVS_CHECK(b.targets != nullptr, "engine: forward_backward needs targets");
  const Batch& lb = cp_rows(b);  // this rank's chunks under context parallelism
  upload_batch(lb, true);
  upload_documents(b);
  forward_to_logits(lb.B, lb.T);
  const int N = lb.B * lb.T;
  loss(N, true, static_cast<float>(grad_scale), false);
  backward_from_dlogits(lb.B, lb.T);
  const double sum = device_sum_losses(N);
  return cp_x_ ? cp_x_->sum(sum) : sum;
}

double CudaEngine::forward(const Batch& b, float* token_losses, int32_t* argmax, float* logits) {
  KVS_CHECK(!plan_.staged, "engine: forward needs the whole model (a pipeline stage runs stage_forward)");
  validate_batch(b, m_, max_B_, max_T_);
  KVS_CHECK(!logits || tp_.size == 1, "forward: full logits are not gathered under tensor parallelism");
  KVS_CHECK(!logits || cp_.size == 1, "forward: full logits are not gathered under context parallelism");
  if (cp_.size > 1) {
    const Batch& lb = cp_rows(b);
    upload_batch(lb, lb.targets != nullptr);
    upload_documents(b);
    forward_to_logits(lb.B, lb.T);
    if (!lb.targets) {
      sync("forward");
      return 0.0;
    }
    const int N = lb.B * lb.T;
    loss(N, false, 1.0f, argmax != nullptr);
    cp_gather_outputs(b, token_losses, argmax);
    return cp_x_->sum(device_sum_losses(N));
  }
  upload_batch(b, b.targets != nullptr);
  upload_documents(b);
  forward_to_logits(b.B, b.T);
  const size_t N = static_cast<size_t>(b.B) * b.T, V = m_.vocab_size;
  if (logits) {
    // bf16 -> fp32 on the host, in slices through the pinned staging buffer
    // (no fp32 logits buffer on the device).
    const bf16* src = at<bf16>(plan_.logits);
    const size_t slice = 3 * static_cast<size_t>(max_B_) * max_T_ * 2;  // uint16 values that fit in h_tokens_
    auto* stage = reinterpret_cast<uint16_t*>(h_tokens_);
    for (size_t i = 0; i < N * V; i += slice) {
      const size_t n = std::min(slice, N * V - i);
      check(cudaMemcpyAsync(stage, src + i, n * sizeof(bf16), cudaMemcpyDeviceToHost, stream_), "read logits");
      sync("read logits");
      for (size_t j = 0; j < n; ++j) logits[i + j] = bf16_to_f32(stage[j]);
    }
    // The staging buffer held the tokens: upload_batch will refill it next call.
  }
  if (!b.targets) {
    sync("forward");
    return 0.0;
  }
  loss(static_cast<int>(N), false, 1.0f, argmax != nullptr);
  if (token_losses)
    check(cudaMemcpyAsync(token_losses, at<float>(plan_.losses), N * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "read losses");
  if (argmax)
    check(cudaMemcpyAsync(argmax, at<int32_t>(plan_.argmax), N * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
          "read argmax");
  return device_sum_losses(N);
}

double CudaEngine::grad_norm() {
  join_optimizer();
  join_zeroing();
  cuda::sum_squares_f32(at<double>(plan_.dsum), at<float>(plan_.grads), layout_.total, at<double>(plan_.dscratch),
                        stream_);
  check(cudaMemcpyAsync(h_sum_, at<double>(plan_.dsum), sizeof(double), cudaMemcpyDeviceToHost, stream_), "grad norm");
  sync("grad norm");
  return std::sqrt(*h_sum_);
}

void CudaEngine::adamw_step(const AdamWHyper& hp) { adamw_update(hp, 0, layout_.total, overlap_optimizer_); }

void CudaEngine::adamw_step_range(const AdamWHyper& hp, size_t begin, size_t end) {
  adamw_update(hp, begin, end, false);
}

void CudaEngine::adamw_update(const AdamWHyper& hp, size_t begin, size_t end, bool overlap) {
  ProfileRange range("optimizer");
  KVS_CHECK(begin <= end && begin >= opt_begin_ && end <= opt_end_,
            "adamw_step_range: [{}, {}) outside the optimizer moments held, [{}, {})", begin, end, opt_begin_, opt_end_);
  KVS_CHECK(begin >= master_begin_ && end <= master_end_,
            "adamw_step_range: [{}, {}) outside the fp32 master held, [{}, {})", begin, end, master_begin_,
            master_end_);
  if (begin == end) return;
  join_optimizer();
  ensure_moments();
  ensure_master();
  join_zeroing();
  // The whole model uses the constructor's table; a shard, the same chunks
  // clipped to it (uploaded once: a rank's shard does not change).
  const cuda::AdamWChunk* table = at<cuda::AdamWChunk>(plan_.chunks);
  int count = plan_.num_chunks;
  if (begin != 0 || end != layout_.total) {
    if (range_count_ < 0 || range_begin_ != begin || range_end_ != end) {
      std::vector<cuda::AdamWChunk> clipped;
      for (const cuda::AdamWChunk& c : chunk_table_) {
        const uint64_t lo = std::max<uint64_t>(c.begin, begin), hi = std::min<uint64_t>(c.end, end);
        if (lo < hi) clipped.push_back({lo, hi, c.flags});
      }
      check(cudaMemcpyAsync(at<cuda::AdamWChunk>(plan_.range_chunks), clipped.data(),
                            clipped.size() * sizeof(cuda::AdamWChunk), cudaMemcpyHostToDevice, stream_),
            "upload AdamW shard chunks");
      sync("upload AdamW shard chunks");
      range_begin_ = begin;
      range_end_ = end;
      range_count_ = static_cast<int>(clipped.size());
    }
    table = at<cuda::AdamWChunk>(plan_.range_chunks);
    count = range_count_;
  }
  cuda::AdamWArgs a{};
  a.lr = static_cast<float>(hp.lr);
  a.beta1 = static_cast<float>(hp.beta1);
  a.beta2 = static_cast<float>(hp.beta2);
  a.eps = static_cast<float>(hp.eps);
  a.weight_decay = static_cast<float>(hp.weight_decay);
  a.bias_correction1 = static_cast<float>(1.0 - std::pow(hp.beta1, static_cast<double>(hp.step)));
  a.bias_correction2 = static_cast<float>(1.0 - std::pow(hp.beta2, static_cast<double>(hp.step)));
  a.grad_scale = static_cast<float>(hp.grad_scale);
  if (overlap && begin == 0 && end == layout_.total && !master_sharded_) {
    launch_overlapped_adamw(a);  // returns with the update in flight
    return;
  }
  // The kernel indexes the moments by flat element i like every other buffer;
  // ours start at opt_begin_, so it gets pointers shifted back by opt_begin_
  // (only elements of the table, all inside [opt_begin_, opt_end_), are touched).
  // The same for a sharded master.
  cuda::adamw_step(master_base(), at<bf16>(plan_.params16), at<float>(plan_.grads), exp_avg_base() - opt_begin_,
                   exp_avg_sq_base() - opt_begin_, table, count, a, stream_);
  // A sharded master: the kernels read the updated fp32 tensors from their copies.
  for (const Fp32Held& t : fp32_held_) {
    const HeldPart c = held_part(t.offset, t.n, begin, end);
    if (c.n)
      check(cudaMemcpyAsync(fp32_buf_ + t.at + c.at, master_base() + t.offset + c.at, c.n * sizeof(float),
                            cudaMemcpyDeviceToDevice, stream_),
            "refresh fp32 copies");
  }
  sync("AdamW step");
}

// The whole model's update (the moments of [0, total) held), range by range
// in the forward's order, each range's event after it; no wait here.
void CudaEngine::launch_overlapped_adamw(const cuda::AdamWArgs& a) {
  check(cudaEventRecord(opt_after_, stream_), "cudaEventRecord");  // after the gradients and their norm
  check(cudaStreamWaitEvent(opt_stream_, opt_after_, 0), "cudaStreamWaitEvent");
  cuda::profile::start(opt_stream_);  // a profile times the update, not the wait before it
  const cuda::AdamWChunk* table = at<cuda::AdamWChunk>(plan_.chunks);
  for (size_t i = 0; i < opt_ranges_.size(); ++i) {
    const OptRange& r = opt_ranges_[i];
    cuda::adamw_step(master_, at<bf16>(plan_.params16), at<float>(plan_.grads), exp_avg_base(),
                     exp_avg_sq_base(), table + r.chunk0, r.chunk1 - r.chunk0, a, opt_stream_);
    check(cudaEventRecord(opt_events_[i], opt_stream_), "cudaEventRecord");
  }
  opt_joined_ = -1;
}

void CudaEngine::plan_optimizer_ranges() {
  // The layout holds the embedding (if held), the held layers in order, each
  // from its input_layernorm on, then the head (params.cpp): the forward's order.
  std::vector<size_t> ends;
  for (int l = 0; l < m_.num_hidden_layers; ++l)
    if (local_of_[l] >= 0 && lo_[l].ln1 > 0) ends.push_back(lo_[l].ln1);
  if (part_.head && norm_off_ > 0) ends.push_back(norm_off_);
  ends.push_back(layout_.total);
  KVS_CHECK(std::is_sorted(ends.begin(), ends.end()), "CUDA engine: the parameter layout is not in forward order");
  ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
  size_t c = 0;
  for (size_t end : ends) {
    const size_t c0 = c;
    while (c < chunk_table_.size() && chunk_table_[c].end <= end) ++c;
    KVS_CHECK(c == chunk_table_.size() || chunk_table_[c].begin >= end,
              "CUDA engine: an AdamW chunk crosses the optimizer range boundary {}", end);
    opt_ranges_.push_back({end, static_cast<int>(c0), static_cast<int>(c)});
    cudaEvent_t ev = nullptr;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    opt_events_.push_back(ev);
  }
  opt_joined_ = static_cast<int>(opt_ranges_.size()) - 1;  // nothing in flight
}

void CudaEngine::join_optimizer(size_t offset) const {
  if (!optimizer_in_flight()) return;
  // The range holding `offset`: the first whose end is past it.
  const auto it = std::upper_bound(opt_ranges_.begin(), opt_ranges_.end(), offset,
                                   [](size_t x, const OptRange& r) { return x < r.end; });
  const int i = std::min(static_cast<int>(it - opt_ranges_.begin()), static_cast<int>(opt_ranges_.size()) - 1);
  if (i <= opt_joined_) return;
  check(cudaStreamWaitEvent(stream_, opt_events_[i], 0), "cudaStreamWaitEvent");
  opt_joined_ = i;
}

double CudaEngine::grad_sq_sum_range(size_t begin, size_t end) {
  KVS_CHECK(begin <= end && end <= layout_.total, "grad_sq_sum_range: [{}, {}) outside {} floats", begin, end,
            layout_.total);
  if (begin == end) return 0.0;
  join_optimizer();
  join_zeroing();
  cuda::sum_squares_f32(at<double>(plan_.dsum), at<float>(plan_.grads) + begin, end - begin,
                        at<double>(plan_.dscratch), stream_);
  check(cudaMemcpyAsync(h_sum_, at<double>(plan_.dsum), sizeof(double), cudaMemcpyDeviceToHost, stream_),
        "grad norm");
  sync("grad norm");
  return *h_sum_;
}

void CudaEngine::keep_optimizer_range(size_t begin, size_t end) {
  KVS_CHECK(begin <= end && begin >= opt_begin_ && end <= opt_end_,
            "keep_optimizer_range: [{}, {}) is not inside the moments held, [{}, {})", begin, end, opt_begin_, opt_end_);
  join_optimizer();
  if (!moments_ready_) {  // nothing held yet (all zeros): the shard is allocated on first use
    opt_begin_ = begin;
    opt_end_ = end;
    range_count_ = -1;
    return;
  }
  const size_t n = end - begin, skip = begin - opt_begin_;
  // Through the host, so that the old moments are freed before the shard is
  // allocated: the peak stays at the full moments, not full + shard.
  std::vector<float> host(2 * n);
  if (n > 0) {
    check(cudaMemcpyAsync(host.data(), exp_avg_base() + skip, n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "keep exp_avg");
    check(cudaMemcpyAsync(host.data() + n, exp_avg_sq_base() + skip, n * sizeof(float), cudaMemcpyDeviceToHost,
                          stream_),
          "keep exp_avg_sq");
  }
  sync("keep optimizer range");
  if (moments_) check(cudaFree(moments_), "cudaFree (ZeRO-1 moments)");
  moments_ = nullptr;
  float* kept = nullptr;
  if (n > 0) {
    check(cudaMalloc(&kept, 2 * n * sizeof(float)), "cudaMalloc (ZeRO-1 moments)");
    check(cudaMemcpy(kept, host.data(), 2 * n * sizeof(float), cudaMemcpyHostToDevice), "keep optimizer range");
    check(cudaDeviceSynchronize(), "keep optimizer range");  // a pageable copy's DMA may still be in flight
  }
  moments_ = kept;
  opt_begin_ = begin;
  opt_end_ = end;
  range_count_ = -1;
}

void CudaEngine::ensure_moments() {
  if (moments_ready_) return;
  const size_t n = opt_end_ - opt_begin_;
  if (n > 0) {
    void* p = nullptr;
    if (cudaMalloc(&p, 2 * n * sizeof(float)) != cudaSuccess) {
      fail("device 'cuda': cannot allocate the {:.2f} GiB of AdamW moments for {} parameters beside the {:.2f} GiB of "
           "weights, gradients and activations at micro-batch {} x {} ({:.2f} GiB free): shard them over more "
           "data-parallel ranks (ZeRO-1), lower train.micro_batch_size or train.seq_len, or set train.recompute",
           2.0 * n * sizeof(float) / 1073741824.0, n, plan_.total / 1073741824.0, max_B_, max_T_,
           free_gib_after_failed_malloc());
    }
    moments_ = static_cast<float*>(p);
    check(cudaMemsetAsync(moments_, 0, 2 * n * sizeof(float), stream_), "cudaMemset (AdamW moments)");
  }
  moments_ready_ = true;
}

void CudaEngine::reserve_optimizer_state() {
  join_optimizer();
  ensure_moments();
}

void CudaEngine::flat_params_written() {
  KVS_CHECK(!master_sharded_, "internal error: flat_params_written() with the fp32 master sharded");
  join_optimizer();
  ensure_master();
  cuda::f32_to_bf16(at<bf16>(plan_.params16), master_, layout_.total, stream_);
  sync("refresh bf16 parameters");
}

void CudaEngine::ensure_master() const {
  if (master_ready_) return;
  const size_t n = master_end_ - master_begin_;
  if (n > 0) {
    void* p = nullptr;
    if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) {
      fail("device 'cuda': cannot allocate the {:.2f} GiB of fp32 master weights for {} parameters beside the "
           "{:.2f} GiB of gradients, bf16 weights and activations at micro-batch {} x {} ({:.2f} GiB free): shard "
           "them over data-parallel ranks (ZeRO-1 with train.shard_master), lower train.micro_batch_size or "
           "train.seq_len, or set train.recompute",
           1.0 * n * sizeof(float) / 1073741824.0, n, plan_.total / 1073741824.0, max_B_, max_T_,
           free_gib_after_failed_malloc());
    }
    master_ = static_cast<float*>(p);
    check(cudaMemsetAsync(master_, 0, n * sizeof(float), stream_), "cudaMemset (fp32 master)");
  }
  master_ready_ = true;
}

const float* CudaEngine::fp32_param(size_t offset) const {
  if (!master_sharded_) {
    ensure_master();
    return master_ + offset;
  }
  const auto it = std::lower_bound(fp32_held_.begin(), fp32_held_.end(), offset,
                                   [](const Fp32Held& t, size_t x) { return t.offset < x; });
  KVS_CHECK(it != fp32_held_.end() && it->offset == offset,
            "internal error: the parameter at {} is read in fp32 but has no fp32 copy", offset);
  return fp32_buf_ + it->at;
}

void CudaEngine::keep_master_range(size_t begin, size_t end) {
  KVS_CHECK(begin <= end && end <= layout_.total, "keep_master_range: [{}, {}) outside the {} parameters", begin, end,
            layout_.total);
  if (master_sharded_) {
    KVS_CHECK(begin == master_begin_ && end == master_end_,
              "keep_master_range: the fp32 master is already sharded to [{}, {}), not [{}, {})", master_begin_,
              master_end_, begin, end);
    return;
  }
  join_optimizer();
  // The tensors the kernels read in fp32 (fp32_param), packed in layout order.
  std::vector<Fp32Held> held;
  size_t packed = 0;
  for (const ParamTensor& t : layout_.tensors)
    if (t.kind == ParamKind::Norm || t.kind == ParamKind::Shift) {
      held.push_back({t.offset, t.numel, packed});
      packed += t.numel;
    }
  const size_t n = end - begin;
  float* copies = nullptr;
  float* shard = nullptr;
  if (packed > 0) check(cudaMalloc(&copies, packed * sizeof(float)), "cudaMalloc (fp32 copies)");
  if (n > 0 && cudaMalloc(&shard, n * sizeof(float)) != cudaSuccess) {
    if (copies) cudaFree(copies);
    fail("device 'cuda': cannot allocate the {:.2f} GiB of this rank's fp32 master shard ({:.2f} GiB free)",
         1.0 * n * sizeof(float) / 1073741824.0, free_gib_after_failed_malloc());
  }
  if (master_ready_ && master_) {  // written already: keep its values (the whole master existed until now)
    if (n)
      check(cudaMemcpyAsync(shard, master_ + begin, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
            "keep master");
    for (const Fp32Held& t : held)
      check(cudaMemcpyAsync(copies + t.at, master_ + t.offset, t.n * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
            "keep master");
  } else {  // never written: zeros, as a whole master starts
    if (n) check(cudaMemsetAsync(shard, 0, n * sizeof(float), stream_), "cudaMemset (fp32 master)");
    if (packed) check(cudaMemsetAsync(copies, 0, packed * sizeof(float), stream_), "cudaMemset (fp32 copies)");
  }
  sync("keep master range");
  if (master_) check(cudaFree(master_), "cudaFree (fp32 master)");
  master_ = shard;
  master_ready_ = true;
  master_sharded_ = true;
  master_begin_ = begin;
  master_end_ = end;
  fp32_buf_ = copies;
  fp32_held_ = std::move(held);
}

}  // namespace kvs
#endif  // KVS_CUDA
