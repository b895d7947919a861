#include "dist/world.h"

#include "core/error.h"
#include "dist/bootstrap.h"
#include "dist/mpi_comm.h"
#ifdef KVS_CUDA
#include "dist/nccl_comm.h"
#endif

namespace kvs::dist {

std::string world_backend(const LaunchInfo& l, Device device) {
  if (l.launcher == "mpirun") return "mpi";
  if (l.world_size == 1) return "single";
  // torchrun with several ranks. The check needs only the environment and the
  // config, which every rank has, so every rank fails here at once on its own:
  // no rank is left waiting for another (no bootstrap needed to agree).
  KVS_CHECK(device == Device::Cuda,
            "rank {}/{}: torchrun started {} ranks on device \"{}\", but the CPU backend's collectives are MPI, which "
            "needs mpirun: launch CPU runs with `mpirun -np {} kvshift ...` (docs/LAUNCH.md)",
            l.rank, l.world_size, l.world_size, device, l.world_size);
  return "nccl";
}

std::unique_ptr<Communicator> make_world(Device device) {
  const LaunchInfo l = detect_launch();
  const std::string backend = world_backend(l, device);
  if (backend == "mpi") return make_mpi_world();
  if (backend == "single") return make_single_process();
#ifdef KVS_CUDA
  // The bootstrap hands rank 0's NCCL id to every rank (torchrun's agent owns
  // MASTER_PORT, so it listens on MASTER_PORT+1); NCCL init shares its
  // timeout and collectives have their own, longer one (bootstrap.h), so a
  // missing rank is an error, not a hang.
  const BootstrapOptions opt = bootstrap_options(l);
  return make_nccl_world(
      l, [&](const std::string& id) { return bootstrap_exchange(l, opt, id); }, opt.timeout_s,
      opt.collective_timeout_s);
#else
  fail("rank {}: device \"cuda\" under torchrun needs NCCL, but this kvshift was built without CUDA (configure with "
       "-DKVS_CUDA=ON)",
       l.rank);
#endif
}

void abort_world(int code) { mpi_abort_if_running(code); }

}  // namespace kvs::dist
