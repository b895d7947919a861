// ZeRO-1's data movement for engines whose flat fp32 buffers are in GPU
// memory (the CUDA engine), docs/PARALLEL.md "Data parallel on CUDA":
//   - a communicator that takes GPU memory (NCCL): in-place reduces and
//     broadcasts on the engine's buffers, each layer's gradients reduced as
//     soon as its backward ends, on the communicator's stream;
//   - one that takes host memory (MPI, single process): the buffers are
//     staged through pinned host copies, after the backward (no overlap).
// Either way rank r ends with the sums of its shard [r*S, min((r+1)*S, total))
// (shard_range, zero1.h) and every rank with every parameter.
#pragma once
#include <memory>

#include "dist/comm.h"
#include "model/engine.h"
#include "train/zero1.h"

namespace kvs {

class DeviceFlatSync {
 public:
  virtual ~DeviceFlatSync() = default;
  // The next backward reduces its buckets as they finish (where supported).
  virtual void overlap_next_backward() = 0;
  // Every rank's gradients summed into this rank's shard of the engine's
  // gradients; outside the shard they stay this rank's own.
  virtual void reduce_grads() = 0;
  // Every shard of the engine's fp32 parameters from its owner, then the
  // engine's derived copies refreshed (Engine::flat_params_written).
  virtual void all_gather_params() = 0;
};

// NCCL (comm.device_memory()) or staged; a kvs::Error in a build without CUDA.
std::unique_ptr<DeviceFlatSync> make_device_flat_sync(Engine& engine, dist::Communicator& comm,
                                                      const ShardRange& shard);

}  // namespace kvs
