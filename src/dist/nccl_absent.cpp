// The NCCL entry points of a CUDA build made without NCCL (CMake did not find
// nccl.h and libnccl, or -DKVS_WITH_NCCL=OFF): one GPU works as usual (its
// world is "single", world.cpp); anything that needs NCCL stops with one line
// saying how to rebuild. CMake compiles this file or nccl_comm.cpp, never both.
#ifdef KVS_CUDA
#include "core/error.h"
#include "dist/nccl_comm.h"

namespace kvs::dist {
namespace {

[[noreturn]] void no_nccl(const LaunchInfo& l) {
  fail("rank {}: {} ranks on CUDA need NCCL, but this kvshift was built without it (one GPU in one process works); "
       "rebuild with NCCL: cmake -DKVS_NCCL_INCLUDE=<dir of nccl.h> -DKVS_NCCL_LIB=<path of libnccl.so> (docs/CUDA.md)",
       l.rank, l.world_size);
}

}  // namespace

AsyncDeviceCollectives* async_device_collectives(Communicator&) { return nullptr; }

std::string nccl_unique_id() { no_nccl(detect_launch()); }

std::unique_ptr<Communicator> make_nccl(const LaunchInfo& info, const std::string&, int, double, double) {
  no_nccl(info);
}

std::unique_ptr<Communicator> make_nccl_world(const LaunchInfo& info, const ShareId&, double, double) {
  no_nccl(info);
}

}  // namespace kvs::dist
#endif  // KVS_CUDA
