#include "parallel/flat_sync.h"

#include <algorithm>
#include <cstring>

#include "parallel/zero1.h"

namespace kvs {

StagedFlatSync::StagedFlatSync(Engine& engine, dist::Communicator& comm, const ShardRange& shard, Copy to_host,
                               Copy from_host, size_t max_count)
    : engine_(engine),
      comm_(comm),
      rank_(static_cast<size_t>(comm.rank())),
      ranks_(static_cast<size_t>(comm.size())),
      S_(shard.padded_size),
      total_(engine.layout().total),
      chunk_(std::max<size_t>(1, std::min({S_, max_count, kStagingFloats / ranks_}))),
      to_host_(std::move(to_host)),
      from_host_(std::move(from_host)),
      staging_(chunk_ * ranks_, 0.0f),
      piece_(chunk_, 0.0f) {}

std::pair<size_t, size_t> StagedFlatSync::segment_part(size_t r, size_t at, size_t k) const {
  const size_t lo = std::min(total_, r * S_ + at), hi = std::min(total_, r * S_ + at + k);
  return {lo, hi - lo};
}

void StagedFlatSync::reduce_grads() {
  float* g = engine_.flat_grads();
  for (size_t at = 0; at < S_; at += chunk_) {
    const size_t k = std::min(chunk_, S_ - at);
    for (size_t r = 0; r < ranks_; ++r) {
      const auto [lo, n] = segment_part(r, at, k);
      if (n) to_host_(staging_.data() + r * k, g + lo, n * sizeof(float));
      std::fill(staging_.data() + r * k + n, staging_.data() + (r + 1) * k, 0.0f);
    }
    comm_.reduce_scatter(staging_.data(), piece_.data(), k, dist::DType::F32, dist::ReduceOp::Sum);
    // This rank's chunk [at, at + k) was read above; later chunks read beyond it.
    const auto [lo, n] = segment_part(rank_, at, k);
    if (n) from_host_(g + lo, piece_.data(), n * sizeof(float));
  }
}

void StagedFlatSync::all_gather_params() {
  float* params = engine_.flat_params();
  for (size_t at = 0; at < S_; at += chunk_) {
    const size_t k = std::min(chunk_, S_ - at);
    const auto [lo, n] = segment_part(rank_, at, k);
    if (n) to_host_(piece_.data(), params + lo, n * sizeof(float));
    std::fill(piece_.data() + n, piece_.data() + k, 0.0f);
    comm_.all_gather(piece_.data(), staging_.data(), k, dist::DType::F32);
    for (size_t r = 0; r < ranks_; ++r) {
      const auto [rlo, rn] = segment_part(r, at, k);
      if (rn && r != rank_) from_host_(params + rlo, staging_.data() + r * k, rn * sizeof(float));
    }
  }
  engine_.flat_params_written();
}

void StagedFlatSync::all_gather_params16() {
  uint16_t* p16 = engine_.flat_params16();
  bits_.resize(chunk_);
  for (size_t at = 0; at < S_; at += chunk_) {
    const size_t k = std::min(chunk_, S_ - at);
    const auto [lo, n] = segment_part(rank_, at, k);
    if (n) to_host_(bits_.data(), p16 + lo, n * sizeof(uint16_t));
    for (size_t i = 0; i < k; ++i) {
      const uint32_t u = i < n ? static_cast<uint32_t>(bits_[i]) << 16 : 0;
      std::memcpy(&piece_[i], &u, sizeof(u));
    }
    comm_.all_gather(piece_.data(), staging_.data(), k, dist::DType::F32);
    for (size_t r = 0; r < ranks_; ++r) {
      const auto [rlo, rn] = segment_part(r, at, k);
      if (!rn || r == rank_) continue;
      for (size_t i = 0; i < rn; ++i) {
        uint32_t u;
        std::memcpy(&u, &staging_[r * k + i], sizeof(u));
        bits_[i] = static_cast<uint16_t>(u >> 16);
      }
      from_host_(p16 + rlo, bits_.data(), rn * sizeof(uint16_t));  // returns with bits_ free to reuse
    }
  }
  // The fp32 copies: each owner's run of them (one per rank) broadcast from it.
  const std::vector<Engine::Fp32Copy> copies = engine_.fp32_copies();
  const size_t packed =
      copies.empty() ? 0 : static_cast<size_t>(copies.back().data + copies.back().n - copies.front().data);
  copies_.resize(packed);
  if (packed) to_host_(copies_.data(), copies.front().data, packed * sizeof(float));
  for (size_t r = 0; r < ranks_; ++r) {
    const auto [first, last] = packed_run(copies, r * S_, (r + 1) * S_);
    for (size_t at = first; at < last; at += dist::kHostPieceFloats)
      comm_.broadcast(copies_.data() + at, std::min(dist::kHostPieceFloats, last - at), dist::DType::F32,
                      static_cast<int>(r));
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
