// CUDA device discovery and properties, compiled only with -DKVS_CUDA=ON.
#pragma once
#include <cstddef>
#include <string>

struct CUstream_st;  // cudaStream_t's pointee, without the runtime's headers

namespace kvs::cuda {

// Number of visible CUDA devices; 0 (and `why` filled) when there is none or
// the driver cannot be used.
int device_count(std::string* why);
std::string device_name(int index);
// Peak dense bf16 tensor-core throughput of the device in TFLOP/s, for MFU:
// the vendor's dense (not sparse) figure by model name (H100/H200/H800 SXM
// 989, H100/H200 NVL 835, H100 PCIe 756, A100 312, A800 312, L40S 362), or the environment
// variable KVS_PEAK_TFLOPS when set; 0 when unknown (MFU is then not printed).
double peak_bf16_tflops(int index);
// After a kernel launch on `stream` (KVS_CUDA_LAUNCH_CHECK): a launch error is
// a kvs::Error naming the kernel; with the per-kernel profile on, the kernel's
// end is marked (kernel_profile.h). With the environment variable
// KVS_CUDA_SYNC=1 it also waits for the device, so that a fault inside a
// kernel (an illegal address, a trap) is reported at that kernel's name
// instead of at some later synchronisation with a generic message. For
// debugging: it serialises the streams and costs speed.
void check_launch(const char* kernel_name, CUstream_st* stream);
// The launch check alone, with the wait chosen by the caller.
void check_launch(const char* kernel_name, bool wait);
// Whether KVS_CUDA_SYNC=1 is set (read once).
bool sync_after_launch();
// Device memory in use on the device (total - free), bytes.
size_t device_memory_used(int index);

}  // namespace kvs::cuda
