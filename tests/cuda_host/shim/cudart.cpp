// The CUDA runtime calls of the host CUDA shim (hostcuda.h): devices, memory,
// copies and memsets with the host synchronisation each one has on a GPU
// (cudaMemcpy from pageable memory returns before the device has the data;
// cudaMemcpyAsync into pinned memory returns before the host has it, so the
// destination is poisoned until the stream is synchronised), and the error
// strings, which carry the shim's one-line explanation.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hostcuda.h"

namespace hostcuda {
namespace {

int g_device = 0;

int device_count() {
  const char* env = std::getenv("HOSTCUDA_DEVICES");
  return env ? std::max(0, std::atoi(env)) : 1;
}

enum class Side { Host, Pinned, Device };
Side side_of(const void* p, size_t n) {
  if (is_device_address(p)) return Side::Device;
  return is_pinned(p, n) ? Side::Pinned : Side::Host;
}

const char* kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "HostToHost";
    case cudaMemcpyHostToDevice: return "HostToDevice";
    case cudaMemcpyDeviceToHost: return "DeviceToHost";
    case cudaMemcpyDeviceToDevice: return "DeviceToDevice";
    default: return "Default";
  }
}

// Checks a copy's pointers against its kind; the kind it really is.
cudaError_t classify(const char* call, void* dst, const void* src, size_t n, cudaMemcpyKind kind, Side* ds, Side* ss,
                     cudaMemcpyKind* real) {
  *ds = side_of(dst, n);
  *ss = side_of(src, n);
  const bool dd = *ds == Side::Device, sd = *ss == Side::Device;
  const cudaMemcpyKind inferred = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                     : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  const std::string what = std::string(call) + "(" + kind_name(kind) + ", " + std::to_string(n) + " bytes)";
  if (kind != cudaMemcpyDefault && kind != inferred) {
    const bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (want_dd != dd)
      return fail(cudaErrorInvalidValue, what + ": the destination is " + describe(reinterpret_cast<uintptr_t>(dst)) +
                                             (want_dd ? ", not a device pointer" : ", not host memory"));
    return fail(cudaErrorInvalidValue, what + ": the source is " + describe(reinterpret_cast<uintptr_t>(src)) +
                                           (want_sd ? ", not a device pointer" : ", not host memory"));
  }
  std::string why;
  if (dd && !device_range_ok(dst, n, &why)) return fail(cudaErrorInvalidValue, what + ": destination " + why);
  if (sd && !device_range_ok(src, n, &why)) return fail(cudaErrorInvalidValue, what + ": source " + why);
  *real = inferred;
  return cudaSuccess;
}

// Queues the copy on stream s. A pageable source is read now (as the driver
// stages it); a pinned one when the copy runs.
uint64_t queue_copy(cudaStream_t s, const char* call, void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                    Side ss) {
  std::shared_ptr<std::vector<char>> staged;
  if (ss == Side::Host) {
    staged = std::make_shared<std::vector<char>>(n);
    std::memcpy(staged->data(), src, n);
  }
  const std::string label = std::string(call) + "(" + kind_name(kind) + ", " + std::to_string(n) + " bytes)";
  const std::pair<const void*, size_t> host_read = ss == Side::Pinned ? std::make_pair(src, n)
                                                                        : std::make_pair(nullptr, size_t{0});
  return enqueue(
      s, label,
      [dst, src, n, kind, staged] {
        count_copy();
        if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice)
          note_access(reinterpret_cast<uintptr_t>(dst), n, true);
        if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice)
          note_access(reinterpret_cast<uintptr_t>(src), n, false);
        std::memcpy(dst, staged ? staged->data() : src, n);
      },
      host_read);
}

