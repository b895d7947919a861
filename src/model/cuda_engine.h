// The CUDA engine: the same model as CpuEngine (cpu_engine.cpp), op for op,
// on one GPU with bf16 storage and fp32 accumulation (kernels/cuda/ops.h).
//
// Precision (docs/CUDA.md):
// - fp32 master weights, fp32 AdamW moments, fp32 parameter gradients (the
//   accumulation target of every weight-gradient GEMM, so gradient
//   accumulation over micro-batches adds in fp32, as Megatron's main grads);
// - a bf16 copy of every parameter, refreshed by the AdamW kernel, feeds the
//   matmuls and the embedding; the tiny tensors (RMSNorm gains, shift
//   coefficients) are read in fp32 from the master copy (fp32_param), or,
//   with the master sharded over ZeRO-1's ranks (keep_master_range), from
//   whole fp32 copies of them that every rank keeps;
// - activations and activation gradients in bf16; RMSNorm rstd, attention
//   log-sum-exp and token losses in fp32.
// Memory: one cudaMalloc in the constructor holds the bf16 parameters,
// gradients, activations and workspaces (CudaPlan); on first use, one holds
// the fp32 master weights and one the AdamW moments, each of the range this
// rank keeps (ZeRO-1's keep_master_range and keep_optimizer_range, called
// before, narrow them to a shard, so neither exists whole on such a rank);
// the step loop allocates nothing. Under tensor parallelism (docs/PARALLEL.md) the engine
// holds its rank's slice (LocalDims) and all-reduces as CpuEngine does, with
// the vocab-parallel loss of kernels/cuda/vocab_parallel_ce.h; with sequence
// parallelism (tp.sequence_parallel) the residual stream, the norms and their
// gradients hold this rank's N/tp rows as on the CPU engine (all-gathers and
// reduce-scatters in CudaParallelLinear, the norm gains' gradients summed over
// the group per layer). With context parallelism (cp.size > 1) the engine
// holds its two chunks of every sequence ([2][B][T/2cp] rows, CpLayout) and
// runs the shift's halo and ring attention of parallel/context_parallel.h on
// the device (model/cuda_engine_cp.cpp). Compiled only with -DKVS_CUDA=ON.
#pragma once
#ifdef KVS_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/attention_backend.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/ops.h"
#include "model/engine.h"
#include "parallel/context_parallel.h"
#include "parallel/cuda_cp_exchange.h"
#include "parallel/cuda_linear.h"
#include "parallel/cuda_tp_region.h"
#include "parallel/tensor_parallel.h"

