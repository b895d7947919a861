#include "parallel/parallel_groups.h"

#include "core/error.h"

namespace kvs {

ParallelGroups ParallelGroups::make(dist::Communicator& world, int tp, int cp, bool sequence_parallel, int pp,
                                    bool tied_embeddings) {
  const int n = world.size(), r = world.rank();
  if (cp == 1 && pp == 1) {
    KVS_CHECK(tp >= 1 && n % tp == 0,
              "parallel.tp ({}) must divide the number of processes ({}): the world is dp x tp ranks", tp, n);
  } else if (pp == 1) {
    KVS_CHECK(tp >= 1 && cp >= 1 && n % (tp * cp) == 0,
              "parallel.tp x parallel.cp ({} x {}) must divide the number of processes ({}): the world is dp x cp x "
              "tp ranks",
              tp, cp, n);
  } else {
    KVS_CHECK(tp >= 1 && cp >= 1 && pp >= 1 && n % (tp * cp * pp) == 0,
              "parallel.tp x parallel.cp x parallel.pp ({} x {} x {}) must divide the number of processes ({}): the "
              "world is dp x pp x cp x tp ranks",
              tp, cp, pp, n);
  }
  ParallelGroups g;
  g.tp = tp;
  g.cp = cp;
  g.pp = pp;
  g.dp = n / (tp * cp * pp);
  g.sequence_parallel = sequence_parallel;
  g.tp_rank = r % tp;
  g.cp_rank = r / tp % cp;
  g.pp_rank = r / (tp * cp) % pp;
  g.dp_rank = r / (tp * cp * pp);
  // One split per group (color: what its members share; key: the rank inside);
  // a group of the whole world is the world itself, one of a single rank a
  // single-process communicator.
  auto group = [&](std::shared_ptr<dist::Communicator>& owned, int size, int color, int key) {
    if (size == n) return &world;
    owned = size == 1 ? dist::make_single_process() : world.split(color, key);
    return owned.get();
  };
  const int d = g.dp_rank, p = g.pp_rank, c = g.cp_rank, t = g.tp_rank;
  g.tp_comm = group(g.owned_tp_, tp, (d * pp + p) * cp + c, t);
  g.cp_comm = group(g.owned_cp_, cp, (d * pp + p) * tp + t, c);
  g.pp_comm = group(g.owned_pp_, pp, (d * cp + c) * tp + t, p);
  g.dp_comm = group(g.owned_dp_, g.dp, (p * cp + c) * tp + t, d);
  g.grad_comm = group(g.owned_grad_, g.dp * cp, p * tp + t, d * cp + c);
  if (pp > 1 && tied_embeddings) {
    // Every rank takes part in the split; only the first and last stage's group is used.
    const bool ends = p == 0 || p == pp - 1;
    g.owned_embed_ = world.split(((d * cp + c) * tp + t) * 2 + (ends ? 0 : 1), p);
    if (ends) g.embed_comm = g.owned_embed_.get();
  }
  return g;
}

}  // namespace kvs
