// Per-kernel GPU time of the CUDA engine (`kvshift bench --profile` on a CUDA
// config), from CUDA events, so it needs neither ncu nor nsys (the lent GPU
// machines may lack both: no nsys on the PATH, and ncu cannot read counters
// under gVisor). While it is on, every kernel launch (check_launch, device.h)
// and every cuBLASLt GEMM (Matmul) records an event on its stream after
// itself: an op's time is the GPU time from the previous mark on the same
// stream to its own. Hence:
//   - work enqueued between two marks without a mark of its own (NCCL
//     collectives, copies that do not mark) counts toward the next marked op;
//   - where the host launches slower than the GPU runs, the GPU's idle time
//     before an op counts toward it (the table then sums to more than the
//     kernels' own time: compare with the step's wall time);
//   - a stream's first mark after set_enabled(true) only starts its clock
//     (restart() and take() keep each stream's last mark as the start of
//     its next op; `bench` turns the profile on one untimed step early).
// Off by default; then a mark costs one branch. Marks come from the thread
// that launches the engine's work (one per process).
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "core/op_stat.h"

namespace kvs::cuda::profile {

using kvs::profile::OpStat;

void set_enabled(bool on);
bool enabled();
// The end of an op just enqueued on `stream` (flops: its floating-point
// operations, 0 when not counted).
void mark(const char* name, cudaStream_t stream, double flops = 0);
void mark(const std::string& name, cudaStream_t stream, double flops = 0);
// Restarts `stream`'s clock here, timing nothing: what the stream waited for
// before this point (another stream's work) counts toward no op.
void start(cudaStream_t stream);
// Forgets what was timed; each stream's last mark stays the start of its next op.
void restart();
// Waits for every marked op and returns the sums per op name since the last
// restart (or take), in first-call order; then restarts.
std::vector<OpStat> take();

// The arithmetic of take(), for tests: marks in the order they were enqueued,
// each with its stream and an id for `elapsed_ms(from_id, to_id)` (an empty
// name: start(), which only restarts the stream's clock); `start[s]`
// is stream s's starting mark id (-1: none yet, the stream's first mark only
// starts its clock; updated to each stream's last mark).
struct Mark {
  std::string name;
  const void* stream;
  double flops;
  int id;
};
std::vector<OpStat> sum_marks(const std::vector<Mark>& marks, std::vector<std::pair<const void*, int>>& start,
                              const std::function<double(int, int)>& elapsed_ms);

}  // namespace kvs::cuda::profile
