#include "parallel/zero1.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "parallel/flat_sync.h"
#include "parallel/grad_norm.h"

namespace kvs {

ShardRange shard_range(size_t total, int dp, int rank) {
  KVS_CHECK(dp >= 1 && rank >= 0 && rank < dp, "shard_range: rank {} of {}", rank, dp);
  ShardRange r;
  r.padded_size = (total + dp - 1) / static_cast<size_t>(dp);
  r.begin = std::min(total, static_cast<size_t>(rank) * r.padded_size);
  r.end = std::min(total, r.begin + r.padded_size);
  return r;
}

Zero1::Zero1(Engine& engine, dist::Communicator& comm, TensorParallel tp, PipelineNorm pipe, bool shard_master)
    : engine_(engine), comm_(comm), tp_(tp), pipe_(pipe), shard_(shard_range(engine.layout().total, comm.size(), comm.rank())) {
  KVS_CHECK(engine.supports_sharded_step(),
            "data parallelism (ZeRO-1) needs an engine with a sharded optimizer step; this device has none yet");
  sync_ = make_flat_sync(engine, comm, shard_);
  engine.keep_optimizer_range(shard_.begin, shard_.end);
  if (shard_master && engine.supports_sharded_master()) engine.keep_master_range(shard_.begin, shard_.end);
}

Zero1::~Zero1() = default;

void Zero1::overlap_next_backward() { sync_->overlap_next_backward(); }

double Zero1::reduce_gradients() {
  sync_->reduce_grads();
  double sq = local_grad_sq_sum(engine_, shard_.begin, shard_.end, tp_, pipe_.tied_copy);
  comm_.all_reduce(&sq, 1, dist::DType::F64, dist::ReduceOp::Sum);
  if (tp_.size > 1) tp_.comm->all_reduce(&sq, 1, dist::DType::F64, dist::ReduceOp::Sum);
  if (pipe_.comm && pipe_.comm->size() > 1) pipe_.comm->all_reduce(&sq, 1, dist::DType::F64, dist::ReduceOp::Sum);
  return std::sqrt(sq);
}

void Zero1::step(const AdamWHyper& h) {
  engine_.adamw_step_range(h, shard_.begin, shard_.end);
  if (engine_.master_sharded())
    sync_->all_gather_params16();
  else
    sync_->all_gather_params();
}

void Zero1::gather_optimizer_range(size_t begin, size_t n, float* m, float* v) {
  engine_.read_optimizer_range(begin, n, m, v);  // this rank's part; zeros elsewhere
  broadcast_from_owners(begin, n, {m, v});
}

void Zero1::gather_params_range(size_t begin, size_t n, float* params) {
  if (!engine_.master_sharded()) {
    engine_.read_params_range(begin, n, params);
    return;
  }
  const HeldPart own = held_part(begin, n, shard_.begin, shard_.end);
  if (own.n) engine_.read_params_range(begin + own.at, own.n, params + own.at);
  broadcast_from_owners(begin, n, {params});
}

void Zero1::broadcast_from_owners(size_t begin, size_t n, std::initializer_list<float*> outs) {
  const size_t total = engine_.layout().total;
  // Broadcast from each owner, in bounded pieces: NCCL stages host memory on the GPU.
  for (int r = 0; r < comm_.size(); ++r) {
    const ShardRange s = shard_range(total, comm_.size(), r);
    const HeldPart part = held_part(begin, n, s.begin, s.end);
    for (float* out : outs)
      for (size_t at = 0; out && at < part.n; at += dist::kHostPieceFloats)
        comm_.broadcast(out + part.at + at, std::min(dist::kHostPieceFloats, part.n - at), dist::DType::F32, r);
  }
}

}  // namespace kvs
