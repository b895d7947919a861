#include <cuda_runtime.h>

#include "kernels/cuda/device.h"

namespace kvs::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device is visible";
  return n;
}

std::string device_name(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return "unknown";
  return prop.name;
}

}  // namespace kvs::cuda
