// Kernel launch checks of the host CUDA shim (launch.h): what the driver
// refuses at launch on an sm_90 GPU (grid and block limits, dynamic shared
// memory above 48 KiB without the opt-in, above the 227 KiB a block can
// have), what the emulator cannot run (blocks that are not whole warps), and
// pointer arguments that are host memory.
#include <map>
#include <string>

#include "hostcuda.h"

namespace hostcuda {

namespace {

constexpr size_t kSmemDefault = 48 * 1024;   // without cudaFuncAttributeMaxDynamicSharedMemorySize
constexpr size_t kSmemOptin = 227 * 1024;    // sm_90's sharedMemPerBlockOptin
std::map<const void*, size_t> g_max_dynamic;  // kernel -> its opt-in

std::string short_path(const char* file) {
  const std::string f = file;
  const size_t at = f.rfind("/src/");
  return at == std::string::npos ? f : f.substr(at + 1);
}

std::string dims(const dim3& d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

}  // namespace

std::string kernel_label(const LaunchInfo& k) {
  return "kernel " + std::string(k.name) + " (" + short_path(k.file) + ":" + std::to_string(k.line) + ", grid " +
         dims(k.grid) + ", block " + dims(k.block) + ")";
}

bool check_launch(const LaunchInfo& k, const std::vector<std::pair<int, const void*>>& pointer_args) {
  auto refuse = [&](cudaError_t code, const std::string& why) {
    set_last_error(fail(code, kernel_label(k) + ": " + why));
    return false;
  };
  const unsigned long long threads = 1ull * k.block.x * k.block.y * k.block.z;
  if (k.grid.x == 0 || k.grid.y == 0 || k.grid.z == 0 || k.grid.x > 2147483647u || k.grid.y > 65535 ||
      k.grid.z > 65535)
    return refuse(cudaErrorInvalidConfiguration, "grid outside [1, 2^31-1] x [1, 65535] x [1, 65535]");
  if (threads == 0 || k.block.x > 1024 || k.block.y > 1024 || k.block.z > 64 || threads > 1024)
    return refuse(cudaErrorInvalidConfiguration, "block of " + std::to_string(threads) + " threads (at most 1024)");
  if (threads % 32 != 0)
    return refuse(cudaErrorNotSupported, "the emulator runs blocks of whole warps, not " + std::to_string(threads) +
                                             " threads");
  auto it = g_max_dynamic.find(k.fn);
  const size_t allowed = it == g_max_dynamic.end() ? kSmemDefault : it->second;
  if (k.smem > allowed)
    return refuse(cudaErrorInvalidValue,
                  std::to_string(k.smem) + " bytes of dynamic shared memory, above the " + std::to_string(allowed) +
                      " the kernel is allowed (cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize))");
  std::string why;
  if (stream_index(k.stream, &why) < 0) return refuse(cudaErrorInvalidResourceHandle, why);
  for (const auto& [index, p] : pointer_args)
    if (p && !is_device_address(p) && !is_pinned(p))
      return refuse(cudaErrorInvalidValue, "argument " + std::to_string(index) + " is " +
                                               describe(reinterpret_cast<uintptr_t>(p)) +
                                               ", not a device pointer");
  return true;
}

void check_static_smem(const LaunchInfo& k, size_t bytes) {
  if (bytes > kSmemDefault)
    op_violation(cudaErrorInvalidValue, kernel_label(k) + ": " + std::to_string(bytes) +
                                            " bytes of static shared memory (at most 48 KiB)");
  else if (bytes + k.smem > kSmemOptin)
    op_violation(cudaErrorInvalidValue, kernel_label(k) + ": " + std::to_string(bytes) + " static and " +
                                            std::to_string(k.smem) + " dynamic bytes of shared memory (at most " +
                                            std::to_string(kSmemOptin) + ")");
}

}  // namespace hostcuda

extern "C" cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return hostcuda::fail(cudaErrorNotSupported,
                          "cudaFuncSetAttribute: attribute " + std::to_string(attr) + " is not implemented");
  if (value < 0 || static_cast<size_t>(value) > hostcuda::kSmemOptin)
    return hostcuda::fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: " + std::to_string(value) +
                                                     " bytes of dynamic shared memory (at most " +
                                                     std::to_string(hostcuda::kSmemOptin) + ")");
  hostcuda::g_max_dynamic[func] = static_cast<size_t>(value);
  return cudaSuccess;
}
