#include "parallel/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "core/error.h"

namespace kvs {

int64_t padded_vocab(const ModelConfig& m, int tp) {
  if (tp <= 1) return m.vocab_size;
  const int64_t unit = 128LL * tp;
  return (m.vocab_size + unit - 1) / unit * unit;
}

LocalDims LocalDims::of(const ModelConfig& m, int tp_rank, int tp) {
  LocalDims d;
  d.C = m.hidden_size;
  d.D = m.head_dim();
  d.Hq = m.num_attention_heads / tp;
  d.Hkv = m.num_key_value_heads / tp;
  d.F = m.intermediate_size / tp;
  d.V = static_cast<int>(padded_vocab(m, tp) / tp);
  d.v_begin = tp_rank * d.V;
  d.v_valid = m.vocab_size;
  return d;
}

void check_tensor_parallel(const ModelConfig& m, int tp, const std::string& origin) {
  if (tp < 1) fail("{}: parallel.tp: must be >= 1, got {}", origin, tp);
  if (tp == 1) return;
  auto need = [&](int value, const char* key) {
    if (value % tp != 0)
      fail("{}: parallel.tp ({}) must divide model.{} ({}): each tensor-parallel rank holds an equal share", origin,
           tp, key, value);
  };
  need(m.num_key_value_heads, "num_key_value_heads");
  need(m.num_attention_heads, "num_attention_heads");
  need(m.intermediate_size, "intermediate_size");
}

namespace {

// A tensor as a matrix: 1-D tensors are one row.
struct Matrix2 {
  int64_t rows, cols;
};
Matrix2 as_matrix(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return {1, shape[0]};
  KVS_CHECK(shape.size() == 2, "tensor parallelism: only 1-D and 2-D tensors are supported");
  return {shape[0], shape[1]};
}

}  // namespace

void for_each_tensor_run(const ParamTensor& f, const ParamTensor& l, int rank,
                         const std::function<void(int64_t, size_t, size_t)>& copy) {
  KVS_CHECK(f.name == l.name, "tensor parallelism: layouts disagree ({} vs {})", f.name, l.name);
  const Matrix2 F = as_matrix(f.shape), L = as_matrix(l.shape);
  if (l.split_dim < 0) {
    copy(0, 0, f.numel);
  } else if (l.split_dim == 0) {
    for (int64_t i = 0; i < L.rows; ++i) {
      const int64_t g = rank * L.rows + i;
      copy(g < F.rows ? g * F.cols : -1, static_cast<size_t>(i * L.cols), static_cast<size_t>(L.cols));
    }
  } else {
    for (int64_t i = 0; i < F.rows; ++i)
      copy(i * F.cols + rank * L.cols, static_cast<size_t>(i * L.cols), static_cast<size_t>(L.cols));
  }
}

namespace {

// Calls copy(full_offset, local_offset, n) for every run of for_each_tensor_run,
// as offsets into the two layouts' flat buffers (padding: full_offset -1).
template <class Fn>
void for_each_run(const ParamTensor& f, const ParamTensor& l, int rank, Fn&& copy) {
  for_each_tensor_run(f, l, rank, [&](int64_t fi, size_t li, size_t n) {
    copy(fi < 0 ? -1 : static_cast<int64_t>(f.offset) + fi, static_cast<int64_t>(l.offset + li), n);
  });
}

// The full layout's tensor for a local one (a pipeline stage's layout holds only some).
const ParamTensor& full_of(const ParamLayout& full_layout, const ParamTensor& local) {
  const ParamTensor* f = full_layout.find(local.name);
  KVS_CHECK(f != nullptr, "tensor parallelism: {} is not in the full layout", local.name);
  return *f;
}

}  // namespace

void slice_to_local(const ParamLayout& full_layout, const ParamLayout& local_layout, int tp_rank, const float* full,
                    float* local) {
  for (const ParamTensor& t : local_layout.tensors)
    for_each_run(full_of(full_layout, t), t, tp_rank, [&](int64_t fo, int64_t lo, size_t n) {
      if (fo < 0)
        std::fill(local + lo, local + lo + n, 0.0f);
      else
        std::memcpy(local + lo, full + fo, n * sizeof(float));
    });
}

void assemble_tensor(const ParamTensor& full_t, const ParamTensor& local_t, int tp, const float* slices,
                     float* full) {
  for (int r = 0; r < tp; ++r) {
    const float* slice = slices + static_cast<size_t>(r) * local_t.numel;
    if (local_t.split_dim < 0 && r > 0) {
      // Replicated tensors get identical updates on every rank; a difference
      // means the ranks drifted apart, which must not pass silently.
      KVS_CHECK(std::memcmp(slice, slices, local_t.numel * sizeof(float)) == 0,
                "tensor parallelism: ranks 0 and {} hold different copies of the replicated tensor {}", r,
                local_t.name);
      continue;  // rank 0's copy
    }
    for_each_tensor_run(full_t, local_t, r, [&](int64_t fi, size_t li, size_t n) {
      if (fi >= 0) std::memcpy(full + fi, slice + li, n * sizeof(float));
    });
  }
}

void assemble_full(const ParamLayout& full_layout, const ParamLayout& local_layout, int tp, const float* gathered,
                   float* full) {
  std::vector<float> slices;
  for (const ParamTensor& t : local_layout.tensors) {
    slices.resize(t.numel * static_cast<size_t>(tp));
    for (int r = 0; r < tp; ++r)
      std::copy_n(gathered + static_cast<size_t>(r) * local_layout.total + t.offset, t.numel,
                  slices.data() + static_cast<size_t>(r) * t.numel);
    const ParamTensor& f = full_of(full_layout, t);
    assemble_tensor(f, t, tp, slices.data(), full + f.offset);
  }
}

}  // namespace kvs
