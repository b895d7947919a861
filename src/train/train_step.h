// One optimizer step of a config on the processes of a world, in the parallel
// layout the config asks for (world = dp x pp x cp x tp; docs/PARALLEL.md):
// the process groups, this rank's part of the model and its engine, ZeRO-1
// over the replicas, and the step itself. train() runs it on the data, with
// evaluation and checkpoints around it; `kvshift bench` times it on random
// tokens, so both measure the same step; `kvshift eval` evaluates a
// checkpoint on its engine, in the same layout.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "dist/comm.h"
#include "model/config.h"
#include "model/engine.h"
#include "parallel/grad_norm.h"
#include "parallel/parallel_groups.h"
#include "parallel/pipeline.h"
#include "parallel/zero1.h"
#include "train/full_model_io.h"

namespace kvs {

class PipelineRunner;

// Checks that the config can run on `world_size` processes: parallel.tp
// (x cp x pp) divides it (dp = world_size / (tp cp pp)) and
// train.grad_accum_steps is a multiple of dp. Any dp runs on either device:
// with dp > 1 the optimizer is ZeRO-1 (docs/PARALLEL.md), on host buffers for
// "cpu" and on GPU buffers for "cuda".
void check_parallel_layout(const Config& cfg, int world_size);

// The engine's flat [begin, end) filled a window at a time, so that no rank
// holds a host copy of its whole slice (FullModelIO: 4 bytes a parameter, and
// 8 more for the moments): fill(at, n, out) gives elements [at, at + n).
inline constexpr size_t kWindowFloats = size_t{16} << 20;  // 64 MiB
void in_windows(size_t begin, size_t end, const std::function<void(size_t, size_t, float*)>& fill);
// The engine's weights, read(at, n, out) giving elements [at, at + n) of its layout.
void write_params_in_windows(Engine& e, const std::function<void(size_t, size_t, float*)>& read);

class TrainStep {
 public:
  // Every rank of `world` constructs it (the groups are collectives). Throws
  // kvs::Error for a layout the world cannot hold. The engine's weights are
  // not set: write them (io() maps the full model onto this rank's part).
  TrainStep(const Config& cfg, dist::Communicator& world);
  ~TrainStep();
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  Engine& engine() { return *engine_; }
  const ParallelGroups& groups() const { return groups_; }
  const FullModelIO& io() const { return *io_; }
  PipelineRunner* pipeline() { return pipe_.get(); }
  Zero1* zero1() { return zero1_.get(); }
  // This replica's share of each global batch: global batch / dp sequences,
  // [dp_rank * n, (dp_rank + 1) * n).
  int replica_sequences() const { return replica_sequences_; }
  // "dp 2, pp 2 (2 virtual stages each), cp 2, tp 2 (sequence parallel)": the
  // layout's sizes (pp and cp only when > 1), as train's log line names them.
  std::string layout() const;
  // {"processes", "dp", "tp", "cp", "pp", "virtual_stages", "sequence_parallel"}.
  nlohmann::json layout_json() const;
  // The dense bf16 TFLOP/s of this process's GPU (cuda::peak_bf16_tflops: by
  // model name, or KVS_PEAK_TFLOPS), the denominator of MFU; 0 on the CPU or
  // for a GPU it does not know.
  double device_peak_tflops() const { return peak_tflops_; }
  // The GPU this process's engine runs on (local rank % visible devices); -1 on the CPU.
  int gpu() const { return gpu_; }

  // With more than one replica (dp x cp ranks), ZeRO-1: from here on the
  // engine keeps only its shard's moments, and with train.shard_master its
  // shard's fp32 master (CUDA engine). Call before the weights and moments
  // are written (so that neither exists whole; a resumed run then reads only
  // its shard's moments).
  void shard_optimizer();

  struct Gradients {
    double loss_sum = 0;  // the masked token losses of the whole global batch, summed over the replicas
    double norm = 0;      // the global L2 norm of the summed gradients (before clipping)
  };
  // Zeroes the gradients, runs forward and backward of the replica's
  // sequences (replica_sequences() of them, in micro-batches; through the
  // pipeline's schedule with pp > 1), each micro-batch's loss scaled by
  // grad_scale, and sums the gradients over the replicas (ZeRO-1: into each
  // rank's shard). Both results are the same on every rank.
  Gradients compute_gradients(const Batch& replica, double grad_scale);
  // AdamW on the summed gradients (ZeRO-1: on each shard, then every rank gets every parameter).
  // With train.time_gemm_algorithms, then the GEMM shapes met since the last
  // step are timed (Engine::time_gemm_algorithms; every rank at the same step).
  void optimizer_step(const AdamWHyper& hp);
  // What the last timing chose, once ("" otherwise): the trainer and bench print it.
  std::string take_gemm_timing() { return std::exchange(gemm_timing_, {}); }

 private:
  ParallelGroups groups_;
  TensorParallel tp_;
  std::unique_ptr<PipelineRunner> pipe_;
  ModelPart part_;
  PipelineNorm pipe_norm_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<FullModelIO> io_;
  std::unique_ptr<Zero1> zero1_;
  int micro_batch_ = 1, replica_sequences_ = 1, virtual_stages_ = 1, processes_ = 1;
  bool shard_master_ = true;  // train.shard_master
  bool time_gemms_ = false;   // train.time_gemm_algorithms
  std::string gemm_timing_;
  double peak_tflops_ = 0;
  int gpu_ = -1;
};

}  // namespace kvs
