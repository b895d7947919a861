// ZeRO-1 over data-parallel ranks (docs/PARALLEL.md): the flat gradient
// buffer is padded to a multiple of dp and reduce-scattered, so rank r holds
// the summed gradients of its contiguous shard [r*S, min((r+1)*S, total)),
// S = ceil(total/dp). Each rank holds the AdamW moments of its shard only and
// runs AdamW on it, then the parameters are all-gathered. With the fp32
// master sharded too (train.shard_master, engines with a bf16 copy: the CUDA
// engine) the rank keeps the master of its shard only, and the bf16 copy is
// gathered (2 bytes a parameter, with fp32 copies of the norm gains and shift
// coefficients), as Megatron's distributed optimizer does.
// The collectives themselves are a FlatSync (flat_sync.h): host collectives
// on host buffers (CPU engine, or a GPU engine's buffers staged through the
// host under MPI), or NCCL in place on GPU buffers, overlapped with the backward.
#pragma once
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <vector>

#include "dist/comm.h"
#include "model/engine.h"
#include "parallel/grad_norm.h"

namespace kvs {

struct ShardRange {
  size_t begin = 0, end = 0;  // [begin, end) into the flat layout; may be empty
  size_t padded_size = 0;     // floats per shard in the collectives (S)
};

// Rank `rank` of `dp`'s shard of `total` floats.
ShardRange shard_range(size_t total, int dp, int rank);

class FlatSync;

class Zero1 {
 public:
  // Narrows the engine's moments to this rank's shard: load any full
  // optimizer state into the engine before.
  // comm: the ranks whose gradients are summed (dp x cp). With tensor
  // parallelism the engine holds one TP slice and the gradient norm is also
  // summed over `tp`'s group; with a pipeline, over the stages (`pipe`).
  // shard_master: the fp32 master too, where the engine has one apart from
  // the weights it computes with (Engine::supports_sharded_master; elsewhere
  // the master stays whole). Construct it before the parameters are written.
  Zero1(Engine& engine, dist::Communicator& comm, TensorParallel tp = {}, PipelineNorm pipe = {},
        bool shard_master = false);
  ~Zero1();

  // Call before the last micro-batch's forward_backward of a step: its
  // backward starts reducing each layer's gradients as soon as they are final
  // (CUDA engine + NCCL; elsewhere a no-op and reduce_gradients does it all).
  void overlap_next_backward();

  // Sums every rank's gradients into this rank's shard (reduce-scatter) and
  // returns the global L2 norm (squared norms of the shards, all-reduced).
  // Outside the shard the engine's gradients stay this rank's own partial sums.
  double reduce_gradients();
  // AdamW on this rank's shard, then every rank gets every parameter.
  void step(const AdamWHyper& h);
  // The AdamW moments of [begin, begin + n) of the engine's layout, each part
  // from the rank whose shard holds it, on every rank: a collective over the
  // ranks, which all pass the same range. A checkpoint asks tensor by tensor,
  // so no rank holds more than one tensor's moments besides its shard. A
  // null output is not gathered.
  void gather_optimizer_range(size_t begin, size_t n, float* exp_avg, float* exp_avg_sq);
  // The fp32 parameters of [begin, begin + n) on every rank, the same way
  // (each part from its owner) when the master is sharded; else each rank's own.
  void gather_params_range(size_t begin, size_t n, float* params);

  const ShardRange& shard() const { return shard_; }
  bool master_sharded() const { return engine_.master_sharded(); }

 private:
  Engine& engine_;
  dist::Communicator& comm_;
  TensorParallel tp_;
  PipelineNorm pipe_;
  ShardRange shard_;
  std::unique_ptr<FlatSync> sync_;  // the collectives on the engine's buffers (flat_sync.h)
  // [begin, begin + n) of each output, each part broadcast from the rank whose shard holds it.
  void broadcast_from_owners(size_t begin, size_t n, std::initializer_list<float*> outs);
};

}  // namespace kvs
