// The CPU reference engine: fp32 everywhere, ops from kernels/cpu, one
// activation buffer planned in the constructor (see ActivationPlan).
#pragma once
#include <memory>
#include <vector>

#include "core/huge_pages.h"
#include "model/cpu_block.h"
#include "model/engine.h"
#include "parallel/context_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_region.h"

namespace kvs {

// Sizes of every forward activation and backward scratch buffer, as slices
// of one allocation. Per-layer tensors are stored at a stride sized for the
// largest micro-batch, so smaller batches reuse the same plan. Sizes are
// those of one tensor-parallel rank (LocalDims; the whole model at tp = 1),
// for the layers the engine holds (all, or a pipeline stage's), indexed by
// their position li among them.
struct ActivationPlan {
  size_t total = 0;  // floats
  // forward, per held layer li at base + li * stride; the residual stream at
  // base + resid_index[li] * resid_stride (the layer's input; its output is the
  // next entry: one more per run of consecutive layers, a pipeline chunk)
  size_t resid, res_mid, ln1, rstd1, q, k, v, khat, vhat, att, attout, ln2, rstd2, gate_up, h;
  size_t resid_stride, res_mid_stride, ln_stride, rstd_stride, q_stride, kv_stride, att_stride, ffn_stride;
  std::vector<int> resid_index;
  // kv_shift.shift_q: the raw q projection (q holds the shifted, rotated q); 0 floats otherwise.
  size_t qraw, qraw_stride;
  // Sequence parallelism: resid, res_mid, ln1/2, rstd1/2, lnf, rstdf, dresid
  // and dln hold N/tp rows; sp_full and sp_full2 are [N, C] scratch for the
  // gathered or not-yet-scattered rows, norm_grads [2 layers + 1, C] the norm
  // gains' gradients of one backward before they are summed over the TP group.
  size_t sp_full = 0, sp_full2 = 0, norm_grads = 0;
  // Effective shift coefficients per layer, [Hq | Hkv | Hkv] x (W+1) for q, k, v
  // (parametrization "sigmoid_gate": computed from the stored gate logits).
  size_t coef, coef_stride;
  // forward, once (the head's only on the engine that holds the head)
  size_t lnf, rstdf, logits, losses, rope_cos, rope_sin;
  // backward scratch, reused by every layer
  size_t dresid, dln, dh, dgate_up, dattout, dq, dq_pre, dkhat, dks, dk, dvhat, dv;
  size_t dqs;    // d raw q under shift_q
  size_t dcoef;  // d effective coefficients of one layer (coef_stride floats)
  bool v_shifted = false;  // without a V shift attention reads v itself (no vhat buffer is used)

  // chunk_of[li]: the run of consecutive held layers layer li belongs to (all
  // 0 for the whole model); head: the final norm, LM head and loss are held.
  // sp_ranks: the TP size under sequence parallelism, else 1; cp: the
  // context-parallel size (the rows are then B x T / cp, att the ring's blocks).
  static ActivationPlan build(const ModelConfig& m, const LocalDims& d, int B, int T, int sp_ranks, int cp,
                              const std::vector<int>& chunk_of, bool head);
  // The whole model.
  static ActivationPlan build(const ModelConfig& m, const LocalDims& d, int B, int T, int sp_ranks = 1, int cp = 1);
  // Held layer li's activations and the shared backward scratch inside the buffer at `base`.
  LayerActs layer(float* base, int li) const;
  LayerScratch scratch(float* base) const;
};

// With tensor parallelism (tp.size > 1) the engine holds its rank's slice of
// the model (ParamLayout::build(m, tp.rank, tp.size)) and every rank of the
// TP group calls forward/forward_backward together on the same batch: the
// all-reduces of Megatron's column/row-parallel layers and the
// vocab-parallel embedding and cross-entropy run inside (docs/PARALLEL.md).
// Gradients and the norms of grad_norm/grad_sq_sum_range are then local.
// With pipeline parallelism the engine holds a ModelPart (parallel/pipeline.h):
// some layers, in chunks of consecutive ones, and maybe the embedding and the
// head; stage_forward/stage_backward run one micro-batch through one chunk
// in one of `slots` activation buffers (the micro-batches a schedule keeps in
// flight), and forward_backward/forward need the whole model.
// With context parallelism (cp.size > 1) every rank of the CP group is given
// the same whole micro-batch and computes its two chunks of every sequence
// (parallel/context_parallel.h); forward and forward_backward return the
// loss of the whole micro-batch on every rank and forward's per-token outputs
// cover it whole, but the gradients are this rank's share: the caller sums
// them over the CP group (as over data-parallel ranks).
class CpuEngine : public Engine {
 public:
  CpuEngine(const ModelConfig& m, int max_batch, int max_seq_len, TensorParallel tp = {}, ContextParallel cp = {},
            const ModelPart* part = nullptr, int slots = 1);

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
  double forward_backward(const Batch& b, double grad_scale) override;
  double forward(const Batch& b, float* token_losses, int32_t* argmax, float* logits) override;
  // One decoder layer of the current micro-batch (forward_backward and forward
  // run the embedding, these for every layer, then the head): layer l reads
  // layer l-1's output; backward_layer(l) turns d(its output) in the plan's
  // dresid into d(its input) and adds its parameter gradients. T is this
  // rank's positions per sequence (T / cp under context parallelism).
  void forward_layer(int l, int B, int T);
  void backward_layer(int l, int B, int T);

