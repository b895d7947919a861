// Engine: one backend's model + optimizer, behind the interface the trainer
// and the CLI use. The CPU engine (cpu_engine.h) is the fp32 reference; a CUDA
// engine (bf16 storage, fp32 master weights) implements the same interface.
// Parameters, gradients and optimizer moments all follow ParamLayout; the
// read_/write_ methods move fp32 host copies in and out for checkpoints.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/params.h"
#include "parallel/context_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"

namespace kvs {

namespace dist {
class AsyncDeviceCollectives;
}

// One micro-batch of B sequences of T tokens (host memory).
struct Batch {
  int B = 0, T = 0;
  const int32_t* inputs = nullptr;   // [B, T]
  const int32_t* targets = nullptr;  // [B, T]
  const float* mask = nullptr;       // [B, T], 1 = scored
};

// model.document_boundaries: where each position's document starts (the last
// BOS at or before it, else 0), [B, T] into `out`; both engines take these.
void find_document_starts(const Batch& b, int bos_token_id, int32_t* out);

struct AdamWHyper {
  double lr = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;         // 1-based, for bias correction
  double grad_scale = 1.0;  // multiplies every gradient (global-norm clipping)
};

// The part of the range [begin, begin + n) that lies in [held_begin, held_end):
// `at` elements into the range, `n` of them (0 when they do not meet).
struct HeldPart {
  size_t at = 0, n = 0;
};
inline HeldPart held_part(size_t begin, size_t n, size_t held_begin, size_t held_end) {
  const size_t lo = begin > held_begin ? begin : held_begin, hi = begin + n < held_end ? begin + n : held_end;
  return lo < hi ? HeldPart{lo - begin, hi - lo} : HeldPart{};
}

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const ModelConfig& model_config() const = 0;
  virtual const ParamLayout& layout() const = 0;
  virtual int max_batch() const = 0;
  virtual int max_seq_len() const = 0;

  // The flat fp32 parameters [begin, begin + n) (a checkpoint moves them a
  // tensor or a window at a time, so that no rank holds a host copy of all).
  virtual void read_params_range(size_t begin, size_t n, float* host) const = 0;
  virtual void write_params_range(size_t begin, size_t n, const float* host) = 0;
  // The AdamW moments of [begin, begin + n): zeros where this engine holds
  // none (keep_optimizer_range); a null output is skipped. The write keeps
  // only the part of the range held.
  virtual void read_optimizer_range(size_t begin, size_t n, float* exp_avg, float* exp_avg_sq) const = 0;
  virtual void write_optimizer_range(size_t begin, size_t n, const float* exp_avg, const float* exp_avg_sq) = 0;
  // The same over the whole layout.
  void read_params(float* host) const { read_params_range(0, layout().total, host); }
  void write_params(const float* host) { write_params_range(0, layout().total, host); }
  void read_optimizer_state(float* exp_avg, float* exp_avg_sq) const {
    read_optimizer_range(0, layout().total, exp_avg, exp_avg_sq);
  }
  void write_optimizer_state(const float* exp_avg, const float* exp_avg_sq) {
    write_optimizer_range(0, layout().total, exp_avg, exp_avg_sq);
  }
  virtual void read_grads(float* host) const = 0;

  virtual void zero_grad() = 0;
  // train.overlap_optimizer: may adamw_step return with the update still
  // running, to overlap the next forward (the CUDA engine; the CPU engine
  // runs its step in order and ignores it). The same bits either way.
  virtual void set_overlap_optimizer(bool on) { (void)on; }
  // train.time_gemm_algorithms (the CUDA engine; others ignore it): the GEMM
  // shapes met from here on are remembered, and time_gemm_algorithms() times
  // cuBLASLt's candidates for them and keeps each one's fastest. Returns a
  // line saying what it chose ("" when nothing was timed). Call it where no
  // collective in flight waits for another process's later calls (between steps).
  virtual void set_time_gemm_algorithms(bool on) { (void)on; }
  virtual std::string time_gemm_algorithms() { return {}; }
  // Forward and backward of one micro-batch. Adds grad_scale * d(sum of masked
  // token losses)/d(params) to the gradients; returns the sum of masked losses.
  virtual double forward_backward(const Batch& b, double grad_scale) = 0;
  // Forward only. Optional outputs: per-token masked losses [B*T], argmax
  // predictions [B*T], logits [B*T*V]. Returns the sum of masked losses.
  virtual double forward(const Batch& b, float* token_losses, int32_t* argmax, float* logits) = 0;

  virtual double grad_norm() = 0;  // L2 norm over all gradients