namespace kvs {

// One layer's activations in the CUDA plan (device pointers; bf16 unless
// noted). Under recomputation layers share slots (CudaPlan::attn_slots,
// rest_slots): the pointers are then those of the shared slot.
struct CudaLayerActs {
  __nv_bfloat16* resid;  // the layer's input (always kept, one per layer)
  __nv_bfloat16 *res_mid, *ln1, *ln2, *qkv, *gate_up, *h;
  __nv_bfloat16 *qhat, *khat, *vhat, *attout;
  float *rstd1, *rstd2, *lse;
};

// The layers a plan is for: the whole model, or a pipeline stage's part
// (parallel/pipeline.h) with `slots` micro-batches in flight.
struct CudaStages {
  std::vector<int> chunk_of;  // [held layers]: the run of consecutive layers (chunk) each belongs to
  bool head = true;           // the final norm, LM head and loss are held
  int slots = 1;
  bool staged = false;  // run by stage_forward/stage_backward (a ModelPart), not forward_backward
  static CudaStages whole(const ModelConfig& m) { return {std::vector<int>(m.num_hidden_layers, 0), true, 1, false}; }
};

// Byte offsets of every buffer in the one device allocation. Per-layer
// activations sit at base + l * stride, sized for the largest micro-batch;
// l is the layer's index among the held ones (all of them for the whole model).
struct CudaPlan {
  size_t total = 0;  // bytes
  // parameters, each [layout.total]; the fp32 master and the moments are
  // separate allocations (CudaEngine::master_, moments_)
  size_t grads /* fp32 */, params16 /* bf16 */;
  // forward activations (bf16 unless noted), per layer
  size_t resid, res_mid, ln1, ln2, qkv, qhat, khat, vhat, attout, gate_up, h;
  size_t rstd1, rstd2, lse;  // fp32
  size_t resid_stride, ln_stride, qkv_stride, q_stride, kv_stride, ffn2_stride, ffn_stride;
  size_t rstd_stride, lse_stride;  // in bytes like every stride here
  // Activation recomputation (train.recompute): how many layers' worth of each
  // group is stored. "none": L and L; "attention": the attention outputs
  // (qhat, khat, vhat, attout, lse) get one slot, recomputed per layer in the
  // backward from the stored qkv; "full": every group but the layer inputs
  // (resid) gets one slot, and the backward recomputes the whole layer.
  int attn_slots = 0, rest_slots = 0;
  // once per step
  size_t lnf, rstdf /* fp32 */, logits, losses /* fp32 */, proj /* [N, C]: o_proj or down_proj output */;
  size_t coef /* fp32 effective coefficients, [L][(Hq + 2 Hkv)(W+1)] */, coef_stride;
  size_t rope_cos, rope_sin;  // fp32 [T, D/2]
  // backward scratch (bf16 unless noted), reused by every layer
  size_t dresid, dln, dh, dgate_up, dattout, dqhat, dkhat, dvhat, dqkv;
  size_t dcoef;        // fp32, one layer's effective-coefficient gradients
  size_t scratch;      // fp32 kernel scratch, scratch_floats
  size_t dscratch;     // fp64 reduction scratch, dscratch_doubles
  size_t dsum;         // fp64, one reduction result
  size_t scratch_floats = 0, dscratch_doubles = 0;
  // batch inputs
  size_t tokens, targets, mask /* fp32 */, emb_uniq, emb_offsets, emb_positions, argmax;
  // model.document_boundaries only: int32 [N], where each position's document starts (per slot)
  size_t doc = 0;
  size_t ce_stats = 0;  // fp32 vocab-parallel loss statistics (tp > 1 only), VocabCeStats::floats(N)
  // Sequence parallelism (sp > 1) only: two [N, C] bf16 buffers for gathered or
  // not-yet-scattered rows, and fp32 [2 C] for one layer's norm-gain gradients
  // before their sum over the group. The residual stream's buffers (resid,
  // res_mid, ln1, ln2, rstd1, rstd2, lnf, rstdf, proj, dresid, dln) hold N/sp rows.
  size_t sp_full = 0, sp_full2 = 0, norm_grads = 0;
  // Context parallelism (cp > 1) only, with Tc = T / (2 cp) and R = 2 B W rows:
  //   cp_tails [R][QKV] bf16: this rank's chunks' last W raw q/k/v rows;
  //   cp_halos [cp][R][QKV] bf16: every rank's (the halo all-gather);
  //   cp_dtails [R][QKV], cp_dhalos [cp][R][QKV] fp32: the same for the halo gradients;
  //   cp_ring[2]: the block in hand and the next, [k | v] bf16 ([2][B][Tc][KD]
  //     each) then [dk | dv] fp32 (same shape), cp_ring_bytes each;
  //   cp_acc fp32 [N][QD]: the merged output (forward), dq (backward);
  //   cp_part bf16 [B Tc][QD], cp_part_lse fp32 [B][Hq][Tc]: one block's
  //     output and lse (forward), its dq (backward); cp_dk, cp_dv bf16 [B Tc][KD].
  size_t cp_tails = 0, cp_halos = 0, cp_dtails = 0, cp_dhalos = 0, cp_ring[2] = {0, 0}, cp_ring_bytes = 0;
  size_t cp_acc = 0, cp_part = 0, cp_part_lse = 0, cp_dk = 0, cp_dv = 0;
  // AdamW chunk tables: every tensor (num_chunks), and the same clipped to a
  // ZeRO-1 shard (range_chunks, at most num_chunks entries)
  size_t chunks, range_chunks;
  int num_chunks = 0;

  // Pipeline stages (CudaStages): resid_index[l] is held layer l's input
  // entry in resid, its output the next entry (each chunk ends in one more).
  // Every buffer one micro-batch keeps from its forward to its backward (the
  // layer inputs, the groups not recomputed, the head's outputs, the batch) is
  // there `slots` times: slot_fields lists them with their bytes per slot, and
  // in_slot(s) is the plan of slot s. dstage and stage_rstd (staged only):
  // the input gradient a backward leaves for the previous stage (bf16 [N, C]),
  // and the discarded rstd of a chunk's last residual add (fp32 [N]).
  std::vector<int> resid_index;
  int slots = 1;
  bool staged = false;
  size_t dstage = 0, stage_rstd = 0;
  std::vector<std::pair<size_t CudaPlan::*, size_t>> slot_fields;
  CudaPlan in_slot(int s) const;