  int chunks() const override { return static_cast<int>(chunks_.size()); }
  int slots() const override { return static_cast<int>(slots_.size()); }
  size_t stage_floats(const Batch& b) const override;
  double stage_forward(int slot, int chunk, const Batch& b, const float* input, float* output, double grad_scale,
                       float* token_losses = nullptr, int32_t* argmax = nullptr) override;
  void stage_backward(int slot, int chunk, const float* doutput, float* dinput) override;
  double grad_norm() override;
  void adamw_step(const AdamWHyper& h) override;
  bool supports_sharded_step() const override { return true; }
  float* host_params() override { return params_.data(); }
  float* host_grads() override { return grads_.data(); }
  double grad_sq_sum_range(size_t begin, size_t end) override;
  void adamw_step_range(const AdamWHyper& h, size_t begin, size_t end) override;
  void keep_optimizer_range(size_t begin, size_t end) override;
  // The moments now (ensure_moments), so that a model whose moments do not
  // fit fails before the first step, with a message saying so.
  void reserve_optimizer_state() override;

  size_t activation_floats() const { return plan_.total; }  // per slot
  // Thread replicas (model/cpu_replicas.h): compute with `owner`'s
  // parameters from now on and free this engine's own. Such an engine runs
  // forward, forward_backward and its own gradients only; the owner keeps
  // the parameters and the optimizer.
  void share_params_of(CpuEngine& owner);
  // Test instrumentation: while set, every backward also adds to (*sq)[i],
  // for each shift coefficient i, the sum of its gradient's terms' squares
  // (cpu::kv_shift_term_squares; "free"/"clamp01" shifts, no context
  // parallelism). sq has layout().total entries; null stops it.
  void collect_shift_term_squares(std::vector<double>* sq);

 private:
  // A run of consecutive held layers [first, last] (local indices) and what
  // comes with it: the embedding before the model's first layer, the head
  // after its last.
  struct Chunk {
    int first, last;
    bool embedding, head;
  };
  // One micro-batch in flight: its activations and what the batch it came
  // from fixes (this rank's rows, document starts).
  struct Slot {
    ZeroedHostBuffer<float> acts;  // what a forward alone never writes (backward scratch) takes no memory
    Batch rows;  // this rank's rows (into the caller's batch, or the cp vectors below)
    CpLayout cp_layout;
    std::vector<int32_t> doc_start, cp_inputs, cp_targets, cp_shift_doc, cp_doc_full;
    std::vector<float> cp_mask;
  };
  Slot& use(int slot);  // makes `slot` the one forward_layer/backward_layer work on
  float* acts() { return cur_->acts.data(); }
  // Fills the slot's rows of a micro-batch: b itself, or under context
  // parallelism its two chunks of every sequence (B sequences of T / cp rows).
  void take_rows(Slot& s, const Batch& b);
  // Under context parallelism: the loss sum over the group, and per-token
  // outputs of the whole micro-batch from every rank's rows.
  double sum_over_cp(double local_sum);
  void gather_rows(const float* local, float* full, const Batch& b);
  // Document boundaries (ModelConfig::document_boundaries): the first
  // position of each position's document, [B*T], for the shift and attention
  // kernels (null when that kernel ignores documents).
  void find_documents(Slot& s, const Batch& b);
  const int32_t* shift_doc_start() const;
  const int32_t* attention_doc_start() const;
  // Sequence parallelism: adds the norm gains' gradients of one backward,
  // summed over the TP group, to the gradients.
  void add_norm_grads(float* norm_grads);
  // What every layer of a B x T micro-batch shares (sizes, RoPE tables, documents, the TP group).
  BlockContext block_context(int B, int T);
  // Masked cross-entropy over this rank's logits (vocab-parallel when tp > 1).
  void cross_entropy(float* dlogits, int32_t* argmax, const Batch& b, double grad_scale);

  ModelConfig m_;
  TensorParallel tp_;
  TensorParallelRegion region_;
  ContextParallel cp_;
  std::unique_ptr<ContextParallelAttention> cp_attn_;  // cp > 1 only
  HostVector<float> cp_gather_, cp_ids_;               // forward's gather of per-token outputs
  ModelPart part_;
  std::vector<int> local_of_;  // [L]: a layer's index among the held ones, -1 if not held
  std::vector<Chunk> chunks_;
  LocalDims d_;
  ParamLayout layout_;
  int max_B_, max_T_;
  ActivationPlan plan_;
  HostVector<float> params_;        // (huge pages: core/huge_pages.h)
  ZeroedHostBuffer<float> grads_;  // untouched, so no memory, until a backward writes them (eval, forward)
  std::vector<Slot> slots_;
  Slot* cur_ = nullptr;
  // AdamW moments of [opt_begin_, opt_end_) of the layout (all of it unless
  // keep_optimizer_range narrowed it); empty (all zeros) until first written,
  // so a ZeRO-1 rank never holds the whole model's moments, not even at start.
  HostVector<float> exp_avg_, exp_avg_sq_;
  void ensure_moments();
  size_t opt_begin_ = 0, opt_end_ = 0;
  std::vector<int32_t> argmax_;
  std::vector<double> norm_partials_, ce_scratch_;
  ModelView P_, G_;
  std::vector<double>* shift_term_squares_ = nullptr;
};

}  // namespace kvs
