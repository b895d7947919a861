// The process groups of a run (docs/PARALLEL.md): world = dp x tp, with the
// tp ranks of one data-parallel replica adjacent (rank = dp_rank * tp +
// tp_rank), so that with one process per GPU a TP group fills consecutive
// GPUs of one node, where the bandwidth is.
#pragma once
#include <memory>

#include "dist/comm.h"
#include "parallel/tensor_parallel.h"

namespace kvs {

struct ParallelGroups {
  int tp = 1, tp_rank = 0, dp = 1, dp_rank = 0;
  dist::Communicator* tp_comm = nullptr;  // the ranks of this replica (size tp)
  dist::Communicator* dp_comm = nullptr;  // the ranks holding the same slice (size dp)
  TensorParallel tensor_parallel() const { return {tp_rank, tp, tp_comm}; }

  // Splits `world` (every rank must call this). Throws kvs::Error if the
  // world size is not a multiple of tp.
  static ParallelGroups make(dist::Communicator& world, int tp);

 private:
  std::shared_ptr<dist::Communicator> owned_tp_, owned_dp_;
};

}  // namespace kvs
