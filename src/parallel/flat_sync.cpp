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
  to_host_(padded_.data(), g, total_ * sizeof(float));
  reduce_scatter_padded();
  from_host_(g + begin_, piece_.data(), (end_ - begin_) * sizeof(float));
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
  to_host_(piece_.data(), params + begin_, (end_ - begin_) * sizeof(float));
  all_gather_padded();
  from_host_(params, padded_.data(), total_ * sizeof(float));
  engine_.flat_params_written();
}

void StagedFlatSync::all_gather_params16() {
  uint16_t* p16 = engine_.flat_params16();
  bits_.resize(total_);
  to_host_(bits_.data() + begin_, p16 + begin_, (end_ - begin_) * sizeof(uint16_t));
  std::fill(piece_.begin(), piece_.end(), 0.0f);
  for (size_t i = begin_; i < end_; ++i) {
    const uint32_t u = static_cast<uint32_t>(bits_[i]) << 16;
    std::memcpy(&piece_[i - begin_], &u, sizeof(u));
  }
  all_gather_padded();
  for (size_t i = 0; i < total_; ++i) {
    uint32_t u;
    std::memcpy(&u, &padded_[i], sizeof(u));
    bits_[i] = static_cast<uint16_t>(u >> 16);
  }
  from_host_(p16, bits_.data(), total_ * sizeof(uint16_t));
  // The fp32 copies: each owner's run of them (one per rank) broadcast from it.
  const std::vector<Engine::Fp32Copy> copies = engine_.fp32_copies();
  const size_t packed =
      copies.empty() ? 0 : static_cast<size_t>(copies.back().data + copies.back().n - copies.front().data);
  copies_.resize(packed);
  if (packed) to_host_(copies_.data(), copies.front().data, packed * sizeof(float));
  for (int r = 0; r < comm_.size(); ++r) {
    const auto [first, last] = packed_run(copies, static_cast<size_t>(r) * S_, static_cast<size_t>(r + 1) * S_);
    for (size_t at = first; at < last; at += dist::kHostPieceFloats)
      comm_.broadcast(copies_.data() + at, std::min(dist::kHostPieceFloats, last - at), dist::DType::F32, r);
  }
  if (packed) from_host_(copies.front().data, copies_.data(), packed * sizeof(float));
}

std::pair<size_t, size_t> packed_run(const std::vector<Engine::Fp32Copy>& copies, size_t lo, size_t hi) {
  // How many packed values lie before layout offset x.
  auto before = [&](size_t x) {
    size_t n = 0;
    for (const Engine::Fp32Copy& c : copies) n += std::min(c.n, x > c.offset ? x - c.offset : 0);
    return n;
  };
  return {before(lo), before(hi)};
}

std::unique_ptr<FlatSync> make_flat_sync(Engine& engine, dist::Communicator& comm, const ShardRange& shard) {
  if (engine.flat_on_device()) return make_device_flat_sync(engine, comm, shard);
  const StagedFlatSync::Copy host = [](void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); };
  return std::make_unique<StagedFlatSync>(engine, comm, shard, host, host);
}

}  // namespace kvs
