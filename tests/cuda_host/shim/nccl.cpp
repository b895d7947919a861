// NCCL on the host (hostcuda.h): a communicator of one rank is local; more
// ranks run over MPI (started by mpirun), one MPI communicator per NCCL
// communicator (MPI_Comm_split of the world by the unique id, and by color
// for ncclCommSplit). Collectives check that their buffers are device memory,
// as NCCL needs, are queued on their stream like any operation and run, in
// issue order, when the stream is synchronised: every rank issues the same
// collectives in the same order, so the MPI calls match. bf16 is summed as
// NCCL does (each addition in fp32, rounded to bf16). Non-blocking
// communicators never report ncclInProgress: every call completes at once.
#include <cuda_bf16.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hostcuda.h"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;  // MPI_COMM_NULL: a communicator of one rank
  int rank = 0, size = 1;
  bool live = true;
  std::string last_error;
};

namespace hostcuda {
namespace {

std::string g_last_error;  // of calls without a usable communicator

ncclResult_t nccl_fail(ncclComm* c, ncclResult_t r, const std::string& why) {
  (c ? c->last_error : g_last_error) = "host NCCL: " + why;
  return r;
}

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const __nv_bfloat16*>(in);
  auto* b = static_cast<__nv_bfloat16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const __nv_bfloat16*>(in);
  auto* b = static_cast<__nv_bfloat16*>(inout);
  for (int i = 0; i < *len; ++i)
    if (__bfloat162float(a[i]) > __bfloat162float(b[i])) b[i] = a[i];
}

// The MPI type and operation of an NCCL collective; false if not implemented.
bool mpi_of(ncclDataType_t t, ncclRedOp_t op, MPI_Datatype* mt, MPI_Op* mo) {
  static MPI_Op sum16 = MPI_OP_NULL, max16 = MPI_OP_NULL;
  switch (t) {
    case ncclUint8: *mt = MPI_UINT8_T; break;
    case ncclInt32: *mt = MPI_INT32_T; break;
    case ncclInt64: *mt = MPI_INT64_T; break;
    case ncclFloat32: *mt = MPI_FLOAT; break;
    case ncclFloat64: *mt = MPI_DOUBLE; break;
    case ncclBfloat16: *mt = MPI_UINT16_T; break;
    default: return false;
  }
  if (t == ncclBfloat16) {
    if (sum16 == MPI_OP_NULL) {
      MPI_Op_create(bf16_sum, 1, &sum16);
      MPI_Op_create(bf16_max, 1, &max16);
    }
    if (op != ncclSum && op != ncclMax) return false;
    *mo = op == ncclSum ? sum16 : max16;
    return true;
  }
  switch (op) {
    case ncclSum: *mo = MPI_SUM; return true;
    case ncclAvg:  // divide_by_ranks does the rest, for the float types only
      *mo = MPI_SUM;
      return t == ncclFloat32 || t == ncclFloat64;
    case ncclMax: *mo = MPI_MAX; return true;
    case ncclMin: *mo = MPI_MIN; return true;
    default: return false;
  }
}

// ncclAvg is MPI_SUM followed by this on the result (every reduction: a sum where NCCL divides
// would double a dp=2 gradient, and only a check of the gradient norm can see that).
void divide_by_ranks(void* buf, size_t count, ncclDataType_t t, int ranks) {
  if (t == ncclFloat32)
    for (size_t i = 0; i < count; ++i) static_cast<float*>(buf)[i] /= static_cast<float>(ranks);
  if (t == ncclFloat64)
    for (size_t i = 0; i < count; ++i) static_cast<double*>(buf)[i] /= ranks;
}

// Checks a collective's arguments and queues `run` on the stream.
ncclResult_t collective(const char* name, ncclComm* c, cudaStream_t stream, ncclDataType_t t, ncclRedOp_t op,
                        const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                        std::function<void(MPI_Datatype, MPI_Op)> run) {
  if (!c || !c->live) return nccl_fail(c, ncclInvalidArgument, std::string(name) + ": not a live communicator");
  std::string why;
  if (stream_index(stream, &why) < 0) return nccl_fail(c, ncclInvalidArgument, std::string(name) + ": " + why);
  MPI_Datatype mt = MPI_DATATYPE_NULL;
  MPI_Op mo = MPI_OP_NULL;
  if (type_bytes(t) == 0 || (c->mpi != MPI_COMM_NULL && !mpi_of(t, op, &mt, &mo)))
    return nccl_fail(c, ncclInvalidArgument, std::string(name) + ": data type " + std::to_string(t) +
                                                 " with operation " + std::to_string(op) + " is not implemented");
  if (send_bytes && !device_range_ok(send, send_bytes, &why))
    return nccl_fail(c, ncclInvalidArgument, std::string(name) + ": the send buffer " + why);
  if (recv_bytes && !device_range_ok(recv, recv_bytes, &why))
    return nccl_fail(c, ncclInvalidArgument, std::string(name) + ": the receive buffer " + why);
  enqueue(stream, std::string(name) + " (rank " + std::to_string(c->rank) + " of " + std::to_string(c->size) + ")",
          [=] {
            count_collective();
            note_access(reinterpret_cast<uintptr_t>(send), send_bytes, false);
            note_access(reinterpret_cast<uintptr_t>(recv), recv_bytes, true);
            run(mt, mo);
          });
  return ncclSuccess;
}

struct PendingSend {
  MPI_Request request;
  std::vector<char> data;
};
std::list<PendingSend>& pending_sends() {
  static std::list<PendingSend> p;
  return p;
}

// KVS_SHIM_NCCL_RENDEZVOUS=1: a send completes only once its receive has been
// posted (MPI_Issend), as a real NCCL send larger than NCCL's buffers does,
// and the sends and receives of one ncclGroupStart/End complete together at
// the group's end. A schedule that waits on a send its peer receives only
// later then hangs here as it would on GPUs; without the variable sends are
// buffered (they never wait) and such a schedule passes.
bool rendezvous() {
  static const bool on = [] {
    const char* v = std::getenv("KVS_SHIM_NCCL_RENDEZVOUS");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// The open group (rendezvous mode): its requests, completed by the op ncclGroupEnd queues.
struct OpenGroup {
  int depth = 0;
  std::shared_ptr<std::vector<MPI_Request>> requests;
  cudaStream_t stream = nullptr;
  bool has_ops = false;
};
OpenGroup& open_group() {
  static OpenGroup g;
  return g;
}

ncclComm* make_comm(MPI_Comm parent, int color, int key) {
  auto* c = new ncclComm;
  if (parent == MPI_COMM_NULL) return c;
  MPI_Comm_split(parent, color, key, &c->mpi);
  if (c->mpi == MPI_COMM_NULL) {
    delete c;
    return nullptr;
  }
  MPI_Comm_rank(c->mpi, &c->rank);
  MPI_Comm_size(c->mpi, &c->size);
  return c;
}

}  // namespace
}  // namespace hostcuda

using namespace hostcuda;

extern "C" {

ncclResult_t ncclGetVersion(int* v) {
  if (v) *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::random_device rd;
  for (char& ch : id->internal) ch = static_cast<char>(rd());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t*) {
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks)
    return nccl_fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                                       std::to_string(nranks));
  if (nranks == 1) {
    *comm = new ncclComm;
    return ncclSuccess;
  }
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited)
    return nccl_fail(nullptr, ncclInvalidUsage, "a communicator of " + std::to_string(nranks) +
                                                    " ranks runs over MPI: start the ranks with mpirun");
  // The ranks holding this id form the communicator.
  uint32_t color = 0;
  for (char ch : id.internal) color = color * 131 + static_cast<unsigned char>(ch);
  ncclComm* c = make_comm(MPI_COMM_WORLD, static_cast<int>(color & 0x7fffffff), rank);
  if (!c || c->size != nranks || c->rank != rank) {
    const int got = c ? c->size : 0;
    delete c;
    return nccl_fail(nullptr, ncclInvalidUsage, "ncclCommInitRank: " + std::to_string(got) +
                                                    " MPI ranks share the id, expected " + std::to_string(nranks));
  }
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* out, ncclConfig_t*) {
  if (!comm || !comm->live || !out) return nccl_fail(comm, ncclInvalidArgument, "ncclCommSplit: not a live communicator");
  *out = make_comm(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key);
  if (comm->mpi == MPI_COMM_NULL && color == NCCL_SPLIT_NOCOLOR) {
    delete *out;
    *out = nullptr;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return comm ? ncclSuccess : nccl_fail(nullptr, ncclInvalidArgument, "ncclCommFinalize: null");
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return nccl_fail(nullptr, ncclInvalidArgument, "ncclCommDestroy: null");
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm->mpi != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm->mpi);
  comm->live = false;
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  hostcuda::note_nccl_abort();
  return ncclCommDestroy(comm);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* st) {
  if (!comm || !st) return nccl_fail(comm, ncclInvalidArgument, "ncclCommGetAsyncError: null");
  *st = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* n) {
  if (!comm || !n) return nccl_fail(comm, ncclInvalidArgument, "ncclCommCount: null");
  *n = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* r) {
  if (!comm || !r) return nccl_fail(comm, ncclInvalidArgument, "ncclCommUserRank: null");
  *r = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* d) {
  if (!comm || !d) return nccl_fail(comm, ncclInvalidArgument, "ncclCommCuDevice: null");
  return cudaGetDevice(d) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) { return (comm ? comm->last_error : g_last_error).c_str(); }

