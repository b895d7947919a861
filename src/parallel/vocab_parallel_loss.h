// The masked cross-entropy when the logits are split by vocabulary across a
// tensor-parallel group (Megatron's vocab-parallel cross-entropy): no rank
// ever holds a full row of logits. Per row, three all-reduces of N numbers:
// the row maximum (Max), then the sum of exp(logit - max) and the target's
// logit (Sum; only the rank owning the target contributes it), then, if
// asked, the argmax (Max over minus the candidate index: the lowest index
// wins ties, as in the single-process op). Padding columns (global id >=
// vocab_size) are never predicted: they are left out of every reduction and
// their gradient is 0. Same contract as cpu::cross_entropy_forward_backward:
// dlogits may alias logits (it is overwritten after each row is read).
#pragma once
#include <cstdint>
#include <vector>

#include "parallel/tensor_parallel.h"

namespace kvs {

void vocab_parallel_cross_entropy(float* losses, float* dlogits, int32_t* argmax, const float* logits,
                                  const int32_t* targets, const float* mask, int N, const LocalDims& d,
                                  double grad_scale, dist::Communicator& comm, std::vector<double>& scratch);

}  // namespace kvs
