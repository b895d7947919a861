// Communicators: the collectives the trainer needs, behind one interface, with
// three backends (docs/PARALLEL.md):
//   - SingleProcess: world size 1, every collective is a copy or a no-op;
//   - MPI: CPU buffers, for the CPU engine (launched with mpirun);
//   - NCCL: CUDA buffers on the communicator's own stream (compiled with
//     KVS_CUDA; its unique id is handed out by the bootstrap, launch.h). Host
//     buffers are accepted too and staged through a device buffer, so the
//     trainer's host scalars (token counts, loss sums) need no second path.
// Buffers are float or double; `count` is in elements. A collective whose
// sizes disagree across ranks, or a rank that does not arrive, must end in a
// kvs::Error on every rank that can still report (not a hang): backends check
// sizes first (an all-reduce of the counts) and use timeouts where the
// library offers them.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace kvs::dist {

// Max: element-wise maximum (the vocab-parallel cross-entropy's row maxima).
enum class ReduceOp { Sum, Average, Max };
enum class DType { F32, F64 };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "single", "mpi", "nccl"
  // Whether collectives take GPU memory directly (NCCL). The other backends
  // take host memory only: a caller with GPU buffers stages them (ZeRO-1 on the
  // CUDA engine under mpirun, src/parallel/flat_sync.h).
  virtual bool device_memory() const { return false; }

  // In place: buf[0..count) on every rank becomes the reduction over ranks.
  virtual void all_reduce(void* buf, size_t count, DType t, ReduceOp op) = 0;
  // send[0..count*size) on every rank; recv[0..count) on rank r receives the
  // reduction of every rank's send[r*count .. (r+1)*count).
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) = 0;
  // send[0..count) from every rank; recv[0..count*size) holds them in rank order.
  virtual void all_gather(const void* send, void* recv, size_t count, DType t) = 0;
  virtual void broadcast(void* buf, size_t count, DType t, int root) = 0;
  // Bytes from root to every rank (for small host-side messages: ids, configs).
  virtual void broadcast_bytes(void* buf, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Point to point, both at once (a ring step: every rank sends to one rank
  // and receives from another): send[0..count) goes to rank `dest`, recv[0..count)
  // comes from rank `src`. Every rank of a ring calls it together; send and
  // recv must not overlap.
  virtual void send_recv(const void* send, int dest, void* recv, int src, size_t count, DType t) = 0;
  // Point to point for pipeline schedules. isend starts sending buf[0..count)
  // to rank `dest` and returns a request; the buffer must stay unchanged until
  // wait(request) returns. recv blocks until the message from `src` with the
  // same tag has arrived in buf[0..count). Tags keep the messages between two
  // ranks apart (NCCL has none: there the order of sends and receives between
  // two ranks must match, which a schedule's does).
  virtual int isend(const void* buf, size_t count, DType t, int dest, int tag) = 0;
  virtual void wait(int request) = 0;
  virtual void recv(void* buf, size_t count, DType t, int src, int tag) = 0;
  // Point to point, all at once: each op sends buf[0..count) to rank `peer`
  // or receives it from `peer`; returns when every one is done. Under NCCL
  // they are one group, so a send that waits for its receive (as a large NCCL
  // send does) holds up none of the others: a schedule that posts matching
  // groups cannot deadlock (the pipeline's device path, pipeline_schedule.h).
  // The messages between two ranks match in the order both post them; NCCL
  // takes device buffers only.
  struct P2P {
    bool send;
    void* buf;
    size_t count;
    int peer;
  };
  virtual void exchange(const std::vector<P2P>& ops, DType t);
  // A sub-communicator of the ranks with the same color, ordered by key
  // (MPI_Comm_split / ncclCommSplit semantics). Every rank must call it.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
};

// Callers with large HOST buffers (checkpoint gathers) issue collectives in
// pieces of at most this many floats (64 MiB): NCCL stages host memory
// through a device buffer, which must stay small beside a full engine.
constexpr size_t kHostPieceFloats = size_t{16} << 20;

// World size 1.
std::unique_ptr<Communicator> make_single_process();

}  // namespace kvs::dist
