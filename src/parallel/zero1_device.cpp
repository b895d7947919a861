// ZeRO-1's data movement for engines whose flat buffers are in GPU memory
// ZeRO-1's data movement for engines whose flat buffers are in GPU memory
// (flat_sync.h): DirectNccl, or StagedFlatSync with cudaMemcpy. The staged
// path ran on an H100 (scripts/gpu_check.sh: 2 MPI ranks on one GPU, matching
// one process); the NCCL path needs 2 GPUs and has not run yet.
#include "parallel/flat_sync.h"

#include "core/error.h"
#ifdef KVS_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "dist/nccl_comm.h"
#include "kernels/cuda/check.h"
#include "parallel/zero1.h"
#endif

namespace kvs {

#ifdef KVS_CUDA
namespace {

constexpr cuda::ErrorCheck check{"ZeRO-1 (device buffers)"};

// NCCL on the engine's device buffers, no padding or copies: a range's
// gradients are reduced piece by piece onto the ranks that own them
// (ncclReduce in place, the pieces of one range in one NCCL group), and the
// parameters are broadcast shard by shard from their owners. The sums land
// exactly where a reduce-scatter of the padded buffer puts them.
class DirectNccl final : public FlatSync, public Engine::GradReadyHook {
 public:
  DirectNccl(Engine& e, dist::Communicator& comm, dist::AsyncDeviceCollectives& async, const ShardRange& s)
      : engine_(e), comm_(comm), async_(async), S_(s.padded_size), total_(e.layout().total) {
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
    async_.reduce_sum_async(owner_pieces(engine_.flat_grads(), Elem::F32, begin, end));
    announced_ += end - begin;
  }
  void reduce_grads() override {
    if (armed_) {
      engine_.set_grad_ready_hook(nullptr);
      armed_ = false;
      KVS_CHECK(announced_ == total_, "ZeRO-1 overlap: the backward announced {} of {} gradients", announced_, total_);
    } else {
      async_.reduce_sum_async(owner_pieces(engine_.flat_grads(), Elem::F32, 0, total_));  // the engine's stream is idle
    }
    async_.synchronize();  // the optimizer (and the norm) read the sums
  }
  void all_gather_params() override {
    async_.broadcast_async(owner_pieces(engine_.flat_params(), Elem::F32, 0, total_));
    async_.synchronize();
    engine_.flat_params_written();
  }
  // The sharded master: the bf16 shards (2 bytes a parameter, not 4) and the
  // fp32 copies' parts, from their owners, overlapping the next forward: one
  // NCCL group per range of the engine's forward order (Engine::param_arrival),
  // its event after it, and no wait here; the forward waits for each range
  // just before it reads it.
  void all_gather_params16() override {
    uint16_t* p16 = engine_.flat_params16();
    const std::vector<Engine::Fp32Copy> copies = engine_.fp32_copies();
    const Engine::ParamArrival arrival = engine_.param_arrival();
    const std::vector<size_t>& ends = arrival.ends;
    KVS_CHECK(!ends.empty() && ends.size() == arrival.events.size() && ends.back() == total_,
              "internal error: ZeRO-1's gather needs the engine's forward ranges and their events");
    for (size_t i = 0, lo = 0; i < ends.size(); lo = ends[i++]) {
      std::vector<Piece> pieces = owner_pieces(p16, Elem::BF16, lo, ends[i]);
      for (int r = 0; r < comm_.size(); ++r) {
        const size_t a = std::max(lo, static_cast<size_t>(r) * S_);
        const size_t b = std::min(ends[i], static_cast<size_t>(r + 1) * S_);
        const auto [first, last] = a < b ? packed_run(copies, a, b) : std::pair<size_t, size_t>{0, 0};
        if (first < last) pieces.push_back({copies.front().data + first, last - first, r, Elem::F32});
      }
      async_.broadcast_async(pieces);
      async_.record_done(arrival.events[i]);
    }
    engine_.params_arriving(&async_);
  }

 private:
  using Piece = dist::AsyncDeviceCollectives::Piece;
  using Elem = dist::AsyncDeviceCollectives::Elem;
  // [begin, end) of `buf` (elements of type t) cut at shard boundaries, each piece with its owner as root.
  std::vector<Piece> owner_pieces(void* buf, Elem t, size_t begin, size_t end) const {
    const size_t bytes = t == Elem::BF16 ? 2 : 4;
    std::vector<Piece> out;
    for (size_t lo = begin; lo < end;) {
      const size_t r = lo / S_, hi = std::min(end, (r + 1) * S_);
      out.push_back({static_cast<char*>(buf) + lo * bytes, hi - lo, static_cast<int>(r), t});
      lo = hi;
    }
    return out;
  }

  Engine& engine_;
  dist::Communicator& comm_;
  dist::AsyncDeviceCollectives& async_;
  size_t S_, total_;
  bool armed_ = false;
  size_t announced_ = 0;
};

}  // namespace

std::unique_ptr<FlatSync> make_device_flat_sync(Engine& engine, dist::Communicator& comm, const ShardRange& shard) {
  if (!comm.device_memory()) {
    // MPI or single process: through host buffers. Engine calls return with
    // the GPU idle, so plain cudaMemcpy needs no ordering before the copy; but
    // a copy from pageable memory may return before its DMA has landed, and
    // the engine's non-blocking stream does not wait for the legacy stream:
    // wait for the device after every host-to-device copy.
    auto copy = [](cudaMemcpyKind kind, const char* what) {
      return [kind, what](void* dst, const void* src, size_t bytes) {
        check(cudaMemcpy(dst, src, bytes, kind), what);
        if (kind == cudaMemcpyHostToDevice) check(cudaDeviceSynchronize(), what);
      };
    };
    return std::make_unique<StagedFlatSync>(engine, comm, shard, copy(cudaMemcpyDeviceToHost, "device to host"),
                                            copy(cudaMemcpyHostToDevice, "host to device"));
  }
  dist::AsyncDeviceCollectives* async = dist::async_device_collectives(comm);
  KVS_CHECK(async != nullptr, "ZeRO-1: backend {} takes device memory but has no asynchronous collectives",
            comm.backend());
  return std::make_unique<DirectNccl>(engine, comm, *async, shard);
}

#else

std::unique_ptr<FlatSync> make_device_flat_sync(Engine&, dist::Communicator&, const ShardRange&) {
  fail("ZeRO-1: the engine's buffers are on a GPU, but this kvshift was built without CUDA");
}

#endif

}  // namespace kvs
