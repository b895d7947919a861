#include "parallel/parallel_groups.h"

#include "core/error.h"

namespace kvs {

ParallelGroups ParallelGroups::make(dist::Communicator& world, int tp, int cp, bool sequence_parallel) {
  const int n = world.size(), r = world.rank();
  if (cp == 1) {
    KVS_CHECK(tp >= 1 && n % tp == 0,
              "parallel.tp ({}) must divide the number of processes ({}): the world is dp x tp ranks", tp, n);
  } else {
    KVS_CHECK(tp >= 1 && cp >= 1 && n % (tp * cp) == 0,
              "parallel.tp x parallel.cp ({} x {}) must divide the number of processes ({}): the world is dp x cp x "
              "tp ranks",
              tp, cp, n);
  }
  ParallelGroups g;
  g.tp = tp;
  g.cp = cp;
  g.dp = n / (tp * cp);
  g.sequence_parallel = sequence_parallel;
  g.tp_rank = r % tp;
  g.cp_rank = r / tp % cp;
  g.dp_rank = r / (tp * cp);
  // One split per group; a group of the whole world is the world itself, a
  // group of one rank a single-process communicator.
  auto group = [&](std::shared_ptr<dist::Communicator>& owned, int size, int color, int key) {
    if (size == n) return &world;
    owned = size == 1 ? dist::make_single_process() : world.split(color, key);
    return owned.get();
  };
  const int replica = g.dp_rank, slice = g.tp_rank;
  g.tp_comm = group(g.owned_tp_, tp, replica * cp + g.cp_rank, g.tp_rank);
  g.cp_comm = group(g.owned_cp_, cp, replica * tp + slice, g.cp_rank);
  g.dp_comm = group(g.owned_dp_, g.dp, g.cp_rank * tp + slice, g.dp_rank);
  g.grad_comm = group(g.owned_grad_, g.dp * cp, slice, g.dp_rank * cp + g.cp_rank);
  return g;
}

}  // namespace kvs