  // Pipeline parallelism (parallel/pipeline.h, docs/PARALLEL.md): an engine
  // holding a pipeline stage's part of the model runs one micro-batch through
  // one of its chunks (runs of consecutive layers; virtual stages) at a time,
  // in activation slot `slot` (a schedule keeps several micro-batches in
  // flight). stage_forward: the chunk's input is the embedding of b's tokens
  // (the model's first chunk) or `input` (stage_floats(b) floats from the
  // previous stage); its output goes to `output`, or, for the model's last
  // chunk, into the loss: it returns the sum of masked token losses and, when
  // grad_scale >= 0, keeps grad_scale * d(loss)/d(logits) for the backward
  // (grad_scale < 0: evaluation, with the optional per-token outputs of
  // forward()). stage_backward: from the kept loss gradient (last chunk) or
  // `doutput`, adds the chunk's parameter gradients and writes d(input) to
  // `dinput` (except on the first chunk). The defaults throw.
  virtual int chunks() const { return 1; }
  virtual int slots() const { return 1; }
  virtual size_t stage_floats(const Batch& b) const;
  virtual double stage_forward(int slot, int chunk, const Batch& b, const float* input, float* output,
                               double grad_scale, float* token_losses = nullptr, int32_t* argmax = nullptr);
  virtual void stage_backward(int slot, int chunk, const float* doutput, float* dinput);
  // Stage activations in the engine's own device memory (the CUDA engine),
  // for a communicator that takes device memory: the runner receives into and
  // sends from stage_device_buffer(slot, chunk, which, b) and passes null for
  // the host arrays above (input, output, doutput, dinput), which then mean
  // "in that buffer". Input: where a forward's activations are received;
  // Output: what a forward leaves for the next stage; GradOutput: where a
  // backward's gradient is received; GradInput: what a backward leaves for
  // the previous stage. The bytes are the engine's own format (bf16 for the
  // CUDA engine), the same on every stage. Input and Output are the slot's
  // and the chunk's; GradOutput and GradInput are one buffer each, whatever
  // the slot and chunk (a backward works in the first: the pipeline's plan
  // receives a gradient only for the next backward, and sends the second
  // before the next backward). The default: host arrays only.
  enum class StageTensor { Input, Output, GradOutput, GradInput };
  struct DeviceBuffer {
    void* data = nullptr;
    size_t bytes = 0;
  };
  virtual bool stage_on_device() const { return false; }
  virtual DeviceBuffer stage_device_buffer(int slot, int chunk, StageTensor which, const Batch& b);
  virtual void adamw_step(const AdamWHyper& h) = 0;

  // ZeRO-1 (docs/PARALLEL.md): a data-parallel rank reduces the gradients,
  // then updates only its slice [begin, end) of the flat buffers (indices into
  // ParamLayout). The defaults throw (an engine without a sharded step).
  virtual bool supports_sharded_step() const { return false; }
  // Where the flat fp32 buffers live: host memory (CPU engine) or GPU memory
  // (CUDA engine). flat_params()/flat_grads() point there, writable; for a
  // host engine they are host_params()/host_grads().
  virtual bool flat_on_device() const { return false; }
  virtual float* flat_params() { return host_params(); }
  virtual float* flat_grads() { return host_grads(); }
  virtual float* host_params();  // the flat fp32 parameters, writable (host engines)
  virtual float* host_grads();   // the flat fp32 gradients, writable (host engines)
  // The caller wrote flat_params() directly (ZeRO-1's all-gather): refresh
  // what the engine derives from them (the CUDA engine's bf16 copy).
  virtual void flat_params_written() {}
  // Sum of squared gradients over [begin, end) (the caller all-reduces, then takes sqrt).
  virtual double grad_sq_sum_range(size_t begin, size_t end);
  // adamw_step restricted to [begin, end): the same per-element math, each
  // element treated by the kind of the tensor it belongs to (decay, clamp01).
  virtual void adamw_step_range(const AdamWHyper& h, size_t begin, size_t end);
  // Keeps the AdamW moments of [begin, end) only and frees the rest (ZeRO-1's
  // memory saving). Afterwards read_optimizer_range gives zeros outside the
  // range, write_optimizer_range keeps only the range, and adamw_step_range
  // must stay inside it.
  virtual void keep_optimizer_range(size_t begin, size_t end);
  // Allocates the optimizer state of the range kept (the CUDA engine does so
  // on first use, after keep_optimizer_range): called once the range is set,
  // so that a model whose moments do not fit fails before the first step.
  virtual void reserve_optimizer_state() {}