  // Layer l's activations inside the allocation at `base`.
  CudaLayerActs layer(char* base, int l) const;

  // d: this rank's sizes (the whole model at tp = 1); tp: the group size; sp:
  // the ranks the residual stream is split over (tp under sequence parallelism, else 1).
  // cp: the context-parallel group size (the activations then hold B T / cp rows).
  static CudaPlan build(const ModelConfig& m, const LocalDims& d, int tp, const ParamLayout& layout, int B, int T,
                        Recompute recompute = Recompute::None, int sp = 1, int cp = 1);
  static CudaPlan build(const ModelConfig& m, const LocalDims& d, int tp, const ParamLayout& layout, int B, int T,
                        Recompute recompute, const CudaStages& stages, int sp = 1, int cp = 1);
};

class CudaEngine : public Engine {
 public:
  // attention_backend (train.attention_backend): "flash" or "cudnn" (attention_backend.h).
  CudaEngine(const ModelConfig& m, int max_batch, int max_seq_len, int device = 0,
             Recompute recompute = Recompute::None, AttentionImpl attention_backend = AttentionImpl::Flash,
             TensorParallel tp = {}, ContextParallel cp = {}, const ModelPart* part = nullptr, int slots = 1);
  ~CudaEngine() override;
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  const ModelConfig& model_config() const override { return m_; }
  const ParamLayout& layout() const override { return layout_; }
  int max_batch() const override { return max_B_; }
  int max_seq_len() const override { return max_T_; }

  void read_params_range(size_t begin, size_t n, float* host) const override;
  void write_params_range(size_t begin, size_t n, const float* host) override;
  void read_grads(float* host) const override;
  void read_optimizer_range(size_t begin, size_t n, float* exp_avg, float* exp_avg_sq) const override;
  void write_optimizer_range(size_t begin, size_t n, const float* exp_avg, const float* exp_avg_sq) override;

  void zero_grad() override;
  // train.overlap_optimizer (default on): adamw_step returns with the update
  // still running on a stream of its own, and the next forward waits for each
  // layer's parameters just before it uses them (docs/CUDA.md "The step on the GPU").
  void set_overlap_optimizer(bool on) override { overlap_optimizer_ = on; }
  // cuda::Matmul::set_timed_algorithms / time_new_shapes, after every stream is done.
  void set_time_gemm_algorithms(bool on) override;
  std::string time_gemm_algorithms() override;
  cudaStream_t stream() const { return stream_; }  // the engine's stream (tests)
  double forward_backward(const Batch& b, double grad_scale) override;
  double forward(const Batch& b, float* token_losses, int32_t* argmax, float* logits) override;
  // One decoder layer of the current micro-batch, as CpuEngine::forward_layer /
  // backward_layer (enqueued on the engine's stream). backward_layer first
  // recomputes what train.recompute did not keep of the layer.
  void forward_layer(int l, int B, int T) { forward_layer(l, B, T, LayerPass::Forward); }
  void backward_layer(int l, int B, int T);
  double grad_norm() override;
  void adamw_step(const AdamWHyper& h) override;

  // ZeRO-1 on device buffers (engine.h): flat_params()/flat_grads() are GPU
  // pointers; every call returns with the engine's stream idle.
  bool supports_sharded_step() const override { return true; }
  bool flat_on_device() const override { return true; }
  float* flat_params() override;
  // The fp32 master sharded too (train.shard_master; engine.h).
  bool supports_sharded_master() const override { return true; }
  bool master_sharded() const override { return master_sharded_; }
  void keep_master_range(size_t begin, size_t end) override;
  uint16_t* flat_params16() override;
  std::vector<Fp32Copy> fp32_copies() override;
  // The gather's ranges and events are the overlapped AdamW's (opt_ranges_, opt_events_).
  ParamArrival param_arrival() override;
  void params_arriving(dist::AsyncDeviceCollectives* watch) override;
  float* flat_grads() override;
  void flat_params_written() override;
  double grad_sq_sum_range(size_t begin, size_t end) override;
  void adamw_step_range(const AdamWHyper& h, size_t begin, size_t end) override;
  void keep_optimizer_range(size_t begin, size_t end) override;
  void reserve_optimizer_state() override;
  bool announces_ready_grads() const override { return !plan_.staged; }
  void set_grad_ready_hook(GradReadyHook* hook) override { hook_ = hook; }

