// Full-model buffers in and out of one rank's engine: a checkpoint always
// holds full tensors (ParamLayout::build(m)), whatever the layout it was
// written from or is loaded into, so a run resumes at any dp x pp x cp x tp.
// The rank's layout is its tensor-parallel slice of its pipeline stage's part
// (the whole model without pipeline parallelism). At tp = pp = 1 both
// directions are plain copies.
#pragma once
#include <vector>

#include "model/params.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"

namespace kvs {

class FullModelIO {
 public:
  // pp_comm, part: the pipeline group and this rank's part (pp > 1 only).
  FullModelIO(const ModelConfig& m, const ParamLayout& local_layout, TensorParallel tp,
              dist::Communicator* pp_comm = nullptr, const ModelPart* part = nullptr);

  const ParamLayout& full_layout() const { return full_; }
  // This rank's slice of a full buffer.
  std::vector<float> to_local(const std::vector<float>& full) const;
  // Every TP rank's local buffer assembled into the full one, and every
  // stage's tensors with it, on every rank (a collective over the TP group
  // and the pipeline group: all their ranks must call it).
  std::vector<float> to_full(const std::vector<float>& local) const;

 private:
  std::vector<float> with_other_stages(std::vector<float>& full) const;
  ParamLayout full_;
  const ParamLayout& local_;
  TensorParallel tp_;
  dist::Communicator* pp_;
  bool tied_copy_ = false;  // a last stage's copy of the tied embedding (the first stage's counts)
};

}  // namespace kvs
