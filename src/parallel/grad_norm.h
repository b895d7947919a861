// The global gradient norm under data and tensor parallelism.
#pragma once
#include <cstddef>

#include "model/engine.h"

namespace kvs {

// This rank's share of the squared gradient norm over [begin, end) of its
// flat buffer. Under tensor parallelism the replicated tensors (the norm
// gains: every TP rank holds the same gradient, computed from all-reduced
// inputs) are counted by TP rank 0 only and the sliced ones by every rank,
// so the sum over the TP group is the full model's. At tp = 1 it is
// exactly Engine::grad_sq_sum_range(begin, end).
double local_grad_sq_sum(Engine& e, size_t begin, size_t end, const TensorParallel& tp);

// The full model's gradient norm without ZeRO-1 (zero1.h has its own): the
// engine's at tp = 1, else local_grad_sq_sum over the TP group.
double global_grad_norm(Engine& e, const TensorParallel& tp);

}  // namespace kvs
