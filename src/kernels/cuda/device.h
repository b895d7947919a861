// CUDA device discovery and properties, compiled only with -DKVS_CUDA=ON.
#pragma once
#include <cstddef>
#include <string>

namespace kvs::cuda {

// Number of visible CUDA devices; 0 (and `why` filled) when there is none or
// the driver cannot be used.
int device_count(std::string* why);
std::string device_name(int index);
// Peak dense bf16 tensor-core throughput of the device in TFLOP/s, for MFU:
// the vendor's dense (not sparse) figure by model name (H100/H200/H800 SXM
// 989, H100 PCIe 756, A100 312, A800 312, L40S 362), or the environment
// variable KVS_PEAK_TFLOPS when set; 0 when unknown (MFU is then not printed).
double peak_bf16_tflops(int index);
// Device memory in use on the device (total - free), bytes.
size_t device_memory_used(int index);

}  // namespace kvs::cuda
