// DeviceFlatSync's two implementations (zero1_device.h). Written for a GPU
// and compiled, but the sessions that wrote it had none: scripts/gpu_check.sh
// runs the staged path (2 MPI ranks on one GPU); the NCCL path needs 2 GPUs.
#include "train/zero1_device.h"

#include "core/error.h"
#ifdef KVS_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "dist/nccl_comm.h"
#endif

namespace kvs {

#ifdef KVS_CUDA
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("ZeRO-1 (device buffers): {}: {}", what, cudaGetErrorString(e));
}

// MPI or single process: copy to pinned host buffers, run the host
// collectives, copy back. Engine calls return with the GPU idle, so plain
// cudaMemcpy needs no stream ordering.
class StagedThroughHost final : public DeviceFlatSync {
 public:
  StagedThroughHost(Engine& e, dist::Communicator& comm, const ShardRange& s)
      : engine_(e), comm_(comm), shard_(s), total_(e.layout().total), padded_n_(s.padded_size * comm.size()) {
    check(cudaMallocHost(&padded_, padded_n_ * sizeof(float)), "cudaMallocHost");
    check(cudaMallocHost(&piece_, shard_.padded_size * sizeof(float)), "cudaMallocHost");
    std::memset(padded_, 0, padded_n_ * sizeof(float));  // the padding stays zero
    std::memset(piece_, 0, shard_.padded_size * sizeof(float));
  }
  ~StagedThroughHost() override {
    if (padded_) cudaFreeHost(padded_);
    if (piece_) cudaFreeHost(piece_);
  }
  void overlap_next_backward() override {}  // the host needs the whole buffer: nothing to overlap
  void reduce_grads() override {
    float* g = engine_.flat_grads();
    check(cudaMemcpy(padded_, g, total_ * sizeof(float), cudaMemcpyDeviceToHost), "gradients to the host");
    comm_.reduce_scatter(padded_, piece_, shard_.padded_size, dist::DType::F32, dist::ReduceOp::Sum);
    check(cudaMemcpy(g + shard_.begin, piece_, (shard_.end - shard_.begin) * sizeof(float), cudaMemcpyHostToDevice),
          "gradient shard to the device");
  }
  void all_gather_params() override {
    float* p = engine_.flat_params();
    const size_t n = shard_.end - shard_.begin;
    check(cudaMemcpy(piece_, p + shard_.begin, n * sizeof(float), cudaMemcpyDeviceToHost), "parameter shard to the host");
    std::fill(piece_ + n, piece_ + shard_.padded_size, 0.0f);
    comm_.all_gather(piece_, padded_, shard_.padded_size, dist::DType::F32);
    check(cudaMemcpy(p, padded_, total_ * sizeof(float), cudaMemcpyHostToDevice), "parameters to the device");
    engine_.flat_params_written();
  }

 private:
  Engine& engine_;
  dist::Communicator& comm_;
  ShardRange shard_;
  size_t total_, padded_n_;
  float* padded_ = nullptr;  // dp*S, pinned
  float* piece_ = nullptr;   // S, pinned
};

// NCCL on the engine's device buffers, no padding or copies: a range's
// gradients are reduced piece by piece onto the ranks that own them
// (ncclReduce in place, the pieces of one range in one NCCL group), and the
// parameters are broadcast shard by shard from their owners. The sums land
// exactly where a reduce-scatter of the padded buffer puts them.
class DirectNccl final : public DeviceFlatSync, public Engine::GradReadyHook {
 public:
  DirectNccl(Engine& e, dist::Communicator& comm, dist::AsyncDeviceCollectives& async, const ShardRange& s)
      : engine_(e), async_(async), S_(s.padded_size), total_(e.layout().total) {
    // The async ops exchange no sizes: check once that every rank has the same layout.
    double t[2] = {static_cast<double>(total_), -static_cast<double>(total_)};
    comm.all_reduce(t, 2, dist::DType::F64, dist::ReduceOp::Max);
    KVS_CHECK(t[0] == -t[1], "ZeRO-1: ranks disagree on the parameter count ({} here, {} to {} over ranks)", total_,
              -t[1], t[0]);
  }
  ~DirectNccl() override {
    if (armed_) engine_.set_grad_ready_hook(nullptr);
  }

  void overlap_next_backward() override {
    if (!engine_.announces_ready_grads()) return;
    engine_.set_grad_ready_hook(this);
    armed_ = true;
    announced_ = 0;
  }
  // Called by the engine inside its backward, on the host thread that
  // enqueues the kernels: the comm stream waits for the event, then reduces.
  void grads_ready(size_t begin, size_t end, void* cuda_event) override {
    async_.stream_wait(cuda_event);
    async_.reduce_sum_async(owner_pieces(engine_.flat_grads(), begin, end));
    announced_ += end - begin;
  }
  void reduce_grads() override {
    if (armed_) {
      engine_.set_grad_ready_hook(nullptr);
      armed_ = false;
      KVS_CHECK(announced_ == total_, "ZeRO-1 overlap: the backward announced {} of {} gradients", announced_, total_);
    } else {
      async_.reduce_sum_async(owner_pieces(engine_.flat_grads(), 0, total_));  // the engine's stream is idle
    }
    async_.synchronize();  // the optimizer (and the norm) read the sums
  }
  void all_gather_params() override {
    async_.broadcast_async(owner_pieces(engine_.flat_params(), 0, total_));
    async_.synchronize();
    engine_.flat_params_written();
  }

 private:
  // [begin, end) cut at shard boundaries, each piece with its owner as root.
  std::vector<dist::AsyncDeviceCollectives::Piece> owner_pieces(float* buf, size_t begin, size_t end) const {
    std::vector<dist::AsyncDeviceCollectives::Piece> out;
    for (size_t lo = begin; lo < end;) {
      const size_t r = lo / S_, hi = std::min(end, (r + 1) * S_);
      out.push_back({buf + lo, hi - lo, static_cast<int>(r)});
      lo = hi;
    }
    return out;
  }

  Engine& engine_;
  dist::AsyncDeviceCollectives& async_;
  size_t S_, total_;
  bool armed_ = false;
  size_t announced_ = 0;
};

}  // namespace

std::unique_ptr<DeviceFlatSync> make_device_flat_sync(Engine& engine, dist::Communicator& comm,
                                                      const ShardRange& shard) {
  if (!comm.device_memory()) return std::make_unique<StagedThroughHost>(engine, comm, shard);
  dist::AsyncDeviceCollectives* async = dist::async_device_collectives(comm);
  KVS_CHECK(async != nullptr, "ZeRO-1: backend {} takes device memory but has no asynchronous collectives",
            comm.backend());
  return std::make_unique<DirectNccl>(engine, comm, *async, shard);
}

#else

std::unique_ptr<DeviceFlatSync> make_device_flat_sync(Engine&, dist::Communicator&, const ShardRange&) {
  fail("ZeRO-1: the engine's buffers are on a GPU, but this kvshift was built without CUDA");
}

#endif

}  // namespace kvs