  // Pipeline stages (cuda_engine_stage.cpp; Engine, engine.h): the engine
  // built with a ModelPart runs one chunk of one micro-batch in one slot at a
  // time. The activations between stages are the bf16 residual stream (this
  // rank's rows of it under context and sequence parallelism): the
  // engine's own device buffers (stage_device_buffer) for a communicator that
  // takes device memory, else host fp32 arrays staged through pinned memory
  // (bf16 -> fp32 -> bf16 is exact).
  int chunks() const override { return static_cast<int>(chunks_.size()); }
  int slots() const override { return plan_.slots; }
  size_t stage_floats(const Batch& b) const override;
  double stage_forward(int slot, int chunk, const Batch& b, const float* input, float* output, double grad_scale,
                       float* token_losses = nullptr, int32_t* argmax = nullptr) override;
  void stage_backward(int slot, int chunk, const float* doutput, float* dinput) override;
  bool stage_on_device() const override { return plan_.staged; }
  DeviceBuffer stage_device_buffer(int slot, int chunk, StageTensor which, const Batch& b) override;

 private:
  template <class T>
  T* at(size_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }
  // Waits for the stream (every public call ends with it idle; only an
  // overlapped AdamW may still run on opt_stream_); bounded by the NCCL
  // timeout when tensor-parallel all-reduces may be on it (CudaTpRegion::wait).
  void sync(const char* what) const;
  // zero_grad's memset runs on zero_stream_ (lowest priority), overlapping
  // the forward, which does not touch the gradients; everything that does
  // touches them after join_zeroing, which orders the engine's stream after
  // the memset (sync joins too, so every public call still ends idle).
  void join_zeroing() const;
  // An overlapped AdamW (adamw_step) runs on opt_stream_ in layout order, one
  // launch per range of opt_ranges_ (the parameters before the first held
  // layer, each held layer's, the head's), each followed by its event.
  // join_optimizer(offset) orders the engine's stream after the update of the
  // range holding parameter `offset` (and so of every range before it): the
  // forward calls it before it first reads a range. join_optimizer() waits for
  // all of it: every other public call that touches the parameters, moments
  // or gradients calls it first (zero_grad orders its memset after it).
  // ZeRO-1's overlapped gather (params_arriving) uses the same ranges and
  // events, recorded on its communicator's stream instead.
  void join_optimizer(size_t offset) const;
  void join_optimizer() const { join_optimizer(layout_.total - 1); }
  bool optimizer_in_flight() const { return opt_joined_ + 1 < static_cast<int>(opt_ranges_.size()); }
  // The overlap's ranges and their AdamW chunks (after the chunk table is built).
  void plan_optimizer_ranges();
  void launch_overlapped_adamw(const cuda::AdamWArgs& a);
  // adamw_step (overlap: train.overlap_optimizer) and adamw_step_range (never overlapped).
  void adamw_update(const AdamWHyper& hp, size_t begin, size_t end, bool overlap);
  // The constructor's work, and what undoes it (also after a partial init).
  void init(int device, AttentionImpl attention_backend);
  void release();
  void upload_batch(const Batch& b, bool with_targets);
  // model.document_boundaries: find_document_starts into the slot's plan_.doc,
  // for b's whole sequences (under context parallelism after cp_rows(b): this
  // rank's rows, each half in its own row coordinates).
  void upload_documents(const Batch& b);
  const int32_t* shift_documents() const;      // null without document boundaries
  const int32_t* attention_documents() const;  // null unless "shift_and_attention"
  // The masked loss (and dlogits over the logits when grad_scale is given,
  // argmax when asked) for the N rows of this micro-batch: the fused kernel,
  // or the vocab-parallel one with its all-reduces under tensor parallelism.
  void loss(int N, bool with_dlogits, float grad_scale, bool with_argmax);
  void forward_to_logits(int B, int T);
  // What forward_layer computes: the whole layer in the forward pass (the
  // residual add from the previous layer fused in front); the layer again from
  // its stored input before its backward ("full"); or only the attention
  // outputs from the stored qkv ("attention").
  enum class LayerPass { Forward, RecomputeLayer, RecomputeAttention };
  void forward_layer(int l, int B, int T, LayerPass pass);
  void backward_from_dlogits(int B, int T);
  // Where rmsnorm_backward accumulates a norm gain's gradient: the gradient
  // tensor itself, or under sequence parallelism plan_.norm_grads + i * C
  // (i = 0, 1), which sum_norm_grads then sums over the group into the tensors.
  float* norm_grad(size_t offset, int i);
  void sum_norm_grads(std::initializer_list<size_t> offsets);
  // The embedding's gradient from dresid, for the N tokens in h_tokens_.
  void embedding_backward(int N);
  // Pipeline stages (cuda_engine_stage.cpp): the held layers and their
  // chunks from `part` (null: the whole model), before the plan is built.
  void take_part(const ModelPart* part);
  void use_slot(int slot);  // plan_ becomes slot `slot`'s (plan0_.in_slot)
  __nv_bfloat16* chunk_input(const CudaPlan& p, int chunk) const;
  __nv_bfloat16* chunk_output(const CudaPlan& p, int chunk) const;
  // Host fp32 <-> device bf16 through the pinned h_stage_ (the MPI path).
  void stage_upload(__nv_bfloat16* dst, const float* src, size_t n);
  void stage_download(float* dst, const __nv_bfloat16* src, size_t n);
  double device_sum_losses(size_t N);
  // Effective q/k/v shift coefficients of layer l (fp32, device); null if that
  // tensor is not shifted. Applies the sigmoid gate into the plan's coef slice.
  struct LayerCoefs {
    const float *q, *k, *v;
  };
  LayerCoefs layer_coefs(int l, bool compute);
  // Context parallelism (cuda_engine_cp.cpp). cp_rows: the batch's rows this
  // rank holds (cp_batch_, over cp_inputs_...; b itself at cp = 1).
  const Batch& cp_rows(const Batch& b);
  // Token losses and argmax of the whole batch from every rank's rows (device -> host).
  void cp_gather_outputs(const Batch& b, float* token_losses, int32_t* argmax);
  // The shift's halo: every rank's chunks' last W raw q/k/v rows of layer x into cp_halos.
  void cp_gather_halos(const CudaLayerActs& x, int B);
  // One layer's shift + RoPE per chunk with the halos, then ring attention.
  void cp_attention_forward(const CudaLayerActs& x, const LayerCoefs& c, int B);
  // Its backward from dattout into dqkv (and the shift coefficients' gradients).
  void cp_attention_backward(int l, const CudaLayerActs& x, const LayerCoefs& c, int B);
  // Bucket `i` of buckets_ is final: record its event, tell the hook (if any).
  void grads_final(int i);
  // Allocates and zeroes the moments of [opt_begin_, opt_end_) if not yet done;
  // a one-line error with their size when they do not fit.
  void ensure_moments();
  // Allocates and zeroes the fp32 master of [master_begin_, master_end_) if not yet done.
  void ensure_master() const;
  // The master of element i (valid for master_begin_ <= i < master_end_, after ensure_master).
  float* master_base() const { return master_ - master_begin_; }
  // A tensor the kernels read in fp32 (a norm gain or shift coefficients),
  // by its layout offset: from the master, or its copy when the master is sharded.
  const float* fp32_param(size_t offset) const;
  // The moments of element i (valid for opt_begin_ <= i < opt_end_, after ensure_moments).
  float* exp_avg_base() const { return moments_; }
  float* exp_avg_sq_base() const { return moments_ + (opt_end_ - opt_begin_); }

