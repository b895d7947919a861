#include "parallel/flat_sync.h"

#include <algorithm>
#include <cstring>

#include "parallel/zero1.h"

namespace kvs {

StagedFlatSync::StagedFlatSync(Engine& engine, dist::Communicator& comm, const ShardRange& shard, Copy to_host,
                               Copy from_host)
    : engine_(engine),
      comm_(comm),
      begin_(shard.begin),
      end_(shard.end),
      S_(shard.padded_size),
      total_(engine.layout().total),
      to_host_(std::move(to_host)),
      from_host_(std::move(from_host)),
      padded_(shard.padded_size * comm.size(), 0.0f),
      piece_(shard.padded_size, 0.0f) {}

void StagedFlatSync::reduce_grads() {
  float* g = engine_.flat_grads();
  to_host_(padded_.data(), g, total_);
  comm_.reduce_scatter(padded_.data(), piece_.data(), S_, dist::DType::F32, dist::ReduceOp::Sum);
  from_host_(g + begin_, piece_.data(), end_ - begin_);
}

void StagedFlatSync::all_gather(float* full, const Copy& to_host, const Copy& from_host) {
  std::fill(piece_.begin(), piece_.end(), 0.0f);
  to_host(piece_.data(), full + begin_, end_ - begin_);
  comm_.all_gather(piece_.data(), padded_.data(), S_, dist::DType::F32);
  from_host(full, padded_.data(), total_);
}

void StagedFlatSync::all_gather_params() {
  all_gather(engine_.flat_params(), to_host_, from_host_);
  engine_.flat_params_written();
}

void StagedFlatSync::all_gather_host(float* full) {
  const Copy host = [](float* dst, const float* src, size_t n) { std::memcpy(dst, src, n * sizeof(float)); };
  all_gather(full, host, host);
}

std::unique_ptr<FlatSync> make_flat_sync(Engine& engine, dist::Communicator& comm, const ShardRange& shard) {
  if (engine.flat_on_device()) return make_device_flat_sync(engine, comm, shard);
  const StagedFlatSync::Copy host = [](float* dst, const float* src, size_t n) {
    std::memcpy(dst, src, n * sizeof(float));
  };
  return std::make_unique<StagedFlatSync>(engine, comm, shard, host, host);
}

}  // namespace kvs
