#include "train/train_step.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/profile_range.h"
#include "parallel/context_parallel.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/tied_embedding.h"
#ifdef KVS_CUDA
#include "dist/nccl_comm.h"
#include "kernels/cuda/device.h"
#endif

namespace kvs {

void check_parallel_layout(const Config& cfg, int world_size) {
  const int tp = cfg.parallel.tp, cp = cfg.parallel.cp, pp = cfg.parallel.pp;
  if (cp == 1 && pp == 1)
    KVS_CHECK(world_size % tp == 0,
              "parallel.tp ({}) must divide the number of processes ({}): the world is dp x tp ranks", tp, world_size);
  else if (pp == 1)
    KVS_CHECK(world_size % (tp * cp) == 0,
              "parallel.tp x parallel.cp ({} x {}) must divide the number of processes ({}): the world is dp x cp x tp "
              "ranks",
              tp, cp, world_size);
  else
    KVS_CHECK(world_size % (tp * cp * pp) == 0,
              "parallel.tp x parallel.cp x parallel.pp ({} x {} x {}) must divide the number of processes ({}): the "
              "world is dp x pp x cp x tp ranks",
              tp, cp, pp, world_size);
  const int dp = world_size / (tp * cp * pp);
  const int accum = cfg.train.grad_accum_steps;
  KVS_CHECK(accum % dp == 0,
            "train.grad_accum_steps ({}) must be a multiple of the data-parallel size ({} ranks): each rank runs "
            "grad_accum_steps/dp micro-batches of the global batch",
            accum, dp);
  if (pp > 1 && cfg.parallel.virtual_stages > 1)
    KVS_CHECK(accum / dp % pp == 0,
              "parallel.virtual_stages ({}): the interleaved schedule needs each rank's micro-batches "
              "(train.grad_accum_steps / dp = {}) to be a multiple of parallel.pp ({})",
              cfg.parallel.virtual_stages, accum / dp, pp);
}

void in_windows(size_t begin, size_t end, const std::function<void(size_t, size_t, float*)>& fill) {
  std::vector<float> window(std::min(kWindowFloats, end - begin));
  for (size_t at = begin; at < end; at += kWindowFloats) {
    const size_t n = std::min(kWindowFloats, end - at);
    fill(at, n, window.data());
  }
}

void write_params_in_windows(Engine& e, const std::function<void(size_t, size_t, float*)>& read) {
  in_windows(0, e.layout().total, [&](size_t at, size_t n, float* w) {
    read(at, n, w);
    e.write_params_range(at, n, w);
  });
}

TrainStep::TrainStep(const Config& cfg, dist::Communicator& world) {
  check_parallel_layout(cfg, world.size());
  const ParallelConfig& par = cfg.parallel;
  const TrainConfig& tc = cfg.train;
  // Every data-parallel replica runs a contiguous slice of grad_accum_steps/dp
  // micro-batches of the same global batch; the cp ranks of a replica each
  // hold chunks of every sequence and the tp ranks of those a slice of the
  // model. Gradients are summed (and the optimizer sharded) over dp x cp.
  groups_ = ParallelGroups::make(world, par.tp, par.cp, par.sequence_parallel, par.pp, cfg.model.tie_word_embeddings);
  tp_ = groups_.tensor_parallel();
  const ContextParallel cp{groups_.cp_rank, groups_.cp, groups_.cp_comm};
  // Pipeline parallelism: this rank's stage and its schedule over the step's micro-batches.
  const int micro_batches = tc.grad_accum_steps / groups_.dp;
  part_ = ModelPart::whole(cfg.model);
  if (par.pp > 1) {
    const StageSplit split = StageSplit::make(cfg.model, par.pp, par.virtual_stages, par.layers_per_stage,
                                              cfg.source_path.empty() ? "config" : cfg.source_path);
    part_ = ModelPart::of(split, groups_.pp_rank);
    pipe_ = std::make_unique<PipelineRunner>(
        split, PipelineParallel{groups_.pp_rank, par.pp, groups_.pp_comm, par.virtual_stages}, micro_batches);
  }
  pipe_norm_ = {pipe_ ? groups_.pp_comm : nullptr, !part_.embedding && cfg.model.tie_word_embeddings};
  micro_batch_ = tc.micro_batch_size;
  virtual_stages_ = par.pp > 1 ? par.virtual_stages : 1;
  processes_ = world.size();
  replica_sequences_ = cfg.global_batch_sequences() / groups_.dp;
  engine_ = make_engine(cfg.model, tc.micro_batch_size, tc.seq_len, cfg.device, tc.recompute, tp_,
                        tc.attention_backend, cp, pipe_ ? &part_ : nullptr, pipe_ ? pipe_->slots() : 1);
  engine_->set_overlap_optimizer(tc.overlap_optimizer);
  engine_->set_time_gemm_algorithms(tc.time_gemm_algorithms);
  time_gemms_ = tc.time_gemm_algorithms;
  shard_master_ = tc.shard_master;
  // Checkpoints hold full tensors; this moves them in and out of the rank's slice and stage.
  io_ = std::make_unique<FullModelIO>(cfg.model, engine_->layout(), tp_, groups_.dp_rank == 0 && groups_.cp_rank == 0,
                                      pipe_ ? groups_.pp_comm : nullptr, pipe_ ? &part_ : nullptr);
#ifdef KVS_CUDA
  // The GPU make_engine chose for this process (local rank % visible devices).
  if (cfg.device == Device::Cuda) {
    gpu_ = dist::select_device(dist::detect_launch());
    peak_tflops_ = cuda::peak_bf16_tflops(gpu_);
  }
#endif
}

TrainStep::~TrainStep() = default;

std::string TrainStep::layout() const {
  const ParallelGroups& g = groups_;
  std::string s = fmt::format("dp {}", g.dp);
  if (g.pp > 1)
    s += virtual_stages_ > 1 ? fmt::format(", pp {} ({} virtual stages each)", g.pp, virtual_stages_)
                             : fmt::format(", pp {}", g.pp);
  if (g.cp > 1) s += fmt::format(", cp {}", g.cp);
  s += fmt::format(", tp {}", g.tp);
  if (g.sequence_parallel) s += " (sequence parallel)";
  return s;
}

nlohmann::json TrainStep::layout_json() const {
  const ParallelGroups& g = groups_;
  return {{"processes", processes_}, {"dp", g.dp}, {"tp", g.tp}, {"cp", g.cp}, {"pp", g.pp},
          {"virtual_stages", virtual_stages_}, {"sequence_parallel", g.sequence_parallel}};
}

void TrainStep::shard_optimizer() {
  if (groups_.grad_comm->size() > 1 && !zero1_)
    zero1_ = std::make_unique<Zero1>(*engine_, *groups_.grad_comm, tp_, pipe_norm_, shard_master_);
}

TrainStep::Gradients TrainStep::compute_gradients(const Batch& replica, double grad_scale) {
  KVS_CHECK(replica.B == replica_sequences_, "internal error: a replica's batch of {} sequences, not {}", replica.B,
            replica_sequences_);
  auto micro = [&](int first) {
    const size_t o = static_cast<size_t>(first) * replica.T;
    return Batch{micro_batch_, replica.T, replica.inputs + o, replica.targets + o, replica.mask + o};
  };
  engine_->zero_grad();
  Gradients g;
  if (pipe_) {
    std::vector<Batch> micros;
    for (int s = 0; s < replica.B; s += micro_batch_) micros.push_back(micro(s));
    g.loss_sum = pipe_->train(*engine_, micros, grad_scale);
    groups_.pp_comm->all_reduce(&g.loss_sum, 1, dist::DType::F64, dist::ReduceOp::Sum);  // the last stage's
    sum_tied_embedding_grads(*engine_, groups_.embed_comm);
  } else {
    for (int s = 0; s < replica.B; s += micro_batch_) {
      // ZeRO-1 on CUDA + NCCL: the last micro-batch's backward starts the gradient reduction.
      if (zero1_ && s + micro_batch_ >= replica.B) zero1_->overlap_next_backward();
      ProfileRange micro_range("micro-batch", s / micro_batch_);
      g.loss_sum += engine_->forward_backward(micro(s), grad_scale);
    }
  }
  ProfileRange reduce_range("gradient reduction");
  // The TP ranks of a replica computed the same losses (the vocab-parallel
  // cross-entropy gives every rank whole rows), so only replicas are summed.
  groups_.dp_comm->all_reduce(&g.loss_sum, 1, dist::DType::F64, dist::ReduceOp::Sum);
  g.norm = zero1_ ? zero1_->reduce_gradients() : global_grad_norm(*engine_, tp_, pipe_norm_);
  return g;
}

void TrainStep::optimizer_step(const AdamWHyper& hp) {
  ProfileRange optimizer_range("optimizer step");
  if (zero1_)
    zero1_->step(hp);
  else
    engine_->adamw_step(hp);
  if (time_gemms_)
    if (std::string line = engine_->time_gemm_algorithms(); !line.empty()) gemm_timing_ = std::move(line);
}

}  // namespace kvs
