// The global gradient norm under data, tensor and pipeline parallelism.
#pragma once
#include <cstddef>

#include "model/engine.h"

namespace kvs {

// A pipeline stage's place in the whole model's norm: the group of stages
// (null without pipeline parallelism), and whether this stage's embedding is
// the last stage's copy of a tied embedding (the first stage's counts).
struct PipelineNorm {
  dist::Communicator* comm = nullptr;
  bool tied_copy = false;
};

// This rank's share of the squared gradient norm over [begin, end) of its
// flat buffer. Under tensor parallelism the replicated tensors (the norm
// gains: every TP rank holds the same gradient, computed from all-reduced
// inputs) are counted by TP rank 0 only and the sliced ones by every rank,
// so the sum over the TP group is the full model's; a tied embedding's copy
// is not counted. At tp = 1 without a copy it is exactly
// Engine::grad_sq_sum_range(begin, end).
double local_grad_sq_sum(Engine& e, size_t begin, size_t end, const TensorParallel& tp, bool tied_copy = false);

// The full model's gradient norm without ZeRO-1 (zero1.h has its own): the
// engine's at tp = 1 without a pipeline, else local_grad_sq_sum summed over
// the TP group and the pipeline group.
double global_grad_norm(Engine& e, const TensorParallel& tp, const PipelineNorm& pipe = {});

}  // namespace kvs
