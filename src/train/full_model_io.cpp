#include "train/full_model_io.h"

#include <algorithm>

#include "core/error.h"
#include "dist/comm.h"

namespace kvs {

FullModelIO::FullModelIO(const ModelConfig& m, const ParamLayout& local_layout, TensorParallel tp,
                         dist::Communicator* pp_comm, const ModelPart* part)
    : full_(ParamLayout::build(m)),
      local_(local_layout),
      tp_(tp),
      pp_(pp_comm && pp_comm->size() > 1 ? pp_comm : nullptr),
      tied_copy_(part && !part->embedding && local_layout.find("model.embed_tokens.weight")) {}

std::vector<float> FullModelIO::to_local(const std::vector<float>& full) const {
  KVS_CHECK(full.size() == full_.total, "FullModelIO: {} floats given, the model has {}", full.size(), full_.total);
  std::vector<float> local(local_.total);
  slice_to_local(full_, local_, tp_.rank, full.data(), local.data());
  return local;
}

std::vector<float> FullModelIO::to_full(const std::vector<float>& local) const {
  KVS_CHECK(local.size() == local_.total, "FullModelIO: {} floats given, the slice has {}", local.size(),
            local_.total);
  std::vector<float> full(full_.total);
  if (tp_.size == 1) {
    assemble_full(full_, local_, 1, local.data(), full.data());
    return with_other_stages(full);
  }
  // In pieces: NCCL stages host buffers on the GPU (tp + 1 times the piece),
  // and a whole model's worth would not fit beside the engine.
  const size_t n = local_.total, tp = static_cast<size_t>(tp_.size);
  std::vector<float> gathered(n * tp), piece;
  for (size_t at = 0; at < n; at += dist::kHostPieceFloats) {
    const size_t k = std::min(dist::kHostPieceFloats, n - at);
    piece.resize(k * tp);
    tp_.comm->all_gather(local.data() + at, piece.data(), k, dist::DType::F32);
    for (size_t r = 0; r < tp; ++r) std::copy_n(piece.data() + r * k, k, gathered.data() + r * n + at);
  }
  assemble_full(full_, local_, tp_.size, gathered.data(), full.data());
  return with_other_stages(full);
}

std::vector<float> FullModelIO::with_other_stages(std::vector<float>& full) const {
  if (!pp_) return std::move(full);
  // Each stage filled its own tensors and left zeros elsewhere: the sum over
  // the pipeline group is the whole model (the tied embedding counted once).
  if (tied_copy_) {
    const ParamTensor* e = full_.find("model.embed_tokens.weight");
    std::fill(full.begin() + e->offset, full.begin() + e->offset + e->numel, 0.0f);
  }
  for (size_t at = 0; at < full.size(); at += dist::kHostPieceFloats)
    pp_->all_reduce(full.data() + at, std::min(dist::kHostPieceFloats, full.size() - at), dist::DType::F32,
                    dist::ReduceOp::Sum);
  return std::move(full);
}

}  // namespace kvs
