// The world-size-1 communicator: reductions over one rank are the identity.
#include <cstring>

#include "core/error.h"
#include "dist/comm.h"

namespace kvs::dist {
namespace {

size_t elem_size(DType t) { return t == DType::F32 ? sizeof(float) : sizeof(double); }

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }
  void all_reduce(void*, size_t, DType, ReduceOp) override {}
  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp) override {
    if (send != recv) std::memmove(recv, send, count * elem_size(t));
  }
  void all_gather(const void* send, void* recv, size_t count, DType t) override {
    if (send != recv) std::memmove(recv, send, count * elem_size(t));
  }
  void broadcast(void*, size_t, DType, int root) override { check_root(root); }
  void broadcast_bytes(void*, size_t, int root) override { check_root(root); }
  void barrier() override {}
  int isend(const void*, size_t, DType, int dest, int) override {
    fail("isend: rank {} outside a world of 1 rank (a pipeline needs more processes)", dest);
  }
  void wait(int) override {}
  void recv(void*, size_t, DType, int src, int) override {
    fail("recv: rank {} outside a world of 1 rank (a pipeline needs more processes)", src);
  }
  void send_recv(const void* send, int dest, void* recv, int src, size_t count, DType t) override {
    KVS_CHECK(dest == 0 && src == 0, "send_recv: rank {} or {} outside a world of 1 rank", dest, src);
    std::memcpy(recv, send, count * elem_size(t));
  }
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<SingleProcess>(); }

 private:
  static void check_root(int root) { KVS_CHECK(root == 0, "broadcast: root {} outside a world of 1 rank", root); }
};

}  // namespace

std::unique_ptr<Communicator> make_single_process() { return std::make_unique<SingleProcess>(); }

// The backends with peers (MPI, NCCL) override it.
void Communicator::exchange(const std::vector<P2P>& ops, DType) {
  if (!ops.empty())
    fail("exchange: point to point to rank {} on the '{}' backend, which has no peers", ops[0].peer, backend());
}

}  // namespace kvs::dist