ncclResult_t ncclGroupStart() {
  hostcuda::OpenGroup& g = hostcuda::open_group();
  if (g.depth++ == 0) {
    g.requests = std::make_shared<std::vector<MPI_Request>>();
    g.has_ops = false;
  }
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  hostcuda::OpenGroup& g = hostcuda::open_group();
  if (g.depth == 0) return hostcuda::nccl_fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g.depth == 0 && g.has_ops) {
    auto requests = g.requests;
    hostcuda::enqueue(g.stream, "ncclGroupEnd", [requests] {
      if (!requests->empty()) MPI_Waitall(static_cast<int>(requests->size()), requests->data(), MPI_STATUSES_IGNORE);
    });
  }
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = count * type_bytes(t);
  ncclComm* c = comm;
  return collective("ncclAllReduce", c, stream, t, op, send, bytes, recv, bytes, [=](MPI_Datatype mt, MPI_Op mo) {
    if (c->mpi == MPI_COMM_NULL) {
      if (send != recv) std::memmove(recv, send, bytes);
      return;
    }
    MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count), mt, mo, c->mpi);
    if (op == ncclAvg) divide_by_ranks(recv, count, t, c->size);
  });
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = count * type_bytes(t);
  ncclComm* c = comm;
  if (c && (root < 0 || root >= c->size))
    return nccl_fail(c, ncclInvalidArgument, "ncclReduce: root " + std::to_string(root));
  const bool is_root = c && c->rank == root;
  return collective("ncclReduce", c, stream, t, op, send, bytes, recv, is_root ? bytes : 0,
                    [=](MPI_Datatype mt, MPI_Op mo) {
                      if (c->mpi == MPI_COMM_NULL) {
                        if (send != recv) std::memmove(recv, send, bytes);
                        return;
                      }
                      const void* s = is_root && send == recv ? MPI_IN_PLACE : send;
                      MPI_Reduce(s, is_root ? recv : nullptr, static_cast<int>(count), mt, mo, root, c->mpi);
                      if (op == ncclAvg && is_root) divide_by_ranks(recv, count, t, c->size);
                    });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  const size_t bytes = count * type_bytes(t);
  ncclComm* c = comm;
  if (c && (root < 0 || root >= c->size))
    return nccl_fail(c, ncclInvalidArgument, "ncclBroadcast: root " + std::to_string(root));
  const bool is_root = c && c->rank == root;
  return collective("ncclBroadcast", c, stream, t, ncclSum, is_root ? send : nullptr, is_root ? bytes : 0, recv, bytes,
                    [=](MPI_Datatype mt, MPI_Op) {
                      if (is_root && send != recv) std::memmove(recv, send, bytes);
                      if (c->mpi != MPI_COMM_NULL) MPI_Bcast(recv, static_cast<int>(count), mt, root, c->mpi);
                    });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = count * type_bytes(t);
  ncclComm* c = comm;
  const size_t n = c ? static_cast<size_t>(c->size) : 1;
  return collective("ncclReduceScatter", c, stream, t, op, send, bytes * n, recv, bytes,
                    [=](MPI_Datatype mt, MPI_Op mo) {
                      if (c->mpi == MPI_COMM_NULL) {
                        std::memmove(recv, send, bytes);
                        return;
                      }
                      MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), mt, mo, c->mpi);
                      if (op == ncclAvg) divide_by_ranks(recv, count, t, c->size);
                    });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
  const size_t bytes = count * type_bytes(t);
  ncclComm* c = comm;
  const size_t n = c ? static_cast<size_t>(c->size) : 1;
  return collective("ncclAllGather", c, stream, t, ncclSum, send, bytes, recv, bytes * n,
                    [=](MPI_Datatype mt, MPI_Op) {
                      const bool in_place = static_cast<const char*>(send) == static_cast<char*>(recv) + c->rank * bytes;
                      if (c->mpi == MPI_COMM_NULL) {
                        if (!in_place) std::memmove(recv, send, bytes);
                        return;
                      }
                      MPI_Allgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(count), mt, recv,
                                    static_cast<int>(count), mt, c->mpi);
                    });
}

