// ZeRO-1's data movement (docs/PARALLEL.md): the collectives that give rank r
// the summed gradients of its shard [r*S, min((r+1)*S, total)) (shard_range,
// zero1.h) and every rank every parameter, on the engine's flat buffers.
//   - StagedFlatSync: host collectives (MPI, single process) on a small host
//     staging buffer, chunk by chunk; the engine's buffers are copied in and
//     out with the given copy functions (memcpy for the CPU engine, cudaMemcpy
//     for a GPU engine whose communicator takes host memory);
//   - DirectNccl (zero1_device.cpp): in place on GPU buffers, each layer's
//     gradients reduced as soon as its backward ends.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "dist/comm.h"
#include "model/engine.h"

namespace kvs {

struct ShardRange;

class FlatSync {
 public:
  virtual ~FlatSync() = default;
  // The next backward reduces its buckets as they finish (where supported).
  virtual void overlap_next_backward() {}
  // Every rank's gradients summed into this rank's shard of the engine's
  // gradients; outside the shard they stay this rank's own.
  virtual void reduce_grads() = 0;
  // Every shard of the engine's fp32 parameters from its owner, then the
  // engine's derived copies refreshed (Engine::flat_params_written).
  virtual void all_gather_params() = 0;
  // The fp32 master sharded (Engine::keep_master_range): every shard of the
  // engine's bf16 copy and every part of its fp32 copies from its owner
  // (nothing derived from them to refresh).
  virtual void all_gather_params16() = 0;
};

// Where the packed fp32 copies (Engine::fp32_copies, in layout order) hold
// the values of layout range [lo, hi): one run [first, second) of the packed
// values (a shard, or a shard's part of a range, is a contiguous layout range).
std::pair<size_t, size_t> packed_run(const std::vector<Engine::Fp32Copy>& copies, size_t lo, size_t hi);

class StagedFlatSync final : public FlatSync {
 public:
  // copy(dst, src, bytes): between the engine's memory and host memory.
  using Copy = std::function<void(void* dst, const void* src, size_t bytes)>;
  // The collectives move the shards in chunks: chunk c of every rank's segment
  // [r*S, (r+1)*S) at once, read from and written to the engine's own buffers,
  // so the host holds dp + 1 chunks, never a copy of the whole buffer (the
  // part of the last segment beyond `total` is zeros in the staging only).
  // A chunk is at most kStagingFloats / dp floats and at most `max_count`
  // (MPI counts are ints; tests pass a small one).
  static constexpr size_t kMaxCount = size_t{1} << 30;
  static constexpr size_t kStagingFloats = size_t{4} << 20;  // 16 MiB for the dp chunks
  StagedFlatSync(Engine& engine, dist::Communicator& comm, const ShardRange& shard, Copy to_host, Copy from_host,
                 size_t max_count = kMaxCount);

  void reduce_grads() override;
  void all_gather_params() override;
  // The bf16 shards ride the fp32 host collectives (bf16 -> fp32 -> bf16 is exact).
  void all_gather_params16() override;

  // Floats per segment in one collective, and the host floats held for the
  // collectives (the staging and one chunk; not the sharded master's fp32 copies).
  size_t chunk() const { return chunk_; }
  size_t host_floats() const { return staging_.size() + piece_.size() + (bits_.size() + 1) / 2; }

 private:
  // Where rank r's floats [at, at + k) of its segment lie in the engine's
  // buffer: [first, first + second), empty beyond `total`.
  std::pair<size_t, size_t> segment_part(size_t r, size_t at, size_t k) const;

  Engine& engine_;
  dist::Communicator& comm_;
  size_t rank_, ranks_, S_, total_, chunk_;
  Copy to_host_, from_host_;
  std::vector<float> staging_;   // dp chunks, rank after rank, as the collectives take them
  std::vector<float> piece_;     // this rank's chunk
  std::vector<uint16_t> bits_;   // one chunk of the bf16 copy (sharded master only)
  std::vector<float> copies_;    // the packed fp32 copies (sharded master only)
};

// The engine's kind: StagedFlatSync with memcpy for host buffers, else make_device_flat_sync.
std::unique_ptr<FlatSync> make_flat_sync(Engine& engine, dist::Communicator& comm, const ShardRange& shard);

// GPU buffers (zero1_device.cpp): DirectNccl when the communicator takes GPU
// memory, else StagedFlatSync with cudaMemcpy; a kvs::Error without CUDA.
std::unique_ptr<FlatSync> make_device_flat_sync(Engine& engine, dist::Communicator& comm, const ShardRange& shard);

}  // namespace kvs
