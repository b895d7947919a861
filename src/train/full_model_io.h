// Full-model tensors in and out of one rank's engine: a checkpoint always
// holds full tensors (ParamLayout::build(m)), whatever the layout it was
// written from or is loaded into, so a run resumes at any dp x pp x cp x tp.
// The rank's layout is its tensor-parallel slice of its pipeline stage's part
// (the whole model without pipeline parallelism).
//
// Host memory is what bounds the paper's larger models, so nothing here
// builds the whole model on every rank: a rank initialises and reads only its
// own slice (the runs of each tensor it holds, straight from the file, a
// window at a time), and a save assembles one tensor at a time from values
// read off the engine tensor by tensor, handed on world rank 0 to the
// checkpoint writer (train/tensor_stream.h). No rank holds a host copy of its
// whole slice: a window or a tensor at a time.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "model/params.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"

namespace kvs {

class FullModelIO {
 public:
  // gathers: this rank's replica assembles full tensors in gather_full (the
  // replica world rank 0 belongs to: data- and context-parallel rank 0); the
  // other replicas' ranks skip it. pp_comm, part: the pipeline group and this
  // rank's part (pp > 1 only). With pp > 1 the constructor is a collective
  // over the pipeline group (it learns which stage holds each tensor).
  FullModelIO(const ModelConfig& m, const ParamLayout& local_layout, TensorParallel tp, bool gathers,
              dist::Communicator* pp_comm = nullptr, const ModelPart* part = nullptr);

  const ParamLayout& full_layout() const { return full_; }
  bool gathers() const { return gathers_; }  // this rank's replica assembles checkpoints
  // This rank's slice of a fresh model: init_params' values for the full
  // model, computed for the slice alone (vocabulary padding rows 0).
  void init_local(uint64_t seed, float* local) const;
  // Elements [begin, begin + n) of it (a window: the trainer writes the
  // engine's parameters a window at a time).
  void init_local(uint64_t seed, size_t begin, size_t n, float* out) const;
  // Checks that `file` holds exactly the full model's tensors under each of
  // `prefixes` ("" for weights; "exp_avg.", "exp_avg_sq." for moments):
  // names, shapes, float dtypes. Errors name the file and the tensor.
  void check_file(const SafetensorsReader& file, const std::vector<std::string>& prefixes) const;
  // This rank's slice of the tensors named prefix + name in `file` (checked
  // by check_file), reading only the elements the slice holds.
  void read_local(const SafetensorsReader& file, const std::string& prefix, float* local) const;
  // Elements [begin, begin + n) of it (a window, or a ZeRO-1 shard of the moments).
  void read_local(const SafetensorsReader& file, const std::string& prefix, size_t begin, size_t n,
                  float* out) const;
  // The full tensors, named prefix + name in the full layout's order,
  // assembled from every rank's `local` buffer: returned on world rank 0,
  // empty elsewhere. A collective over the tensor-parallel group, and the
  // pipeline group of tensor-parallel rank 0, of the gathering replica.
  // Replicated tensors must be bit-identical on every tensor-parallel rank
  // (kvs::Error otherwise: the ranks drifted apart).
  std::vector<StTensor> gather_full(const float* local, const std::string& prefix) const;
  // The same, each tensor handed to `keep` as soon as it is assembled (on world
  // rank 0; `keep` is not called elsewhere), so that it can be written while
  // the next one is gathered (train/tensor_stream.h).
  void gather_full(const float* local, const std::string& prefix, const std::function<void(StTensor)>& keep) const;
  // The same, each local tensor's values asked of `local` when its turn comes
  // (valid until the next call), so that no rank holds a copy of its whole
  // slice: it is called for the tensors of owned_local(), in that order.
  using LocalTensor = std::function<const float*(const ParamTensor& local)>;
  void gather_full(const LocalTensor& local, const std::string& prefix,
                   const std::function<void(StTensor)>& keep) const;
  // The local tensors whose values this rank hands to gather_full, in the
  // order it asks for them: the tensors its pipeline stage writes. The ranks
  // of the other replicas (same stage and tensor-parallel rank) get the same
  // list, so that they can join a collective per tensor (ZeRO-1's moments).
  std::vector<const ParamTensor*> owned_local() const;
  // What gather_full yields without the data: names, dtype F32, shapes.
  std::vector<StTensor> full_headers(const std::string& prefix) const;

 private:
  const ParamTensor& full_of(const ParamTensor& local) const;
  // fn(local tensor, full tensor, full element or -1 for padding, index into
  // the range, count) for every run of the local tensors inside [begin, begin + n).
  void for_each_run_in(size_t begin, size_t n,
                       const std::function<void(const ParamTensor&, const ParamTensor&, int64_t, size_t, size_t)>& fn)
      const;
  ModelConfig model_;
  ParamLayout full_;
  const ParamLayout& local_;
  TensorParallel tp_;
  bool gathers_;
  dist::Communicator* pp_;
  std::vector<int> owner_;  // per full tensor: the pipeline rank whose copy is written (0 without pp)
};

}  // namespace kvs
