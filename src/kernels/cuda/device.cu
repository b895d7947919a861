#include <cuda_runtime.h>

#include <cstdlib>
#include <string_view>

#include "core/error.h"

#include "kernels/cuda/device.h"
#include "kernels/cuda/kernel_profile.h"

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

double peak_bf16_tflops(int index) {
  if (const char* env = std::getenv("KVS_PEAK_TFLOPS")) return std::atof(env);
  const std::string name = device_name(index);
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H100") && has("PCIe")) return 756.0;
  if ((has("H100") || has("H200")) && has("NVL")) return 835.0;
  if (has("H100") || has("H200") || has("H800") || has("GH200")) return 989.0;
  if (has("A100") || has("A800")) return 312.0;
  if (has("L40S")) return 362.0;
  return 0.0;
}

size_t device_memory_used(int index) {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(index);
  size_t free_b = 0, total_b = 0;
  const bool ok = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess;
  cudaSetDevice(prev);
  return ok ? total_b - free_b : 0;
}

bool sync_after_launch() {
  static const bool on = [] {
    const char* v = std::getenv("KVS_CUDA_SYNC");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }();
  return on;
}

void check_launch(const char* kernel_name, cudaStream_t stream) {
  check_launch(kernel_name, false);
  profile::mark(kernel_name, stream);
  if (sync_after_launch()) check_launch(kernel_name, true);
}

void check_launch(const char* kernel_name, bool wait) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) fail("CUDA kernel {} failed to launch: {}", kernel_name, cudaGetErrorString(err));
  if (!wait) return;
  err = cudaDeviceSynchronize();
  if (err != cudaSuccess)
    fail("CUDA kernel {} failed while running (KVS_CUDA_SYNC=1): {}", kernel_name, cudaGetErrorString(err));
}

}  // namespace kvs::cuda