cudaError_t memcpy_on(cudaStream_t s, bool async, void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  const char* call = async ? "cudaMemcpyAsync" : "cudaMemcpy";
  std::string why;
  if (stream_index(s, &why) < 0) return fail(cudaErrorInvalidResourceHandle, std::string(call) + ": " + why);
  if (n == 0) return cudaSuccess;
  Side ds, ss;
  cudaMemcpyKind real = kind;
  if (const cudaError_t e = classify(call, dst, src, n, kind, &ds, &ss, &real)) return e;
  if (real == cudaMemcpyHostToHost) {
    std::memcpy(dst, src, n);
    return cudaSuccess;
  }
  if (real == cudaMemcpyHostToDevice && ss == Side::Host && !async) {
    // Staged: the call returns once the source is read, not once the device has it.
    if (const cudaError_t e = sync_stream(s)) return e;
    queue_copy(s, call, dst, src, n, real, ss);
    return run_stream(s);
  }
  if (real == cudaMemcpyDeviceToHost && (ds == Side::Host || !async)) {
    queue_copy(s, call, dst, src, n, real, ss);
    return sync_stream(s);  // into pageable memory, or cudaMemcpy: returns with the data there
  }
  if (real == cudaMemcpyDeviceToHost) {
    // Pinned: undefined until the stream is synchronised. Copies queued
    // before that still read these bytes run first (a GPU orders them).
    if (const cudaError_t e = run_readers_of(dst, n)) return e;
    std::memset(dst, 0xFF, n);
  }
  queue_copy(s, call, dst, src, n, real, ss);
  if (real == cudaMemcpyHostToDevice && !async) return sync_stream(s);  // from pinned memory: synchronous
  return cudaSuccess;
}

cudaError_t memset_on(cudaStream_t s, const char* call, void* p, size_t pitch, int value, size_t width,
                      size_t height) {
  std::string why;
  if (stream_index(s, &why) < 0) return fail(cudaErrorInvalidResourceHandle, std::string(call) + ": " + why);
  if (width == 0 || height == 0) return cudaSuccess;
  char* base = static_cast<char*>(p);
  for (size_t r = 0; r < height; ++r)
    if (!device_range_ok(base + r * pitch, width, &why))
      return fail(cudaErrorInvalidValue, std::string(call) + " of " + std::to_string(width) + " bytes (row " +
                                             std::to_string(r) + "): " + why);
  const std::string label = std::string(call) + "(" + std::to_string(width * height) + " bytes)";
  const bool skip = launch_only();
  enqueue(s, label, [base, pitch, value, width, height, skip] {
    count_copy();
    if (skip) return;
    for (size_t r = 0; r < height; ++r) {
      note_access(reinterpret_cast<uintptr_t>(base + r * pitch), width, true);
      std::memset(base + r * pitch, value, width);
    }
  });
  return cudaSuccess;
}

const char* error_name(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    default: return "cudaError";
  }
}

}  // namespace
}  // namespace hostcuda

using hostcuda::fail;

extern "C" {

cudaError_t cudaGetDeviceCount(int* n) {
  if (!n) return fail(cudaErrorInvalidValue, "cudaGetDeviceCount: null output");
  *n = hostcuda::device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= hostcuda::device_count())
    return fail(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(d) + "): " +
                                            std::to_string(hostcuda::device_count()) + " device(s)");
  hostcuda::g_device = d;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* d) {
  if (!d) return fail(cudaErrorInvalidValue, "cudaGetDevice: null output");
  *d = hostcuda::g_device;
  return cudaSuccess;
}

// An sm_90 device by its limits; the name says what it is (no MFU peak is known for it).
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (!p || d < 0 || d >= hostcuda::device_count())
    return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(" + std::to_string(d) + ")");
  std::memset(p, 0, sizeof *p);
  std::strncpy(p->name, "kvshift host CUDA shim (SIMT emulator)", sizeof p->name - 1);
  p->totalGlobalMem = hostcuda::device_bytes_total();
  p->sharedMemPerBlock = 48 * 1024;
  p->sharedMemPerBlockOptin = 227 * 1024;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  return cudaSuccess;
}

