#include "train/full_model_io.h"

#include <algorithm>

#include "core/error.h"
#include "dist/comm.h"
#include "train/checkpoint.h"

namespace kvs {

FullModelIO::FullModelIO(const ModelConfig& m, const ParamLayout& local_layout, TensorParallel tp, bool gathers,
                         dist::Communicator* pp_comm, const ModelPart* part)
    : model_(m),
      full_(ParamLayout::build(m)),
      local_(local_layout),
      tp_(tp),
      gathers_(gathers),
      pp_(pp_comm && pp_comm->size() > 1 ? pp_comm : nullptr),
      owner_(full_.tensors.size(), 0) {
  if (!pp_) return;
  // A last stage's copy of the tied embedding (its LM head) is not the one
  // written: the first stage's is, as a single process holds it.
  const bool tied_copy = part && !part->embedding && local_layout.find("model.embed_tokens.weight");
  std::vector<double> owner(full_.tensors.size(), -1.0);
  for (size_t i = 0; i < owner.size(); ++i) {
    const std::string& name = full_.tensors[i].name;
    if (local_.find(name) && !(tied_copy && name == "model.embed_tokens.weight")) owner[i] = pp_->rank();
  }
  pp_->all_reduce(owner.data(), owner.size(), dist::DType::F64, dist::ReduceOp::Max);
  for (size_t i = 0; i < owner.size(); ++i) {
    KVS_CHECK(owner[i] >= 0, "pipeline parallelism: no stage holds {}", full_.tensors[i].name);
    owner_[i] = static_cast<int>(owner[i]);
  }
}

const ParamTensor& FullModelIO::full_of(const ParamTensor& local) const {
  const ParamTensor* f = full_.find(local.name);
  KVS_CHECK(f != nullptr, "FullModelIO: {} is not in the full layout", local.name);
  return *f;
}

void FullModelIO::for_each_run_in(
    size_t begin, size_t n,
    const std::function<void(const ParamTensor&, const ParamTensor&, int64_t, size_t, size_t)>& fn) const {
  KVS_CHECK(begin + n <= local_.total, "FullModelIO: [{}, {}) past this rank's {} floats", begin, begin + n,
            local_.total);
  const size_t end = begin + n;
  for (const ParamTensor& l : local_.tensors) {
    if (l.offset + l.numel <= begin || l.offset >= end) continue;
    const ParamTensor& f = full_of(l);
    for_each_tensor_run(f, l, tp_.rank, [&](int64_t fi, size_t li, size_t k) {
      const size_t a = l.offset + li, lo = std::max(a, begin), hi = std::min(a + k, end);
      if (lo < hi) fn(l, f, fi < 0 ? -1 : fi + static_cast<int64_t>(lo - a), lo - begin, hi - lo);
    });
  }
}

void FullModelIO::init_local(uint64_t seed, float* local) const { init_local(seed, 0, local_.total, local); }

void FullModelIO::init_local(uint64_t seed, size_t begin, size_t n, float* out) const {
  std::fill(out, out + n, 0.0f);  // padding runs, and any gap between tensors
  for_each_run_in(begin, n, [&](const ParamTensor&, const ParamTensor& f, int64_t fi, size_t at, size_t k) {
    if (fi >= 0) init_param_range(f, model_, seed, static_cast<size_t>(fi), k, out + at);
  });
}

void FullModelIO::check_file(const SafetensorsReader& file, const std::vector<std::string>& prefixes) const {
  validate_layout_tensors(file.tensors(), full_, prefixes, file.path());
}

void FullModelIO::read_local(const SafetensorsReader& file, const std::string& prefix, float* local) const {
  read_local(file, prefix, 0, local_.total, local);
}

void FullModelIO::read_local(const SafetensorsReader& file, const std::string& prefix, size_t begin, size_t n,
                             float* out) const {
  std::fill(out, out + n, 0.0f);  // padding runs, and any gap between tensors
  // Adjacent runs (the rows of a row-split tensor) are read as one.
  const StTensor* st = nullptr;
  const ParamTensor* in = nullptr;
  int64_t run_f = 0;
  size_t run_at = 0, run_n = 0;
  auto flush = [&] {
    if (run_n) file.read_f32(*st, static_cast<uint64_t>(run_f), run_n, out + run_at);
    run_n = 0;
  };
  for_each_run_in(begin, n, [&](const ParamTensor& l, const ParamTensor&, int64_t fi, size_t at, size_t k) {
    if (&l != in) {
      flush();
      in = &l;
      st = file.find(prefix + l.name);
      KVS_CHECK(st != nullptr, "{}: missing tensor '{}'", file.path(), prefix + l.name);
    }
    if (fi < 0) return;  // padding: zeros
    if (run_n && fi == run_f + static_cast<int64_t>(run_n) && at == run_at + run_n) {
      run_n += k;
      return;
    }
    flush();
    run_f = fi, run_at = at, run_n = k;
  });
  flush();
}

std::vector<StTensor> FullModelIO::gather_full(const float* local, const std::string& prefix) const {
  std::vector<StTensor> out;
  gather_full(local, prefix, [&](StTensor t) { out.push_back(std::move(t)); });
  return out;
}

std::vector<StTensor> FullModelIO::full_headers(const std::string& prefix) const {
  std::vector<StTensor> out;
  for (const ParamTensor& f : full_.tensors) out.push_back({prefix + f.name, DType::F32, f.shape, {}});
  return out;
}

void FullModelIO::gather_full(const float* local, const std::string& prefix,
                              const std::function<void(StTensor)>& keep) const {
  gather_full([&](const ParamTensor& l) { return local + l.offset; }, prefix, keep);
}

std::vector<const ParamTensor*> FullModelIO::owned_local() const {
  const int pp_rank = pp_ ? pp_->rank() : 0;
  std::vector<const ParamTensor*> out;
  for (size_t i = 0; i < full_.tensors.size(); ++i)
    if (owner_[i] == pp_rank) out.push_back(local_.find(full_.tensors[i].name));
  return out;
}

void FullModelIO::gather_full(const LocalTensor& local, const std::string& prefix,
                              const std::function<void(StTensor)>& keep) const {
  if (!gathers_) return;
  const int pp_rank = pp_ ? pp_->rank() : 0;
  const size_t tp = static_cast<size_t>(tp_.size);
  const bool keeper = tp_.rank == 0 && pp_rank == 0;
  std::vector<float> gathered, piece, buffer;
  for (size_t i = 0; i < full_.tensors.size(); ++i) {
    const ParamTensor& f = full_.tensors[i];
    const bool owner = owner_[i] == pp_rank;
    // Pipeline: only tensor-parallel rank 0's group carries the tensor on to rank 0.
    if (!owner && (!pp_ || tp_.rank != 0)) continue;
    // Every tensor-parallel rank assembles, so that all of them find drifted
    // replicas at the same tensor and stop together.
    StTensor t{prefix + f.name, DType::F32, f.shape, {}};
    float* full = nullptr;
    if (keeper) {
      t.bytes.resize(f.numel * sizeof(float));
      full = reinterpret_cast<float*>(t.bytes.data());
    } else {
      buffer.resize(f.numel);
      full = buffer.data();
    }
    if (owner) {
      const ParamTensor* l = local_.find(f.name);
      const float* mine = local(*l);
      // Every tensor-parallel rank's slice, in pieces: NCCL stages host
      // buffers on the GPU (tp + 1 times the piece) beside the engine, and
      // keeps that buffer only up to kHostPieceFloats: a piece of a (tp + 1)th
      // of it, whole 256-byte blocks, is not allocated and freed every time.
      const float* all = mine;
      if (tp > 1) {
        gathered.resize(l->numel * tp);
        const size_t step = std::max<size_t>(64, dist::kHostPieceFloats / (tp + 1) / 64 * 64);
        for (size_t at = 0; at < l->numel; at += step) {
          const size_t k = std::min(step, l->numel - at);
          piece.resize(k * tp);
          tp_.comm->all_gather(mine + at, piece.data(), k, dist::DType::F32);
          for (size_t r = 0; r < tp; ++r) std::copy_n(piece.data() + r * k, k, gathered.data() + r * l->numel + at);
        }
        all = gathered.data();
      }
      assemble_tensor(f, *l, tp_.size, all, full);
    }
    if (pp_ && tp_.rank == 0)  // from the stage that holds it to the first stage's rank (world rank 0)
      for (size_t at = 0; at < f.numel; at += dist::kHostPieceFloats)
        pp_->broadcast(full + at, std::min(dist::kHostPieceFloats, f.numel - at), dist::DType::F32, owner_[i]);
    if (keeper) keep(std::move(t));
  }
}

}  // namespace kvs
