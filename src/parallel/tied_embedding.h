// Pipeline parallelism with tied embeddings (docs/PARALLEL.md): the first
// stage's embedding and the last stage's copy (its LM head) each got part of
// the gradient; their sum on both keeps the two copies equal through the
// optimizer.
#pragma once
#include "dist/comm.h"
#include "model/engine.h"

namespace kvs {

// Sums the embedding's gradient over `embed_comm` (the first and last stage),
// in place in the engine's flat gradients: host memory, GPU memory with a
// communicator that takes it (NCCL), or GPU memory staged through the host
// (the CUDA engine under MPI). Does nothing for a null communicator.
void sum_tied_embedding_grads(Engine& e, dist::Communicator* embed_comm);

}  // namespace kvs
