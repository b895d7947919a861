// The process groups of a run (docs/PARALLEL.md): world = dp x pp x cp x tp
// with tp innermost, then cp, then pp:
//   rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank.
// The tp ranks of one context-parallel rank are adjacent, so with one process
// per GPU a TP group fills consecutive GPUs of one node, where the bandwidth
// is; the cp ranks of one stage come next, then the pipeline stages.
//   tp_comm     the tensor-parallel group (same dp, pp and cp rank)
//   cp_comm     the context-parallel group: one stage's ranks holding the same
//               tensor slice, each with its chunks of every sequence
//   pp_comm     the pipeline group: one rank per stage (same dp, cp, tp rank)
//   dp_comm     the data-parallel group (same pp, cp and tp rank): the ranks
//               reading different micro-batches
//   grad_comm   the ranks whose gradients are summed and whose optimizer
//               state is sharded (ZeRO-1): dp x cp, same pp and tp rank
//   embed_comm  with pp > 1 and tied embeddings: the first and the last stage
//               (their two copies of the embedding); null otherwise
#pragma once
#include <memory>

#include "dist/comm.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"

namespace kvs {

struct ParallelGroups {
  int tp = 1, tp_rank = 0, cp = 1, cp_rank = 0, pp = 1, pp_rank = 0, dp = 1, dp_rank = 0;
  bool sequence_parallel = false;
  dist::Communicator* tp_comm = nullptr;
  dist::Communicator* cp_comm = nullptr;
  dist::Communicator* pp_comm = nullptr;
  dist::Communicator* dp_comm = nullptr;
  dist::Communicator* grad_comm = nullptr;
  dist::Communicator* embed_comm = nullptr;
  TensorParallel tensor_parallel() const { return {tp_rank, tp, tp_comm, sequence_parallel}; }

  // Splits `world` (every rank must call this). Throws kvs::Error if the
  // world size is not a multiple of tp x cp x pp.
  static ParallelGroups make(dist::Communicator& world, int tp, int cp = 1, bool sequence_parallel = false,
                             int pp = 1, bool tied_embeddings = false);

 private:
  std::shared_ptr<dist::Communicator> owned_tp_, owned_cp_, owned_pp_, owned_dp_, owned_grad_, owned_embed_;
};

}  // namespace kvs