  // ZeRO-1 with the fp32 master weights sharded too (train.shard_master,
  // docs/PARALLEL.md), for engines that compute from a separate low-precision
  // copy (the CUDA engine's bf16 weights; the CPU engine computes with its
  // fp32 weights, has no such copy and returns false). After
  // keep_master_range the engine holds the fp32 master of [begin, end) only,
  // plus whole copies of the tensors its kernels read in fp32 (fp32_copies:
  // norm gains, shift coefficients); the low-precision copy stays whole.
  // Call it before the parameters are first written, so that the whole master
  // never exists. Then write_params_range writes everything (the master's
  // part of it only where held), read_params_range reads only what is held (a
  // kvs::Error otherwise: Zero1::gather_params_range gathers the rest),
  // adamw_step_range stays inside [begin, end) and refreshes the fp32 copies'
  // part of it, and ZeRO-1 gathers flat_params16() and the fp32 copies from
  // their owners instead of flat_params(). The defaults throw.
  virtual bool supports_sharded_master() const { return false; }
  virtual bool master_sharded() const { return false; }
  virtual void keep_master_range(size_t begin, size_t end);
  // The bf16 copy of the flat parameters (uint16 bits, [layout.total]), in
  // the engine's memory (GPU memory for the CUDA engine).
  virtual uint16_t* flat_params16();
  // The tensors kept whole in fp32 beside a sharded master, in layout order,
  // packed in one buffer (data, in the engine's memory) in that order.
  struct Fp32Copy {
    size_t offset = 0, n = 0;  // the tensor in the layout
    float* data = nullptr;
  };
  virtual std::vector<Fp32Copy> fp32_copies();
  // ZeRO-1's gather overlapping the next forward (the CUDA engine, under
  // NCCL): the layout cut into ranges in the forward's order (range i ends at
  // ends[i]), one event (a cudaEvent_t) each. The caller enqueues each range's
  // gather on its communicator's stream and records the range's event after
  // it, then calls params_arriving(watch): the engine waits for range i's
  // event just before it first reads range i, and for all of them before
  // anything else touches the parameters; while any is pending its host
  // waits go through `watch` (a peer that died ends in an error after the
  // communicator's timeout, not a hang). The defaults: none (the CUDA engine
  // implements them; ZeRO-1's NCCL path, the only caller, needs them).
  struct ParamArrival {
    std::vector<size_t> ends;
    std::vector<void*> events;
  };
  virtual ParamArrival param_arrival() { return {}; }
  virtual void params_arriving(dist::AsyncDeviceCollectives* watch) { (void)watch; }

  // Overlapped gradient reduction (docs/PARALLEL.md, "Overlap"). While a hook
  // is set, every backward calls it as soon as the gradients of a contiguous
  // layout range are final (a layer's tensors; the final norm and LM head; the
  // embedding), in backward order; together the calls cover [0, total) once.
  // `cuda_event` is a cudaEvent_t recorded on the engine's stream after the
  // range's last gradient kernel: work that reads the range waits for it.
  class GradReadyHook {
   public:
    virtual ~GradReadyHook() = default;
    virtual void grads_ready(size_t begin, size_t end, void* cuda_event) = 0;
  };
  virtual bool announces_ready_grads() const { return false; }
  virtual void set_grad_ready_hook(GradReadyHook* hook) { (void)hook; }  // null: stop
};

// Checks a micro-batch against the engine's size and the vocabulary (host
// data); throws kvs::Error naming the first bad token and its position.
void validate_batch(const Batch& b, const ModelConfig& m, int max_batch, int max_seq_len);

// Builds the engine for `device`, sized for micro-batches of
// up to max_batch sequences of up to max_seq_len tokens. All memory is
// allocated here; nothing is allocated per step. Throws kvs::Error for a device
// this build or machine does not have. `recompute` (train.recompute) selects
// the CUDA engine's activation recomputation; the CPU engine keeps everything.
// `tp` makes the engine one tensor-parallel rank's slice of the model (with
// sequence parallelism if tp.sequence_parallel), `cp` one context-parallel
// rank's chunks of every sequence (both engines), `part` a pipeline
// stage's part of the model with `slots` micro-batches in flight (null: the
// whole model).
// `attention_backend` (train.attention_backend) picks the CUDA engine's
// attention: Flash (ours) or Cudnn (cuDNN SDPA); the CPU engine takes only Flash.
std::unique_ptr<Engine> make_engine(const ModelConfig& m, int max_batch, int max_seq_len, Device device,
                                    Recompute recompute = Recompute::None, TensorParallel tp = {},
                                    AttentionImpl attention_backend = AttentionImpl::Flash, ContextParallel cp = {},
                                    const ModelPart* part = nullptr, int slots = 1);

}  // namespace kvs
