// The NCCL backend of Communicator (built with KVS_CUDA only): device buffers,
// the communicator's own CUDA stream, non-blocking NCCL communicators polled
// against a deadline so that a missing or stuck rank ends in a kvs::Error on
// the ranks that are still alive instead of a hang (docs/LAUNCH.md).
//
// Collectives are synchronous: each one first waits for the device to be idle
// (so inputs written on any stream are complete), then returns once the result
// is in the buffer. Host buffers (detected with cudaPointerGetAttributes) are
// staged through a device buffer of the communicator, grown on demand.
// AsyncDeviceCollectives below is the exception: ops that do not wait.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/launch.h"

namespace kvs::dist {

// Binds this process to GPU local_rank % device count and returns its index.
int select_device(const LaunchInfo& info);

// A fresh NCCL unique id (NCCL_UNIQUE_ID_BYTES bytes); rank 0 makes it.
std::string nccl_unique_id();

// All ranks' communicator on `device`, from the id every rank holds. Init
// gives up after `init_timeout_s`, every later collective (and split) after
// `collective_timeout_s`, aborting the communicator.
std::unique_ptr<Communicator> make_nccl(const LaunchInfo& info, const std::string& unique_id, int device,
                                        double init_timeout_s, double collective_timeout_s);

// Hands rank 0's id to every rank: bootstrap_exchange under torchrun, an
// MPI_Bcast under mpirun. Given rank 0's id (ignored elsewhere), returns it.
using ShareId = std::function<std::string(const std::string& id_on_rank0)>;

// Device collectives that return without waiting, for ZeRO-1's gradient
// reduction overlapped with the backward (docs/PARALLEL.md). Everything goes
// onto the communicator's stream in call order; every rank must make the same
// calls in the same order (no size check is exchanged: the caller's plan is
// checked once). The NCCL communicator is the only implementation.
class AsyncDeviceCollectives {
 public:
  enum class Elem { F32, BF16 };
  struct Piece {
    void* buf;     // device, in place
    size_t count;  // elements of type t
    int root;
    Elem t = Elem::F32;
  };
  virtual ~AsyncDeviceCollectives() = default;
  // Later ops wait for `cuda_event` (a cudaEvent_t recorded on another stream).
  virtual void stream_wait(void* cuda_event) = 0;
  // Each piece summed over ranks onto its root (ncclReduce in place), one NCCL group.
  virtual void reduce_sum_async(const std::vector<Piece>& pieces) = 0;
  // Each piece from its root to every rank (ncclBroadcast in place), one NCCL group.
  virtual void broadcast_async(const std::vector<Piece>& pieces) = 0;
  // The ring step of context parallelism (send to dest, receive from src:
  // one NCCL group) on the communicator's stream, not waited for: order it
  // after the writer with stream_wait, and the reader after record_done's event.
  virtual void send_recv_async(const void* send, int dest, void* recv, int src, size_t bytes) = 0;
  // Records `cuda_event` (a cudaEvent_t) on the communicator's stream: it
  // completes once everything enqueued so far has.
  virtual void record_done(void* cuda_event) = 0;
  // Blocks until everything enqueued has finished; a kvs::Error after the timeout.
  virtual void synchronize() = 0;
  // In-place all-reduce of a device buffer enqueued on the CALLER's stream
  // (a cudaStream_t), not the communicator's: tensor parallelism's
  // activation all-reduces, ordered with the engine's kernels without a host
  // wait. bf16 is summed by NCCL (ncclBfloat16), as Megatron does.
  virtual void all_reduce_on_stream(void* buf, size_t count, Elem t, ReduceOp op, void* cuda_stream) = 0;
  // Sequence parallelism's edges, on the caller's stream like all_reduce_on_stream:
  // recv [size x count] = every rank's send [count], in rank order ...
  virtual void all_gather_on_stream(const void* send, void* recv, size_t count, Elem t, void* cuda_stream) = 0;
  // ... and recv [count] = this rank's block of the sum over ranks of send [size x count].
  virtual void reduce_scatter_on_stream(const void* send, void* recv, size_t count, Elem t, ReduceOp op,
                                        void* cuda_stream) = 0;
  // Blocks until `cuda_stream` (the caller's, holding all_reduce_on_stream
  // work) is idle, watching this communicator's asynchronous errors: a peer
  // that died or stalls ends in a kvs::Error after the timeout, not a hang.
  virtual void wait_for_stream(void* cuda_stream, const char* what) = 0;
};
// The communicator's async interface, or null when it is not NCCL.
AsyncDeviceCollectives* async_device_collectives(Communicator& comm);

// select_device + nccl_unique_id on rank 0 + `share` + make_nccl.
std::unique_ptr<Communicator> make_nccl_world(const LaunchInfo& info, const ShareId& share, double init_timeout_s,
                                              double collective_timeout_s);

}  // namespace kvs::dist
