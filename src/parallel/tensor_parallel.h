// Megatron-style tensor parallelism (docs/PARALLEL.md): which slice of every
// full tensor a tensor-parallel (TP) rank holds, and the per-rank sizes the
// engine computes with.
//   q/k/v_proj, gate/up_proj: column-parallel, rows split (by whole heads for
//     q/k/v: rank r holds query heads [r*Hq/tp, (r+1)*Hq/tp) and KV heads
//     [r*Hkv/tp, ...), so the GQA group of a local query head stays local);
//   q/k/v_shift: rows (heads) split with their projections;
//   o_proj, down_proj: row-parallel, columns split;
//   embed_tokens, lm_head: vocab-parallel, rows split after padding the
//     vocabulary to a multiple of 128*tp (padding rows are zero and never
//     predicted);
//   norms: replicated.
// At tp = 1 nothing is split or padded: the local layout is the full one.
#pragma once
#include <functional>
#include <cstdint>

#include "model/config.h"
#include "model/params.h"

namespace kvs {

namespace dist {
class Communicator;
}

// This process's place in its tensor-parallel group. comm is null (or of
// size 1) without tensor parallelism.
struct TensorParallel {
  int rank = 0;
  int size = 1;
  dist::Communicator* comm = nullptr;
  // Sequence parallelism (parallel.sequence_parallel; tp_region.h): outside the
  // TP regions each rank holds 1/size of the micro-batch's rows.
  bool sequence_parallel = false;
};

// The vocabulary rows the embedding and LM head have across the TP group:
// vocab_size at tp = 1, else rounded up to a multiple of 128 * tp.
int64_t padded_vocab(const ModelConfig& m, int tp);

// Sizes one TP rank computes with.
struct LocalDims {
  int C = 0;         // hidden size (replicated)
  int D = 0;         // head dim
  int Hq = 0, Hkv = 0;
  int F = 0;         // intermediate size of this rank
  int V = 0;         // vocabulary rows of this rank (padding included)
  int v_begin = 0;   // the first global vocabulary id of this rank
  int v_valid = 0;   // the model's vocab_size: ids >= v_valid are padding
  int QD() const { return Hq * D; }
  int KD() const { return Hkv * D; }
  static LocalDims of(const ModelConfig& m, int tp_rank, int tp);
};

// Checks that tp divides what it must split; throws kvs::Error naming the key.
void check_tensor_parallel(const ModelConfig& m, int tp, const std::string& origin);

// The runs of elements rank `tp_rank`'s slice `local` of tensor `full` (the
// same tensor's entries in the two layouts) shares with the full tensor:
// copy(full_index, local_index, n) with indices counted from each tensor's
// first element; vocabulary padding rows (beyond the full tensor) come with
// full_index -1. Runs come in increasing local_index.
void for_each_tensor_run(const ParamTensor& full, const ParamTensor& local, int tp_rank,
                         const std::function<void(int64_t, size_t, size_t)>& copy);

// Copies rank tp_rank's slice of every tensor of `local_layout`
// (ParamLayout::build(m, tp_rank, tp[, part]): a pipeline stage's layout holds
// only some tensors) from `full` (ParamLayout::build(m)) into `local`.
// Vocabulary padding rows become 0.
void slice_to_local(const ParamLayout& full_layout, const ParamLayout& local_layout, int tp_rank, const float* full,
                    float* local);
// The inverse for the tensors of the local layout (the others in `full` are
// left as they are): `gathered` holds every rank's local buffer in rank order
// ([tp][local_layout.total]); replicated tensors are taken from rank 0, after
// checking that every rank's copy is bit-identical (kvs::Error otherwise).
void assemble_full(const ParamLayout& full_layout, const ParamLayout& local_layout, int tp, const float* gathered,
                   float* full);
// One tensor of it: `slices` holds every rank's slice of it in rank order
// ([tp][local_t.numel]); `full` its full_t.numel elements.
void assemble_tensor(const ParamTensor& full_t, const ParamTensor& local_t, int tp, const float* slices,
                     float* full);

}  // namespace kvs