// The attributes the kernels' launchers ask for: compute capability 9.0, as above.
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int d) {
  if (!value || d < 0 || d >= hostcuda::device_count())
    return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute(" + std::to_string(d) + ")");
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    default:
      return fail(cudaErrorNotSupported, "cudaDeviceGetAttribute: attribute " + std::to_string(attr) +
                                             " is not implemented");
  }
}

cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
  if (!free_b || !total_b) return fail(cudaErrorInvalidValue, "cudaMemGetInfo: null output");
  *total_b = hostcuda::device_bytes_total();
  *free_b = *total_b - hostcuda::device_bytes_in_use();
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (!p) return fail(cudaErrorInvalidValue, "cudaMalloc: null output");
  *p = hostcuda::device_malloc(bytes);
  if (!*p && bytes)
    return fail(cudaErrorMemoryAllocation,
                "cudaMalloc of " + std::to_string(bytes) + " bytes: out of memory (" +
                    std::to_string(hostcuda::device_bytes_in_use()) + " of " +
                    std::to_string(hostcuda::device_bytes_total()) +
                    " bytes in use), or the shim's address range is used up (freed memory is never reused)");
  return cudaSuccess;
}

// Synchronises the device first, as cudaFree does.
cudaError_t cudaFree(void* p) {
  const cudaError_t pending = hostcuda::sync_device();
  const cudaError_t e = hostcuda::device_free(p);
  return e != cudaSuccess ? e : pending;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int flags) {
  if (!p) return fail(cudaErrorInvalidValue, "cudaHostAlloc: null output");
  (void)flags;
  *p = hostcuda::pinned_malloc(bytes);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation, "cudaHostAlloc of " + std::to_string(bytes) + " bytes");
}

cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }

cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  const cudaError_t pending = hostcuda::sync_device();
  if (!hostcuda::pinned_free(p))
    return fail(cudaErrorInvalidValue,
                "cudaFreeHost of " + hostcuda::describe(reinterpret_cast<uintptr_t>(p)) + ": not pinned memory");
  return pending;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  return hostcuda::memcpy_on(nullptr, false, dst, src, n, kind);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  return hostcuda::memcpy_on(s, true, dst, src, n, kind);
}

cudaError_t cudaMemset(void* p, int value, size_t n) {
  return hostcuda::memset_on(nullptr, "cudaMemset", p, n, value, n, 1);
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t s) {
  return hostcuda::memset_on(s, "cudaMemsetAsync", p, n, value, n, 1);
}

cudaError_t cudaMemset2DAsync(void* p, size_t pitch, int value, size_t width, size_t height, cudaStream_t s) {
  if (width > pitch && height > 1) return fail(cudaErrorInvalidValue, "cudaMemset2DAsync: width above the pitch");
  return hostcuda::memset_on(s, "cudaMemset2DAsync", p, pitch, value, width, height);
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  if (!a) return fail(cudaErrorInvalidValue, "cudaPointerGetAttributes: null output");
  std::memset(a, 0, sizeof *a);
  a->device = hostcuda::g_device;
  if (hostcuda::device_range_ok(p, 1, nullptr)) {
    a->type = cudaMemoryTypeDevice;
    a->devicePointer = const_cast<void*>(p);
  } else if (hostcuda::is_pinned(p)) {
    a->type = cudaMemoryTypeHost;
    a->hostPointer = const_cast<void*>(p);
    a->devicePointer = const_cast<void*>(p);
  } else {
    a->type = cudaMemoryTypeUnregistered;
    a->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

const char* cudaGetErrorName(cudaError_t e) { return hostcuda::error_name(e); }

const char* cudaGetErrorString(cudaError_t e) {
  if (e == cudaSuccess) return "no error";
  const char* m = hostcuda::message_of(e);
  return m ? m : hostcuda::error_name(e);
}

}  // extern "C"