  ModelConfig m_;
  TensorParallel tp_;
  ContextParallel cp_;
  std::unique_ptr<CudaCpExchange> cp_x_;  // cp > 1: the group's transfers
  CpLayout cp_layout_;                    // the current micro-batch's rows (cp > 1)
  Batch cp_batch_{};
  std::vector<int32_t> cp_inputs_, cp_targets_;
  std::vector<int32_t> cp_doc_full_;  // document starts of the whole sequences (upload_documents)
  std::vector<float> cp_mask_, cp_gather_;
  // Pipeline stages: the held layers (all of them without a part), each
  // layer's index among them (-1: not held) and the chunks (runs of
  // consecutive held layers, with the embedding before the model's first layer
  // and the head after its last).
  ModelPart part_;
  std::vector<int> local_of_;
  struct StageChunk {
    int first, last;  // local layer indices
    bool embedding, head;
  };
  std::vector<StageChunk> chunks_;
  CudaStages stages_;
  CudaPlan plan0_;                                // slot 0's plan (plan_ is the slot in use)
  std::vector<std::vector<int32_t>> slot_tokens_;  // [slot]: the embedding chunk's tokens, for its backward
  std::vector<std::pair<int, int>> slot_shape_;    // [slot]: B, T of this rank's rows of its micro-batch (T / cp)
  uint16_t* h_stage_ = nullptr;                    // pinned bf16 [N_max, C] (host activations)
  LocalDims d_;  // this rank's sizes (LocalDims::of; the whole model at tp = 1)
  ParamLayout layout_;
  int max_B_, max_T_;
  Recompute recompute_;
  CudaPlan plan_;
  char* base_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t zero_stream_ = nullptr;
  cudaEvent_t zero_after_ = nullptr, zero_done_ = nullptr;  // the memset's start (on stream_) and end
  mutable bool zero_pending_ = false;
  // The overlapped optimizer (join_optimizer): opt_stream_ has the highest
  // priority, since the forward waits for it; opt_after_ starts the update
  // after the gradients (on stream_).
  bool overlap_optimizer_ = true;
  cudaStream_t opt_stream_ = nullptr;
  cudaEvent_t opt_after_ = nullptr;
  struct OptRange {
    size_t end;          // the range is [previous range's end, end) of the layout
    int chunk0, chunk1;  // its entries [chunk0, chunk1) of the AdamW chunk table
  };
  std::vector<OptRange> opt_ranges_;
  std::vector<cudaEvent_t> opt_events_;  // [range]: recorded after its update (or ZeRO-1's gather of it)
  mutable int opt_joined_ = 0;           // ranges [0, opt_joined_] are ordered before stream_'s next work
  // ZeRO-1's gather in flight (params_arriving): sync() polls through it,
  // until every range is joined and the stream is idle.
  mutable dist::AsyncDeviceCollectives* gather_watch_ = nullptr;
  std::unique_ptr<cuda::Matmul> mm_;
  std::unique_ptr<CudaTpRegion> region_;        // the TP group's sums (no-ops at tp = 1)
  std::unique_ptr<CudaParallelLinear> linear_;  // column/row-parallel GEMMs through mm_ and region_
  std::unique_ptr<cuda::AttentionBackend> attn_;  // flash or cuDNN SDPA; built for max_B_ x max_T_
  // Tensor offsets (in elements) into the flat parameter buffers, per layer.
  struct LayerOffsets {
    size_t ln1, wqkv, wo, q_shift, k_shift, v_shift, ln2, wgu, wdown;
    bool has_q_shift, has_k_shift, has_v_shift;
  };
  std::vector<LayerOffsets> lo_;
  size_t embed_off_ = 0, norm_off_ = 0, lm_head_off_ = 0;
  // Pinned host staging for batch uploads and result downloads.
  int32_t* h_tokens_ = nullptr;  // [3 * N_max + 1]: tokens, uniq, offsets
  int32_t* h_docs_ = nullptr;    // [N_max]: document starts, staged (document boundaries only)
  int32_t* h_positions_ = nullptr;
  double* h_sum_ = nullptr;
  // AdamW moments of [opt_begin_, opt_end_) only: exp_avg, then exp_avg_sq.
  // Allocated on first use (ensure_moments), so that a rank whose ZeRO-1
  // shard is set first (keep_optimizer_range) never holds the full moments.
  float* moments_ = nullptr;
  bool moments_ready_ = false;
  // The fp32 master of [master_begin_, master_end_) (all of it unless
  // sharded), allocated on first use like the moments. Sharded: fp32_buf_
  // packs whole copies of the tensors read in fp32, fp32_held_ in layout order.
  mutable float* master_ = nullptr;
  mutable bool master_ready_ = false;
  bool master_sharded_ = false;
  size_t master_begin_ = 0, master_end_ = 0;
  struct Fp32Held {
    size_t offset, n, at;  // the tensor in the layout; its copy at fp32_buf_ + at
  };
  std::vector<Fp32Held> fp32_held_;
  float* fp32_buf_ = nullptr;
  size_t opt_begin_ = 0, opt_end_ = 0;
  std::vector<cuda::AdamWChunk> chunk_table_;  // host copy of plan_.chunks
  size_t range_begin_ = 0, range_end_ = 0;     // what plan_.range_chunks holds
  int range_count_ = -1;                       // -1: nothing uploaded yet
  // Overlap: contiguous layout ranges in backward order (tail = final norm and
  // LM head, then layers L-1..0, then the embedding), one event each.
  struct Bucket {
    size_t begin, end;
  };
  std::vector<Bucket> buckets_;
  std::vector<cudaEvent_t> events_;
  GradReadyHook* hook_ = nullptr;
};

}  // namespace kvs
#endif  // KVS_CUDA
