// The host CUDA shim (docs/CUDA.md "The engine on the host"): the CUDA
// runtime, cuBLASLt and NCCL calls the engine makes, implemented on the CPU
// for the kvshift_cuda_host binaries, with the contracts a GPU enforces
// checked. The API functions themselves (cudaMalloc, cublasLtMatmul,
// ncclAllReduce...) keep their C names and the toolkit's headers; this header
// is what the shim's files share, plus the few calls tests make.
//
// Model: every operation (kernel, copy, memset, GEMM, collective) is queued
// on its stream in issue order and runs when the host synchronises with it
// (or with something that depends on it), in issue order. Each stream
// carries a vector clock; events and host synchronisation merge clocks, so an
// access to device memory by an operation can be checked against the last
// operations of other streams that touched the same bytes: unordered means a
// race a GPU could run concurrently. Device memory lives in one reserved
// range, inaccessible to the host except while an operation runs.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hostcuda {

// ---------------------------------------------------------------- errors
// Records `msg` as the text cudaGetErrorString gives for `code` (one line,
// "host CUDA shim: ..."), and returns code.
cudaError_t fail(cudaError_t code, const std::string& msg);
const char* message_of(cudaError_t code);
// The launch error cudaGetLastError returns next (and clears).
void set_last_error(cudaError_t code);

// ---------------------------------------------------------------- device memory (memory.cpp)
void* device_malloc(size_t bytes);  // null when the arena is used up
cudaError_t device_free(void* p);
// In the reserved device range (the arena or the gap below it): a device
// address, possibly of no allocation (a base shifted before its buffer).
bool is_device_address(const void* p);
// [p, p + n) inside one live allocation; otherwise false and *why says what it hits.
bool device_range_ok(const void* p, size_t n, std::string* why);
// "byte 12 of allocation #3 (4096 bytes, live)" and the like.
std::string describe(uintptr_t a);
void* pinned_malloc(size_t bytes);
bool pinned_free(void* p);
bool is_pinned(const void* p, size_t n = 1);
size_t device_bytes_in_use();
size_t device_bytes_total();
// The most device_bytes_in_use has been since the last reset (or the start).
size_t device_bytes_peak();
void reset_device_bytes_peak();
// While one exists, device memory is host-accessible (the shim running an operation).
struct DeviceOpen {
  DeviceOpen();
  ~DeviceOpen();
  DeviceOpen(const DeviceOpen&) = delete;
  DeviceOpen& operator=(const DeviceOpen&) = delete;
};

// ---------------------------------------------------------------- operations (streams.cpp)
// The operation now running (null on the host): its accesses are checked.
struct Running {
  int stream = 0;
  uint64_t seq = 0;
  const std::vector<uint64_t>* clock = nullptr;  // what it is ordered after: clock[s] = last op of s
  const std::string* label = nullptr;            // "kernel fwd_kernel<D> (src/...:175)" and the like
  std::string error;                             // its first contract violation
  cudaError_t code = cudaSuccess;
  int more_errors = 0;
};
extern Running* g_running;
// An access by the running operation to device bytes [a, a + n): bounds,
// use after free, and races with other streams (reads vs writes).
void note_access(uintptr_t a, size_t n, bool write);
// A violation by the running operation (the first is kept).
void op_violation(cudaError_t code, const std::string& msg);
// The label of an operation about to run, for the race messages of later ones.
void note_label(int stream, uint64_t seq, const std::string& label);

// A stream handle's index, or -1 (and *why) when it is not a live stream.
int stream_index(cudaStream_t s, std::string* why);
// Queues `body` on stream s (a valid handle); returns its sequence number.
// host_read: host memory the operation reads when it runs (a copy from pinned memory).
uint64_t enqueue(cudaStream_t s, std::string label, std::function<void()> body,
                 std::pair<const void*, size_t> host_read = {nullptr, 0});
// Runs the queued operations that still read host bytes [p, p + n), and what
// they depend on (before the host memory is given another meaning).
cudaError_t run_readers_of(const void* p, size_t n);
// Runs everything stream s has issued (and what it depends on); the host is
// then ordered after it. Returns the first error of what ran.
cudaError_t sync_stream(cudaStream_t s);
// Runs the queued operations of s up to its last one, as sync_stream, but
// without ordering the host after them (a copy whose DMA may still be in flight).
cudaError_t run_stream(cudaStream_t s);
cudaError_t sync_device();
// How many queued operations, not yet run, have `label_part` in their label
// (tests: what a call left in flight, and what a synchronisation ran).
size_t queued_ops(const std::string& label_part);

// ---------------------------------------------------------------- kernels (kernels.cpp)
struct LaunchInfo {
  const void* fn;
  const char* name;
  const char* file;
  int line;
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
};
std::string kernel_label(const LaunchInfo& k);
// Checks a launch as the driver would (dimensions, shared memory, stream) and
// its pointer arguments (host memory); false with the launch error set if not.
bool check_launch(const LaunchInfo& k, const std::vector<std::pair<int, const void*>>& pointer_args);
// While a kernel runs, for the access checks: the emulator's shared memory
// (dynamic window first, then static), the dynamic bytes of the launch, and
// where the emulator keeps the running block's index and the grid (x, y, z).
// All zero / null when no kernel runs.
void set_running_kernel(uintptr_t smem_base, size_t dyn_window, size_t smem_window, size_t launch_bytes,
                        const unsigned* block, const unsigned* grid);
// After a kernel ran: its static shared memory per block (the emulator's count).
void check_static_smem(const LaunchInfo& k, size_t bytes);

// ---------------------------------------------------------------- launch-only mode (tests)
// While on, operations are checked when issued exactly as always (launch
// limits, GEMM descriptors, layouts, alignments and ranges, copy ranges), but
// kernels, GEMMs and memsets do not run and new device memory is not
// touched: the engine's host side at a size the emulator could not run (the
// paper's models), with whatever values its device memory holds (zeros).
void set_launch_only(bool on);
bool launch_only();

// ---------------------------------------------------------------- a refused GEMM algorithm (tests)
// cublasLtMatmul answers CUBLAS_STATUS_NOT_SUPPORTED for the heuristic's
// candidate `index` (-1: none), as a real cuBLASLt may refuse at run time a
// candidate its heuristic offered.
void refuse_gemm_algorithm(int index);

// ---------------------------------------------------------------- a stuck device (tests)
// The next cudaDeviceSynchronize blocks as a kernel that does not end would:
// until some NCCL communicator is aborted (if `until_nccl_abort`; a
// collective's kernel ends then), or `max_s` passed.
void stall_next_device_sync(double max_s, bool until_nccl_abort);
void note_nccl_abort();  // the shim's ncclCommAbort

// ---------------------------------------------------------------- statistics (tests)
struct Stats {
  uint64_t kernels = 0, gemms = 0, copies = 0, collectives = 0, syncs = 0;
  uint64_t device_accesses = 0;  // checked loads and stores of device memory
};
Stats stats();
void count_kernel();
void count_gemm();
void count_copy();
void count_collective();
void count_accesses(uint64_t n);

}  // namespace hostcuda
