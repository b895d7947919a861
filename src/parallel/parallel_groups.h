// The process groups of a run (docs/PARALLEL.md): world = dp x cp x tp with
// tp innermost, then cp: rank = (dp_rank * cp + cp_rank) * tp + tp_rank. The
// tp ranks of one context-parallel rank are adjacent, so with one process per
// GPU a TP group fills consecutive GPUs of one node, where the bandwidth is;
// the cp ranks of one replica come next.
//   tp_comm     the tensor-parallel group (same dp and cp rank)
//   cp_comm     the context-parallel group: one replica's ranks holding the
//               same tensor slice, each with its chunks of every sequence
//   dp_comm     the data-parallel group (same cp and tp rank): the ranks
//               reading different micro-batches
//   grad_comm   the ranks whose gradients are summed and whose optimizer
//               state is sharded (ZeRO-1): dp x cp, same tp rank
#pragma once
#include <memory>

#include "dist/comm.h"
#include "parallel/tensor_parallel.h"

namespace kvs {

struct ParallelGroups {
  int tp = 1, tp_rank = 0, cp = 1, cp_rank = 0, dp = 1, dp_rank = 0;
  bool sequence_parallel = false;
  dist::Communicator* tp_comm = nullptr;
  dist::Communicator* cp_comm = nullptr;
  dist::Communicator* dp_comm = nullptr;
  dist::Communicator* grad_comm = nullptr;
  TensorParallel tensor_parallel() const { return {tp_rank, tp, tp_comm, sequence_parallel}; }

  // Splits `world` (every rank must call this). Throws kvs::Error if the
  // world size is not a multiple of tp x cp.
  static ParallelGroups make(dist::Communicator& world, int tp, int cp = 1, bool sequence_parallel = false);

 private:
  std::shared_ptr<dist::Communicator> owned_tp_, owned_cp_, owned_dp_, owned_grad_;
};

}  // namespace kvs
