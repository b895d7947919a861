// NCCL communicator. Every NCCL call is made on a non-blocking communicator
// (config.blocking = 0): it may return ncclInProgress, and completion or
// failure is read with ncclCommGetAsyncError, polled against a deadline. On a
// timeout or an error the communicator is aborted (ncclCommAbort stops its
// kernels) and the call throws; the object is unusable afterwards.
#ifdef KVS_CUDA
#include "dist/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/deadline_guard.h"
#include "core/error.h"
#include "kernels/cuda/check.h"

namespace kvs::dist {
namespace {

using Clock = std::chrono::steady_clock;

constexpr cuda::ErrorCheck check_cuda{"NCCL backend"};

ncclDataType_t nccl_type(DType t) { return t == DType::F32 ? ncclFloat32 : ncclFloat64; }
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Average: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

Clock::time_point after(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  return c;
}

// Polls a communicator until its pending NCCL call (init, split, enqueue,
// finalize) has finished; the result, or ncclInProgress after the deadline.
ncclResult_t wait_async(ncclComm_t comm, Clock::time_point deadline) {
  for (;;) {
    ncclResult_t st = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return r;
    if (st != ncclInProgress || Clock::now() > deadline) return st;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

size_t elem_bytes(DType t) { return t == DType::F32 ? sizeof(float) : sizeof(double); }

// Pageable or pinned host memory: NCCL moves device memory only. Older CUDA
// versions report an unregistered host pointer as an error: also host.
bool is_host(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) error
    return true;
  }
  return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
}

class Nccl;

// Every live communicator of the process. When the device does not become
// idle before a collective (wait_device_idle), a watchdog thread aborts them
// all: ncclCommAbort from another thread is NCCL's way out of a hang, and it
// ends the kernels of their collectives that hold the device.
struct LiveComms {
  std::mutex mu;
  std::vector<Nccl*> all;
};
LiveComms& live_comms() {
  static auto* l = new LiveComms;  // never destroyed: safe in exit-time destructors
  return *l;
}

class Nccl final : public Communicator, public AsyncDeviceCollectives {
 public:
  Nccl(ncclComm_t comm, int device, double timeout_s) : comm_(comm), device_(device), timeout_s_(timeout_s) {
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMalloc(&scratch_, 4 * sizeof(int64_t)), "cudaMalloc");
    const std::lock_guard<std::mutex> lock(live_comms().mu);
    live_comms().all.push_back(this);
  }
  ~Nccl() override {
    {
      LiveComms& l = live_comms();
      const std::lock_guard<std::mutex> lock(l.mu);
      l.all.erase(std::remove(l.all.begin(), l.all.end(), this), l.all.end());
    }
    cudaSetDevice(device_);
    if (comm_) {
      // Finalize flushes pending work; if that does not end in time, abort.
      const ncclResult_t r = ncclCommFinalize(comm_);
      if ((r == ncclSuccess || r == ncclInProgress) && wait_async(comm_, after(timeout_s_)) == ncclSuccess)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
    }
    if (staging_) cudaFree(staging_);
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // The watchdog's abort (live_comms' lock held; the owning thread is blocked in wait_device_idle).
  void abort_from_watchdog() {
    if (!comm_) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  bool device_memory() const override { return true; }

  void all_reduce(void* buf, size_t count, DType t, ReduceOp op) override {
    ++seq_;
    check_same("all_reduce", count, 0);
    const size_t bytes = count * elem_bytes(t);
    run_staged("all_reduce", buf, bytes, buf, bytes, [&](const void* s, void* r) {
      return ncclAllReduce(s, r, count, nccl_type(t), nccl_op(op), comm_, stream_);
    });
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
    ++seq_;
    check_same("reduce_scatter", count, 0);
    const size_t bytes = count * elem_bytes(t);
    run_staged("reduce_scatter", send, bytes * size_, recv, bytes, [&](const void* s, void* r) {
      return ncclReduceScatter(s, r, count, nccl_type(t), nccl_op(op), comm_, stream_);
    });
  }
  void all_gather(const void* send, void* recv, size_t count, DType t) override {
    ++seq_;
    check_same("all_gather", count, 0);
    const size_t bytes = count * elem_bytes(t);
    run_staged("all_gather", send, bytes, recv, bytes * size_, [&](const void* s, void* r) {
      return ncclAllGather(s, r, count, nccl_type(t), comm_, stream_);
    });
  }
  void broadcast(void* buf, size_t count, DType t, int root) override {
    ++seq_;
    check_root(root);
    check_same("broadcast", count, root);
    const size_t bytes = count * elem_bytes(t);
    run_staged("broadcast", buf, bytes, buf, bytes, [&](const void* s, void* r) {
      return ncclBroadcast(s, r, count, nccl_type(t), root, comm_, stream_);
    });
  }
  // Pipeline point to point. The send completes before isend returns (NCCL
  // stream-orders it; host buffers are staged), so wait has nothing left to
  // do: a schedule whose sends and receives between two ranks come in the
  // same order cannot deadlock on it. Never run on GPUs yet.
  int isend(const void* buf, size_t count, DType t, int dest, int /*tag*/) override {
    KVS_CHECK(dest >= 0 && dest < size_ && dest != rank_, "isend: rank {} is not a peer among {} ranks", dest, size_);
    const size_t bytes = count * elem_bytes(t);
    run_staged("send", buf, bytes, nullptr, 0, [&](const void* s, void*) {
      return ncclSend(s, count, nccl_type(t), dest, comm_, stream_);
    });
    return 0;
  }
  void wait(int) override {}
  void recv(void* buf, size_t count, DType t, int src, int /*tag*/) override {
    KVS_CHECK(src >= 0 && src < size_ && src != rank_, "recv: rank {} is not a peer among {} ranks", src, size_);
    const size_t bytes = count * elem_bytes(t);
    run_staged("recv", nullptr, 0, buf, bytes, [&](const void*, void* r) {
      return ncclRecv(r, count, nccl_type(t), src, comm_, stream_);
    });
  }
  // One NCCL group (comm.h): device buffers, as the pipeline's device path has.
  void exchange(const std::vector<P2P>& ops, DType t) override {
    if (ops.empty()) return;
    for (const P2P& o : ops) {
      KVS_CHECK(o.peer >= 0 && o.peer < size_ && o.peer != rank_, "exchange: rank {} is not a peer among {} ranks",
                o.peer, size_);
      KVS_CHECK(!is_host(o.buf), "exchange: NCCL point to point takes device buffers (a host buffer for rank {})",
                o.peer);
    }
    run("exchange", [&] {
      ncclResult_t e = ncclGroupStart();
      for (const P2P& o : ops) {
        if (e != ncclSuccess && e != ncclInProgress) break;
        e = o.send ? ncclSend(o.buf, o.count, nccl_type(t), o.peer, comm_, stream_)
                   : ncclRecv(o.buf, o.count, nccl_type(t), o.peer, comm_, stream_);
      }
      const ncclResult_t end = ncclGroupEnd();
      return e == ncclSuccess || e == ncclInProgress ? end : e;
    });
  }
  // One NCCL group of a send and a receive (the ring step of context
  // parallelism). No size check: the peers differ, and NCCL fails on a mismatch.
  void send_recv(const void* send, int dest, void* recv, int src, size_t count, DType t) override {
    KVS_CHECK(dest >= 0 && dest < size_ && src >= 0 && src < size_, "send_recv: rank {} or {} outside {} ranks", dest,
              src, size_);
    const size_t bytes = count * elem_bytes(t);
    run_staged("send_recv", send, bytes, recv, bytes, [&](const void* s, void* r) {
      ncclResult_t e = ncclGroupStart();
      if (e != ncclSuccess) return e;
      e = ncclSend(s, count, nccl_type(t), dest, comm_, stream_);
      if (e == ncclSuccess || e == ncclInProgress) e = ncclRecv(r, count, nccl_type(t), src, comm_, stream_);
      const ncclResult_t end = ncclGroupEnd();
      return e == ncclSuccess || e == ncclInProgress ? end : e;
    });
  }
  // Host bytes go through a device staging buffer (NCCL moves device memory only).
  void broadcast_bytes(void* buf, size_t bytes, int root) override {
    ++seq_;
    check_root(root);
    check_same("broadcast_bytes", bytes, root);
    if (bytes == 0) return;
    grow_staging(bytes);
    if (rank_ == root) check_cuda(cudaMemcpy(staging_, buf, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    run("broadcast_bytes", [&] { return ncclBroadcast(staging_, staging_, bytes, ncclUint8, root, comm_, stream_); });
    check_cuda(cudaMemcpy(buf, staging_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  // A one-element all-reduce that every rank must reach, then a stream sync
  // (max, not sum: repeated barriers must not grow the scratch value).
  void barrier() override {
    ++seq_;
    run("barrier", [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclInt64, ncclMax, comm_, stream_); });
  }
  // AsyncDeviceCollectives: enqueue and return; synchronize() waits.
  void stream_wait(void* cuda_event) override {
    usable("stream_wait");
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(cuda_event), 0), "cudaStreamWaitEvent");
  }
  void reduce_sum_async(const std::vector<Piece>& pieces) override {
    if (pieces.empty()) return;
    enqueue("reduce (ZeRO-1 gradients)", [&] {
      return grouped(pieces, [&](const Piece& p) {
        return ncclReduce(p.buf, p.buf, p.count, p.t == Elem::BF16 ? ncclBfloat16 : ncclFloat32, ncclSum, p.root,
                          comm_, stream_);
      });
    });
  }
  void broadcast_async(const std::vector<Piece>& pieces) override {
    if (pieces.empty()) return;
    enqueue("broadcast (ZeRO-1 parameters)", [&] {
      return grouped(pieces, [&](const Piece& p) {
        return ncclBroadcast(p.buf, p.buf, p.count, p.t == Elem::BF16 ? ncclBfloat16 : ncclFloat32, p.root, comm_,
                             stream_);
      });
    });
  }
  void send_recv_async(const void* send, int dest, void* recv, int src, size_t bytes) override {
    KVS_CHECK(dest >= 0 && dest < size_ && src >= 0 && src < size_, "send_recv_async: rank {} or {} outside {} ranks",
              dest, src, size_);
    KVS_CHECK(bytes % 4 == 0 && !is_host(send) && !is_host(recv),
              "send_recv_async: device buffers of whole fp32 words ({} bytes)", bytes);
    if (bytes == 0) return;
    enqueue("send/receive (context-parallel ring)", [&] {
      ncclResult_t e = ncclGroupStart();
      if (e != ncclSuccess) return e;
      e = ncclSend(send, bytes / 4, ncclFloat32, dest, comm_, stream_);
      if (e == ncclSuccess || e == ncclInProgress) e = ncclRecv(recv, bytes / 4, ncclFloat32, src, comm_, stream_);
      const ncclResult_t end = ncclGroupEnd();
      return e == ncclSuccess || e == ncclInProgress ? end : e;
    });
  }
  void record_done(void* cuda_event) override {
    usable("record_done");
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(cuda_event), stream_), "cudaEventRecord");
  }
  void all_reduce_on_stream(void* buf, size_t count, Elem t, ReduceOp op, void* cuda_stream) override {
    if (count == 0) return;
    enqueue("all-reduce (tensor parallel)", [&] {
      return ncclAllReduce(buf, buf, count, t == Elem::BF16 ? ncclBfloat16 : ncclFloat32,
                           nccl_op(op), comm_, static_cast<cudaStream_t>(cuda_stream));
    });
  }
  void all_gather_on_stream(const void* send, void* recv, size_t count, Elem t, void* cuda_stream) override {
    if (count == 0) return;
    enqueue("all-gather (sequence parallel)", [&] {
      return ncclAllGather(send, recv, count, t == Elem::BF16 ? ncclBfloat16 : ncclFloat32, comm_,
                           static_cast<cudaStream_t>(cuda_stream));
    });
  }
  void reduce_scatter_on_stream(const void* send, void* recv, size_t count, Elem t, ReduceOp op,
                                void* cuda_stream) override {
    if (count == 0) return;
    enqueue("reduce-scatter (sequence parallel)", [&] {
      return ncclReduceScatter(send, recv, count, t == Elem::BF16 ? ncclBfloat16 : ncclFloat32, nccl_op(op), comm_,
                               static_cast<cudaStream_t>(cuda_stream));
    });
  }
  void wait_for_stream(void* cuda_stream, const char* what) override {
    usable(what);
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    poll_stream(static_cast<cudaStream_t>(cuda_stream), what);
  }
  void synchronize() override {
    usable("synchronize");
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    wait_stream("synchronize");
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    KVS_CHECK(color >= 0, "NCCL split: color {} must be non-negative", color);
    usable("split");
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclConfig_t cfg = nonblocking_config();
    ncclComm_t sub = nullptr;
    const ncclResult_t r = ncclCommSplit(comm_, color, key, &sub, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) abort_and_fail("split", r);
    const auto deadline = after(timeout_s_);
    const ncclResult_t parent = wait_async(comm_, deadline);
    const ncclResult_t child = sub ? wait_async(sub, deadline) : ncclInProgress;
    if (parent != ncclSuccess || child != ncclSuccess) {
      if (sub) ncclCommAbort(sub);
      abort_and_fail("split", parent != ncclSuccess ? parent : child);
    }
    return std::make_unique<Nccl>(sub, device_, timeout_s_);
  }

 private:
  void usable(const char* what) const {
    KVS_CHECK(comm_, "NCCL {} on rank {}: the communicator was aborted after an earlier error", what, rank_);
  }
  void check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) abort_and_fail(what, r);
  }
  void check_root(int root) const {
    KVS_CHECK(root >= 0 && root < size_, "NCCL broadcast: root {} outside 0..{}", root, size_ - 1);
  }

