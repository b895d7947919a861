#include "parallel/flat_sync.h"

#include <algorithm>
#include <cstring>

#include "parallel/zero1.h"

namespace kvs {

StagedFlatSync::StagedFlatSync(Engine& engine, dist::Communicator& comm, const ShardRange& shard, Copy to_host,
                               Copy from_host, size_t max_count)
    : engine_(engine),
      comm_(comm),
      begin_(shard.begin),
      end_(shard.end),
      S_(shard.padded_size),
      total_(engine.layout().total),
      max_count_(std::max<size_t>(1, max_count)),
      to_host_(std::move(to_host)),
      from_host_(std::move(from_host)),
      padded_(shard.padded_size * comm.size(), 0.0f),
      piece_(shard.padded_size, 0.0f) {}

void StagedFlatSync::reduce_grads() {
  float* g = engine_.flat_grads();
  to_host_(padded_.data(), g, total_);
  reduce_scatter_padded();
  from_host_(g + begin_, piece_.data(), end_ - begin_);
}

void StagedFlatSync::reduce_scatter_padded() {
  if (S_ <= max_count_) {
    comm_.reduce_scatter(padded_.data(), piece_.data(), S_, dist::DType::F32, dist::ReduceOp::Sum);
    return;
  }
  // Piece [at, at + k) of every rank's segment, packed rank after rank as reduce_scatter takes them.
  const size_t n = static_cast<size_t>(comm_.size()), step = std::min(max_count_, dist::kHostPieceFloats);
  for (size_t at = 0; at < S_; at += step) {
    const size_t k = std::min(step, S_ - at);
    staging_.resize(k * n);
    for (size_t r = 0; r < n; ++r) std::copy_n(padded_.data() + r * S_ + at, k, staging_.data() + r * k);
    comm_.reduce_scatter(staging_.data(), piece_.data() + at, k, dist::DType::F32, dist::ReduceOp::Sum);
  }
}

void StagedFlatSync::all_gather_padded() {
  if (S_ <= max_count_) {
    comm_.all_gather(piece_.data(), padded_.data(), S_, dist::DType::F32);
    return;
  }
  const size_t n = static_cast<size_t>(comm_.size()), step = std::min(max_count_, dist::kHostPieceFloats);
  for (size_t at = 0; at < S_; at += step) {
    const size_t k = std::min(step, S_ - at);
    staging_.resize(k * n);
    comm_.all_gather(piece_.data() + at, staging_.data(), k, dist::DType::F32);
    for (size_t r = 0; r < n; ++r) std::copy_n(staging_.data() + r * k, k, padded_.data() + r * S_ + at);
  }
}

void StagedFlatSync::all_gather_params() {
  float* params = engine_.flat_params();
  std::fill(piece_.begin(), piece_.end(), 0.0f);
  to_host_(piece_.data(), params + begin_, end_ - begin_);
  all_gather_padded();
  from_host_(params, padded_.data(), total_);
  engine_.flat_params_written();
}

std::unique_ptr<FlatSync> make_flat_sync(Engine& engine, dist::Communicator& comm, const ShardRange& shard) {
  if (engine.flat_on_device()) return make_device_flat_sync(engine, comm, shard);
  const StagedFlatSync::Copy host = [](float* dst, const float* src, size_t n) {
    std::memcpy(dst, src, n * sizeof(float));
  };
  return std::make_unique<StagedFlatSync>(engine, comm, shard, host, host);
}

}  // namespace kvs
