// Full-model buffers in and out of one tensor-parallel rank's engine: a
// checkpoint always holds full tensors (ParamLayout::build(m)), whatever the
// layout it was written from or is loaded into, so a run resumes at any
// dp x tp. At tp = 1 both directions are plain copies.
#pragma once
#include <vector>

#include "model/params.h"
#include "parallel/tensor_parallel.h"

namespace kvs {

class FullModelIO {
 public:
  FullModelIO(const ModelConfig& m, const ParamLayout& local_layout, TensorParallel tp);

  const ParamLayout& full_layout() const { return full_; }
  // This rank's slice of a full buffer.
  std::vector<float> to_local(const std::vector<float>& full) const;
  // Every TP rank's local buffer assembled into the full one, on every rank
  // (a collective over the TP group: all its ranks must call it).
  std::vector<float> to_full(const std::vector<float>& local) const;

 private:
  ParamLayout full_;
  const ParamLayout& local_;
  TensorParallel tp_;
};

}  // namespace kvs