// Point to point (the ring step of context parallelism, pipeline stages):
// queued like the collectives. A send copies its data and does not block
// (MPI_Isend), so two ranks that each send before receiving (one NCCL group
// of a send and a receive) cannot deadlock; finished sends are released at
// the next receive.
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  const size_t bytes = count * type_bytes(t);
  ncclComm* c = comm;
  if (c && (peer < 0 || peer >= c->size)) return nccl_fail(c, ncclInvalidArgument, "ncclSend: peer " + std::to_string(peer));
  if (rendezvous()) {
    // In a group: posted now, completed at the group's end; alone: completed before the stream goes on.
    OpenGroup& g = open_group();
    std::shared_ptr<std::vector<MPI_Request>> group = g.depth > 0 ? g.requests : nullptr;
    if (group) g.stream = stream, g.has_ops = true;
    return collective("ncclSend", c, stream, t, ncclSum, send, bytes, nullptr, 0, [=](MPI_Datatype, MPI_Op) {
      if (c->mpi == MPI_COMM_NULL) return;
      MPI_Request r;
      MPI_Issend(send, static_cast<int>(bytes), MPI_BYTE, peer, 0, c->mpi, &r);
      if (group)
        group->push_back(r);
      else
        MPI_Wait(&r, MPI_STATUS_IGNORE);
    });
  }
  return collective("ncclSend", c, stream, t, ncclSum, send, bytes, nullptr, 0, [=](MPI_Datatype, MPI_Op) {
    if (c->mpi == MPI_COMM_NULL) return;
    auto& pending = pending_sends();
    pending.push_back({MPI_REQUEST_NULL, std::vector<char>(static_cast<const char*>(send),
                                                           static_cast<const char*>(send) + bytes)});
    MPI_Isend(pending.back().data.data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, c->mpi, &pending.back().request);
  });
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = count * type_bytes(t);
  ncclComm* c = comm;
  if (c && (peer < 0 || peer >= c->size)) return nccl_fail(c, ncclInvalidArgument, "ncclRecv: peer " + std::to_string(peer));
  if (rendezvous() && open_group().depth > 0) {  // posted now, completed at the group's end
    OpenGroup& g = open_group();
    auto group = g.requests;
    g.stream = stream, g.has_ops = true;
    return collective("ncclRecv", c, stream, t, ncclSum, nullptr, 0, recv, bytes, [=](MPI_Datatype, MPI_Op) {
      if (c->mpi == MPI_COMM_NULL) return;
      MPI_Request r;
      MPI_Irecv(recv, static_cast<int>(bytes), MPI_BYTE, peer, 0, c->mpi, &r);
      group->push_back(r);
    });
  }
  return collective("ncclRecv", c, stream, t, ncclSum, nullptr, 0, recv, bytes, [=](MPI_Datatype, MPI_Op) {
    if (c->mpi == MPI_COMM_NULL) return;
    MPI_Recv(recv, static_cast<int>(bytes), MPI_BYTE, peer, 0, c->mpi, MPI_STATUS_IGNORE);
    auto& pending = pending_sends();
    for (auto it = pending.begin(); it != pending.end();) {
      int done = 0;
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done ? pending.erase(it) : std::next(it);
    }
  });
}

}  // extern "C"
