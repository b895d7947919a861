// MPI collectives behind Communicator. Every collective first agrees on the
// element count (one small MPI_Allreduce of {-count, count} with MPI_MIN), so
// mismatched sizes end in a kvs::Error on every rank instead of a hang or a
// buffer overrun.
#include "dist/mpi_comm.h"

#include <mpi.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"

namespace kvs::dist {
namespace {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<size_t>(len));
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) fail("MPI {}: {}", what, mpi_error_string(rc));
}

MPI_Datatype mpi_type(DType t) { return t == DType::F32 ? MPI_FLOAT : MPI_DOUBLE; }
// Average is a sum followed by a division (MPI has no average operation).
MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

std::shared_ptr<MpiRuntime> runtime() {
  // One runtime per process, shared by every communicator (weak: finalised
  // when the last communicator is destroyed).
  static std::mutex mu;
  static std::weak_ptr<MpiRuntime> weak;
  std::lock_guard<std::mutex> lock(mu);
  auto rt = weak.lock();
  if (!rt) {
    rt = std::make_shared<MpiRuntime>();
    weak = rt;
  }
  return rt;
}

class MpiComm final : public Communicator {
 public:
  MpiComm(std::shared_ptr<MpiRuntime> rt, MPI_Comm comm, bool owned) : rt_(std::move(rt)), comm_(comm), owned_(owned) {
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "Comm_size");
  }
  ~MpiComm() override {
    if (owned_) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce(void* buf, size_t count, DType t, ReduceOp op) override {
    agree(count, "all_reduce");
    check(MPI_Allreduce(MPI_IN_PLACE, buf, as_int(count), mpi_type(t), mpi_op(op), comm_), "Allreduce");
    if (op == ReduceOp::Average) scale(buf, count, t);
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
    agree(count, "reduce_scatter");
    check(MPI_Reduce_scatter_block(send, recv, as_int(count), mpi_type(t), mpi_op(op), comm_), "Reduce_scatter_block");
    if (op == ReduceOp::Average) scale(recv, count, t);
  }
  void all_gather(const void* send, void* recv, size_t count, DType t) override {
    agree(count, "all_gather");
    check(MPI_Allgather(send, as_int(count), mpi_type(t), recv, as_int(count), mpi_type(t), comm_), "Allgather");
  }
  void broadcast(void* buf, size_t count, DType t, int root) override {
    agree(count, "broadcast");
    check_root(root);
    check(MPI_Bcast(buf, as_int(count), mpi_type(t), root, comm_), "Bcast");
  }
  void broadcast_bytes(void* buf, size_t bytes, int root) override {
    agree(bytes, "broadcast_bytes");
    check_root(root);
    check(MPI_Bcast(buf, as_int(bytes), MPI_BYTE, root, comm_), "Bcast");
  }
  void barrier() override { check(MPI_Barrier(comm_), "Barrier"); }
  int isend(const void* buf, size_t count, DType t, int dest, int tag) override {
    KVS_CHECK(dest >= 0 && dest < size_ && dest != rank_, "isend: rank {} is not a peer among {} ranks", dest, size_);
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Isend(buf, as_int(count), mpi_type(t), dest, tag, comm_, &r), "Isend");
    const int id = next_request_++;
    requests_[id] = r;
    return id;
  }
  void wait(int request) override {
    auto it = requests_.find(request);
    KVS_CHECK(it != requests_.end(), "wait: no pending request {}", request);
    MPI_Request r = it->second;
    requests_.erase(it);
    check(MPI_Wait(&r, MPI_STATUS_IGNORE), "Wait");
  }
  void recv(void* buf, size_t count, DType t, int src, int tag) override {
    KVS_CHECK(src >= 0 && src < size_ && src != rank_, "recv: rank {} is not a peer among {} ranks", src, size_);
    // A message longer than count is MPI_ERR_TRUNCATE: sizes cannot silently disagree.
    check(MPI_Recv(buf, as_int(count), mpi_type(t), src, tag, comm_, MPI_STATUS_IGNORE), "Recv");
  }
  void send_recv(const void* send, int dest, void* recv, int src, size_t count, DType t) override {
    KVS_CHECK(dest >= 0 && dest < size_ && src >= 0 && src < size_, "send_recv: rank {} or {} outside {} ranks", dest,
              src, size_);
    // A receive shorter than the message is MPI_ERR_TRUNCATE: sizes cannot silently disagree.
    check(MPI_Sendrecv(send, as_int(count), mpi_type(t), dest, kSendRecvTag, recv, as_int(count), mpi_type(t), src,
                       kSendRecvTag, comm_, MPI_STATUS_IGNORE),
          "Sendrecv");
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &sub), "Comm_split");
    return std::make_unique<MpiComm>(rt_, sub, true);
  }

 private:
  // Every rank must pass the same count; the check is itself a collective of
  // a fixed size, so it cannot mismatch.
  void agree(size_t count, const char* what) {
    int64_t v[2] = {-static_cast<int64_t>(count), static_cast<int64_t>(count)};
    check(MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT64_T, MPI_MIN, comm_), "Allreduce (size check)");
    const int64_t max = -v[0], min = v[1];
    if (min != max)
      fail("{}: ranks passed different sizes (min {}, max {} elements; rank {} passed {}) across {} ranks", what, min,
           max, rank_, count, size_);
  }
  void check_root(int root) const {
    KVS_CHECK(root >= 0 && root < size_, "broadcast: root {} outside a world of {} ranks", root, size_);
  }
  static int as_int(size_t count) {
    KVS_CHECK(count <= static_cast<size_t>(INT32_MAX), "MPI collective: {} elements exceed the int count limit", count);
    return static_cast<int>(count);
  }
  void scale(void* buf, size_t count, DType t) const {
    if (t == DType::F32) {
      auto* p = static_cast<float*>(buf);
      const float s = 1.0f / static_cast<float>(size_);
      for (size_t i = 0; i < count; ++i) p[i] *= s;
    } else {
      auto* p = static_cast<double*>(buf);
      const double s = 1.0 / size_;
      for (size_t i = 0; i < count; ++i) p[i] *= s;
    }
  }

  static constexpr int kSendRecvTag = 17;
  std::map<int, MPI_Request> requests_;  // isend's, until waited for
  int next_request_ = 0;
  std::shared_ptr<MpiRuntime> rt_;
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

MpiRuntime::MpiRuntime() {
  int inited = 0;
  check(MPI_Initialized(&inited), "Initialized");
  if (inited) return;
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "Init_thread");
  owns_ = true;
  check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "Comm_set_errhandler");
  KVS_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI: the library gives thread level {}, need MPI_THREAD_FUNNELED",
            provided);
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

std::unique_ptr<Communicator> make_mpi_world() { return std::make_unique<MpiComm>(runtime(), MPI_COMM_WORLD, false); }

void mpi_abort_if_running(int code) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

}  // namespace kvs::dist
