// Kernel launches of the host CUDA shim. tests/simt/gen.py --launchers
// rewrites each `k<<<grid, block, smem, stream>>>(args);` of a kernel file
// into launch_kernel(k, "k", __FILE__, __LINE__, launch_config(grid, block,
// smem, stream), args): the arguments are converted to the kernel's parameter
// types as a launch converts them, the launch is checked as the driver would
// check it, and the kernel is queued on its stream to run under the SIMT
// emulator (tests/simt/emu.h) with exactly that grid and block. Included by
// the generated files after emu.h.
#pragma once
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "emu.h"
#include "hostcuda.h"

namespace hostcuda {

struct LaunchConfig {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
};
inline LaunchConfig launch_config(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = nullptr) {
  return {grid, block, smem, stream};
}

// The pointer arguments of a launch (after conversion to the parameter types).
template <class T>
void collect_pointers(const T& v, int index, std::vector<std::pair<int, const void*>>& out) {
  if constexpr (std::is_pointer_v<T>) out.push_back({index, reinterpret_cast<const void*>(v)});
}

template <class... P, class... A>
void launch_kernel(void (*kernel)(P...), const char* name, const char* file, int line, const LaunchConfig& c,
                   A&&... a) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launch with the wrong number of arguments");
  using Args = std::tuple<std::decay_t<P>...>;
  auto args = std::make_shared<Args>(std::forward<A>(a)...);
  std::vector<std::pair<int, const void*>> pointers;
  std::apply(
      [&](const auto&... v) {
        int i = 0;
        (collect_pointers(v, i++, pointers), ...);
      },
      *args);
  const LaunchInfo k{reinterpret_cast<const void*>(kernel), name, file, line, c.grid, c.block, c.smem, c.stream};
  if (!check_launch(k, pointers)) return;
  if (launch_only()) {
    enqueue(c.stream, kernel_label(k), [] { count_kernel(); });
    return;
  }
  enqueue(c.stream, kernel_label(k), [kernel, args, k] {
    count_kernel();
    set_running_kernel(reinterpret_cast<uintptr_t>(::emu::g_smem.data()), ::emu::kDynBytes, ::emu::g_smem.size(),
                       k.smem, &::emu::g_block_idx.x, &::emu::g_grid_dim.x);
    ::emu::launch(::emu::Dim{k.grid.x, k.grid.y, k.grid.z}, ::emu::Dim{k.block.x, k.block.y, k.block.z},
                  [&] { std::apply(kernel, *args); });
    set_running_kernel(0, 0, 0, 0, nullptr, nullptr);
    check_static_smem(k, ::emu::g_static_off - ::emu::kDynBytes);
  });
}

}  // namespace hostcuda

// What cuda_runtime.h declares for nvcc only: the attribute call on a kernel
// (a function, not a const void*), as the launchers make it.
template <class... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}
