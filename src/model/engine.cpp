// Engine selection and the batch checks every engine shares.
#include "model/engine.h"

#include <omp.h>

#include <new>

#include "core/blas_address_space.h"
#include "core/error.h"
#include "model/cpu_engine.h"
#include "model/cpu_replicas.h"
#include "model/params.h"
#ifdef KVS_CUDA
#include "dist/launch.h"
#include "dist/nccl_comm.h"
#include "kernels/cuda/device.h"
#include "model/cuda_engine.h"
#endif

namespace kvs {

namespace {
[[noreturn]] void no_sharded_step() {
  fail("this engine has no sharded optimizer step (ZeRO-1 data parallelism)");
}
}  // namespace

float* Engine::host_params() { no_sharded_step(); }
float* Engine::host_grads() { no_sharded_step(); }
double Engine::grad_sq_sum_range(size_t, size_t) { no_sharded_step(); }
void Engine::adamw_step_range(const AdamWHyper&, size_t, size_t) { no_sharded_step(); }
void Engine::keep_optimizer_range(size_t, size_t) { no_sharded_step(); }

namespace {
[[noreturn]] void no_sharded_master() {
  fail("this engine has no separate fp32 master to shard (train.shard_master: the CUDA engine)");
}
}  // namespace

void Engine::keep_master_range(size_t, size_t) { no_sharded_master(); }
uint16_t* Engine::flat_params16() { no_sharded_master(); }
std::vector<Engine::Fp32Copy> Engine::fp32_copies() { no_sharded_master(); }

void find_document_starts(const Batch& b, int bos_token_id, int32_t* out) {
  for (int i = 0; i < b.B; ++i) {
    int start = 0;
    for (int t = 0; t < b.T; ++t) {
      const size_t at = static_cast<size_t>(i) * b.T + t;
      if (b.inputs[at] == bos_token_id) start = t;
      out[at] = start;
    }
  }
}

void validate_batch(const Batch& b, const ModelConfig& m, int max_batch, int max_seq_len) {
  KVS_CHECK(b.B >= 1 && b.B <= max_batch, "engine: batch of {} sequences, engine sized for {}", b.B, max_batch);
  KVS_CHECK(b.T >= 1 && b.T <= max_seq_len, "engine: sequence length {}, engine sized for {}", b.T, max_seq_len);
  const size_t N = static_cast<size_t>(b.B) * b.T;
  for (size_t i = 0; i < N; ++i) {
    KVS_CHECK(b.inputs[i] >= 0 && b.inputs[i] < m.vocab_size,
              "input token {} at position {} is outside [0, vocab_size={})", b.inputs[i], i, m.vocab_size);
    if (b.targets)
      KVS_CHECK(b.targets[i] >= 0 && b.targets[i] < m.vocab_size,
                "target token {} at position {} is outside [0, vocab_size={})", b.targets[i], i, m.vocab_size);
  }
}

size_t Engine::stage_floats(const Batch&) const { fail("engine: this engine has no pipeline stages"); }
double Engine::stage_forward(int, int, const Batch&, const float*, float*, double, float*, int32_t*) {
  fail("engine: this engine has no pipeline stages");
}
void Engine::stage_backward(int, int, const float*, float*) { fail("engine: this engine has no pipeline stages"); }
Engine::DeviceBuffer Engine::stage_device_buffer(int, int, StageTensor, const Batch&) {
  fail("engine: this engine keeps no stage activations in device memory");
}

std::unique_ptr<Engine> make_engine(const ModelConfig& m, int max_batch, int max_seq_len, Device device,
                                    Recompute recompute, TensorParallel tp, AttentionImpl attention_backend,
                                    ContextParallel cp, const ModelPart* part, int slots) {
  if (device == Device::Cpu) {
    KVS_CHECK(attention_backend == AttentionImpl::Flash, "train.attention_backend: \"{}\" needs device \"cuda\"",
              attention_backend);
    try {
      const bool alone = tp.size == 1 && cp.size == 1 && (!part || part->is_whole(m)) && slots == 1;
      const int replicas = cpu_replicas_for_model(m, omp_get_max_threads(), max_batch, max_seq_len, alone);
      if (replicas > 1) return std::make_unique<CpuReplicaEngine>(m, max_batch, max_seq_len, replicas);
      return std::make_unique<CpuEngine>(m, max_batch, max_seq_len, tp, cp, part, slots);
    } catch (const std::bad_alloc&) {
      // fp32 weights, gradients and two AdamW moments: 16 bytes a parameter;
      // then the activations (the whole model's in one process).
      const double params = static_cast<double>(count_params(m).total), GiB = 1 << 30;
      const double acts = 4.0 * static_cast<double>(ActivationPlan::build(m, LocalDims::of(m, 0, 1), max_batch,
                                                                          max_seq_len)
                                                        .total);
      const std::string limit = address_space_limit_clause(
          static_cast<uint64_t>(params * 16 + acts), "this process maps before any model (its libraries and threads)");
      if (!limit.empty())
        fail("the model's {:.3g} GiB of fp32 weights, gradients, AdamW moments and activations of micro-batch {} x {} "
             "do not fit: {}",
             (params * 16 + acts) / GiB, max_batch, max_seq_len, limit);
      fail("the model does not fit in memory: {:.3g} parameters take {:.3g} GiB of fp32 weights, gradients and "
           "AdamW moments, and the activations of micro-batch {} x {} about {:.3g} GiB more (the whole model in one "
           "process; `kvshift info --config F` has each rank's); {}",
           params, params * 16 / GiB, max_batch, max_seq_len, acts / GiB,
           acts > params * 16 ? "lower train.micro_batch_size or train.seq_len"
                              : "spread the model over more processes (parallel.tp, parallel.pp) or make it smaller");
    }
  }
#ifdef KVS_CUDA
  std::string why;
  if (cuda::device_count(&why) == 0) fail("device 'cuda': no usable GPU ({})", why);
  // One GPU per process: local rank % visible devices (docs/LAUNCH.md).
  const int gpu = dist::select_device(dist::detect_launch());
  return std::make_unique<CudaEngine>(m, max_batch, max_seq_len, gpu, recompute, attention_backend, tp, cp, part,
                                      slots);
#else
  (void)recompute;
  (void)part;
  (void)slots;
  fail("device 'cuda': this kvshift was built without CUDA (configure with -DKVS_CUDA=ON)");
#endif
}

}  // namespace kvs
