#include "train/zero1.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "train/grad_norm.h"
#include "train/zero1_device.h"

namespace kvs {

ShardRange shard_range(size_t total, int dp, int rank) {
  KVS_CHECK(dp >= 1 && rank >= 0 && rank < dp, "shard_range: rank {} of {}", rank, dp);
  ShardRange r;
  r.padded_size = (total + dp - 1) / static_cast<size_t>(dp);
  r.begin = std::min(total, static_cast<size_t>(rank) * r.padded_size);
  r.end = std::min(total, r.begin + r.padded_size);
  return r;
}

Zero1::Zero1(Engine& engine, dist::Communicator& comm, TensorParallel tp)
    : engine_(engine), comm_(comm), tp_(tp), shard_(shard_range(engine.layout().total, comm.size(), comm.rank())) {
  KVS_CHECK(engine.supports_sharded_step(),
            "data parallelism (ZeRO-1) needs an engine with a sharded optimizer step; this device has none yet");
  if (engine.flat_on_device()) {
    device_ = make_device_flat_sync(engine, comm, shard_);
  } else {
    padded_.assign(shard_.padded_size * comm.size(), 0.0f);
    piece_.assign(shard_.padded_size, 0.0f);
  }
  engine.keep_optimizer_range(shard_.begin, shard_.end);
}

Zero1::~Zero1() = default;

void Zero1::overlap_next_backward() {
  if (device_) device_->overlap_next_backward();
}

double Zero1::reduce_gradients() {
  if (device_) {
    device_->reduce_grads();
  } else {
    const size_t total = engine_.layout().total;
    float* g = engine_.host_grads();
    // The padding stays zero: it only rounds the buffer up to dp equal pieces.
    std::copy(g, g + total, padded_.begin());
    comm_.reduce_scatter(padded_.data(), piece_.data(), shard_.padded_size, dist::DType::F32, dist::ReduceOp::Sum);
    std::copy(piece_.begin(), piece_.begin() + (shard_.end - shard_.begin), g + shard_.begin);
  }
  double sq = local_grad_sq_sum(engine_, shard_.begin, shard_.end, tp_);
  comm_.all_reduce(&sq, 1, dist::DType::F64, dist::ReduceOp::Sum);
  if (tp_.size > 1) tp_.comm->all_reduce(&sq, 1, dist::DType::F64, dist::ReduceOp::Sum);
  return std::sqrt(sq);
}

void Zero1::step(const AdamWHyper& h) {
  engine_.adamw_step_range(h, shard_.begin, shard_.end);
  if (device_)
    device_->all_gather_params();
  else
    all_gather_shards(engine_.host_params());
}

void Zero1::gather_optimizer_state(std::vector<float>& m, std::vector<float>& v) {
  const size_t total = engine_.layout().total;
  m.resize(total);
  v.resize(total);
  engine_.read_optimizer_state(m.data(), v.data());  // zeros outside this rank's shard
  if (comm_.device_memory()) {
    // NCCL stages host buffers on the GPU: one shard at a time, not the whole model.
    for (float* full : {m.data(), v.data()})
      for (int r = 0; r < comm_.size(); ++r) {
        const ShardRange s = shard_range(total, comm_.size(), r);
        if (s.end > s.begin) comm_.broadcast(full + s.begin, s.end - s.begin, dist::DType::F32, r);
      }
    return;
  }
  all_gather_shards(m.data());
  all_gather_shards(v.data());
}

// Host buffers (also for a GPU engine's checkpoint: the moments come to the host).
void Zero1::all_gather_shards(float* full) {
  piece_.resize(shard_.padded_size);  // sized once (host engines: by the constructor)
  padded_.resize(shard_.padded_size * comm_.size());
  std::fill(piece_.begin(), piece_.end(), 0.0f);
  std::copy(full + shard_.begin, full + shard_.end, piece_.begin());
  comm_.all_gather(piece_.data(), padded_.data(), shard_.padded_size, dist::DType::F32);
  std::copy(padded_.begin(), padded_.begin() + engine_.layout().total, full);
}

}  // namespace kvs
