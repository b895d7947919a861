#include "parallel/parallel_groups.h"

#include "core/error.h"

namespace kvs {

ParallelGroups ParallelGroups::make(dist::Communicator& world, int tp) {
  const int n = world.size();
  KVS_CHECK(tp >= 1 && n % tp == 0,
            "parallel.tp ({}) must divide the number of processes ({}): the world is dp x tp ranks", tp, n);
  ParallelGroups g;
  g.tp = tp;
  g.dp = n / tp;
  g.tp_rank = world.rank() % tp;
  g.dp_rank = world.rank() / tp;
  if (tp == 1) {
    // Without tensor parallelism the world is the data-parallel group, as before.
    g.owned_tp_ = dist::make_single_process();
    g.tp_comm = g.owned_tp_.get();
    g.dp_comm = &world;
    return g;
  }
  g.owned_tp_ = world.split(g.dp_rank, g.tp_rank);
  g.owned_dp_ = world.split(g.tp_rank, g.dp_rank);
  g.tp_comm = g.owned_tp_.get();
  g.dp_comm = g.owned_dp_.get();
  return g;
}

}  // namespace kvs