  // ncclInProgress here means the deadline passed.
  [[noreturn]] void abort_and_fail(const char* what, ncclResult_t r) {
    std::string why = r == ncclInProgress ? fmt::format("did not complete within {} s (a rank is missing or stuck)",
                                                        timeout_s_)
                                          : fmt::format("failed: {}", ncclGetErrorString(r));
    if (comm_) {
      const char* last = ncclGetLastError(comm_);
      if (r != ncclInProgress && last && *last) why += fmt::format(" ({})", last);
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    // The collective's number: the ranks that time out report theirs; a missing rank reports none.
    fail("NCCL {} on rank {} (collective #{}) {}; communicator aborted", what, rank_, seq_, why);
  }

  // Enqueues one NCCL operation and waits for it (enqueue, then the stream).
  template <class F>
  void run(const char* what, F&& op) {
    usable(what);
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    wait_device_idle(what);  // inputs from any stream are ready
    enqueue(what, op);
    wait_stream(what);
  }

  // cudaDeviceSynchronize has no time limit, and a collective that another
  // stream holds (a tensor-parallel all-reduce whose peer died) would keep it
  // waiting forever. Past the timeout every communicator of the process is
  // aborted, which ends such kernels, and the call fails; if the device is
  // still busy after a grace period (a kernel that never ends), the process
  // ends with the same one-line error: nothing else could unblock it.
  void wait_device_idle(const char* what) {
    const double grace_s = std::min(timeout_s_, 60.0);
    const std::string why = fmt::format(
        "NCCL {} on rank {} (collective #{}): the device did not become idle within {} s before it (a kernel or a "
        "collective on another stream is stuck: a rank missing?)",
        what, rank_, seq_, timeout_s_);
    cudaError_t e = cudaSuccess;
    bool fired = false;
    {
      const DeadlineGuard guard(
          timeout_s_, grace_s,
          [] {
            LiveComms& l = live_comms();
            const std::lock_guard<std::mutex> lock(l.mu);
            for (Nccl* c : l.all) c->abort_from_watchdog();
          },
          [&why, grace_s] {
            std::fprintf(stderr, "kvshift: error: %s; every NCCL communicator aborted, and %g s later the device "
                                 "was still busy: ending the process\n", why.c_str(), grace_s);
            std::fflush(stderr);
            std::_Exit(1);
          });
      e = cudaDeviceSynchronize();
      fired = guard.fired();
    }
    if (fired) fail("{}; every NCCL communicator of this process aborted", why);
    check_cuda(e, "cudaDeviceSynchronize");
  }

  // Makes the NCCL call(s) and polls until the non-blocking communicator has
  // enqueued them (not until they ran: the GPU may still be busy).
  template <class F>
  void enqueue(const char* what, F&& op) {
    usable(what);
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    const ncclResult_t r = op();
    if (r != ncclSuccess && r != ncclInProgress) abort_and_fail(what, r);
    const auto deadline = after(timeout_s_);
    for (;;) {
      ncclResult_t st = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &st), "ncclCommGetAsyncError");
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) abort_and_fail(what, st);
      if (Clock::now() > deadline) abort_and_fail(what, ncclInProgress);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Waits for everything on the stream, watching for asynchronous NCCL errors.
  void wait_stream(const char* what) { poll_stream(stream_, what); }
  void poll_stream(cudaStream_t stream, const char* what) {
    const auto deadline = after(timeout_s_);
    for (;;) {
      ncclResult_t st = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &st), "ncclCommGetAsyncError");
      if (st != ncclSuccess && st != ncclInProgress) abort_and_fail(what, st);
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) check_cuda(e, what);
      if (Clock::now() > deadline) abort_and_fail(what, ncclInProgress);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // One NCCL group of `call(piece)` for every piece.
  template <class F>
  static ncclResult_t grouped(const std::vector<Piece>& pieces, F&& call) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (const Piece& p : pieces) {
      r = call(p);
      if (r != ncclSuccess && r != ncclInProgress) {
        ncclGroupEnd();
        return r;
      }
    }
    return ncclGroupEnd();
  }

  void grow_staging(size_t bytes) {
    if (bytes <= staging_bytes_) return;
    if (staging_) check_cuda(cudaFree(staging_), "cudaFree");
    staging_ = nullptr;
    staging_bytes_ = 0;
    check_cuda(cudaMalloc(&staging_, bytes), "cudaMalloc");
    staging_bytes_ = bytes;
  }

  // run() with device addresses for host buffers: host send data is copied
  // into staging_ first, host results copied out after (in place: one region).
  template <class F>
  void run_staged(const char* what, const void* send, size_t send_bytes, void* recv, size_t recv_bytes, F&& op) {
    const bool host_send = is_host(send), host_recv = is_host(recv), in_place = send == recv;
    if (!host_send && !host_recv) {
      run(what, [&] { return op(send, recv); });
      return;
    }
    const size_t recv_at = host_send ? (send_bytes + 255) / 256 * 256 : 0;
    const size_t need = std::max<size_t>(1, in_place ? send_bytes : recv_at + (host_recv ? recv_bytes : 0));
    grow_staging(need);
    char* st = static_cast<char*>(staging_);
    const void* dsend = host_send ? st : send;
    void* drecv = in_place ? st : (host_recv ? st + recv_at : recv);
    if (host_send && send_bytes) check_cuda(cudaMemcpy(st, send, send_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    run(what, [&] { return op(dsend, drecv); });
    if (host_recv && recv_bytes) check_cuda(cudaMemcpy(recv, drecv, recv_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (staging_bytes_ > kKeepStagingBytes) {  // a one-off large transfer: give the memory back
      check_cuda(cudaFree(staging_), "cudaFree");
      staging_ = nullptr;
      staging_bytes_ = 0;
    }
  }
  static constexpr size_t kKeepStagingBytes = size_t{64} << 20;

  // Every rank must pass the same count and root: max and min over ranks agree.
  void check_same(const char* what, size_t count, int root) {
    const int64_t c = static_cast<int64_t>(count);
    const int64_t host[4] = {c, -c, root, -root};
    check_cuda(cudaMemcpy(scratch_, host, sizeof host, cudaMemcpyHostToDevice), "cudaMemcpy");
    run(what, [&] { return ncclAllReduce(scratch_, scratch_, 4, ncclInt64, ncclMax, comm_, stream_); });
    int64_t m[4];
    check_cuda(cudaMemcpy(m, scratch_, sizeof m, cudaMemcpyDeviceToHost), "cudaMemcpy");
    KVS_CHECK(m[0] == -m[1], "NCCL {} on rank {}: ranks disagree on the size (this rank {}, others from {} to {})",
              what, rank_, c, -m[1], m[0]);
    KVS_CHECK(m[2] == -m[3], "NCCL {} on rank {}: ranks disagree on the root (this rank {}, others from {} to {})",
              what, rank_, root, -m[3], m[2]);
  }

  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  double timeout_s_ = 120;
  int rank_ = 0, size_ = 1;
  int64_t seq_ = 0;  // synchronous collectives started (the same on every rank)
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;  // 4 int64: size checks and the barrier
  void* staging_ = nullptr;  // host buffers' device copies (broadcast_bytes, run_staged)
  size_t staging_bytes_ = 0;
};

}  // namespace

AsyncDeviceCollectives* async_device_collectives(Communicator& comm) { return dynamic_cast<Nccl*>(&comm); }

std::string nccl_unique_id() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  KVS_CHECK(r == ncclSuccess, "ncclGetUniqueId failed: {}", ncclGetErrorString(r));
  return std::string(id.internal, sizeof id.internal);
}

std::unique_ptr<Communicator> make_nccl(const LaunchInfo& info, const std::string& unique_id, int device,
                                        double timeout_s, double collective_timeout_s) {
  KVS_CHECK(unique_id.size() == NCCL_UNIQUE_ID_BYTES, "rank {}: the NCCL unique id has {} bytes, expected {}",
            info.rank, unique_id.size(), NCCL_UNIQUE_ID_BYTES);
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  ncclConfig_t cfg = nonblocking_config();
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, info.world_size, id, info.rank, &cfg);
  if ((r == ncclSuccess || r == ncclInProgress) && comm) r = wait_async(comm, after(timeout_s));
  if (r != ncclSuccess) {
    const std::string last = comm && ncclGetLastError(comm) ? ncclGetLastError(comm) : "";
    if (comm) ncclCommAbort(comm);
    KVS_CHECK(r != ncclInProgress, "rank {}: NCCL init did not complete within {} s (a rank is missing or stuck)",
              info.rank, timeout_s);
    fail("rank {}: NCCL init failed: {}{}", info.rank, ncclGetErrorString(r), last.empty() ? "" : " (" + last + ")");
  }
  return std::make_unique<Nccl>(comm, device, collective_timeout_s);
}

std::unique_ptr<Communicator> make_nccl_world(const LaunchInfo& info, const ShareId& share, double init_timeout_s,
                                              double collective_timeout_s) {
  const int device = select_device(info);
  const std::string id = share(info.rank == 0 ? nccl_unique_id() : std::string());
  return make_nccl(info, id, device, init_timeout_s, collective_timeout_s);
}

}  // namespace kvs::dist
#endif  // KVS_CUDA
