// Host-side check of a CUDA runtime call: a failure is one kvs::Error line,
// "<who>: <what>: <cudaGetErrorString>". (Kernel files use KVS_CUDA_CHECK in
// common.cuh, which names the call and the source line instead.)
#pragma once
#include <cuda_runtime.h>

#include <string_view>

#include "core/error.h"

namespace kvs::cuda {

inline void check(cudaError_t e, std::string_view who, std::string_view what) {
  if (e != cudaSuccess) fail("{}: {}: {}", who, what, cudaGetErrorString(e));
}

// check() bound to one caller's name, so that call sites read
// `check(cudaMalloc(&p, n), "cudaMalloc")`.
struct ErrorCheck {
  const char* who;
  void operator()(cudaError_t e, std::string_view what) const { check(e, who, what); }
};

}  // namespace kvs::cuda
