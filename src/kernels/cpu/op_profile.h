// Per-op wall time of the CPU engine (`kvshift bench --profile`): each op's
// call site opens a Scope; GEMMs name themselves by shape under the label of
// the projection they belong to. Off by default, and then a Scope costs one
// branch. Ops run on the main thread (their OpenMP regions are inside them),
// so the table needs no locking. Under thread replicas (model/cpu_replicas.h)
// each thread runs its own copy of the ops at once: the first thread's are
// timed (its shapes, its FLOPs, on its one thread). Each op records the
// threads it ran on (omp_get_max_threads(): 1 inside a replica), so that
// its FLOP/s are set against those threads' share of the peak.
#pragma once
#include <omp.h>

#include <chrono>
#include <string>
#include <vector>

#include "core/op_stat.h"

namespace kvs::cpu::profile {

using kvs::profile::OpStat;

inline bool g_enabled = false;

// Whether this thread times its ops: the main thread, or the first replica's.
inline bool timing_here() { return g_enabled && omp_get_thread_num() == 0; }

void set_enabled(bool on);
void add(const std::string& name, double seconds, double flops);
// Every op timed since the last reset, in first-call order; then empties it.
std::vector<OpStat> take();

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Times its own lifetime as `name` (flops: the op's floating-point operations, 0 for data movement).
class Scope {
 public:
  explicit Scope(const char* name, double flops = 0) : on_(timing_here()) {
    if (on_) {
      name_ = name;
      flops_ = flops;
      t0_ = now_s();
    }
  }
  ~Scope() {
    if (on_) add(name_, now_s() - t0_, flops_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool on_;
  const char* name_ = nullptr;
  double flops_ = 0, t0_ = 0;
};

// GEMMs inside its lifetime are reported as "<label> <pass> <shape>".
using Label = kvs::profile::GemmLabel;

// A GEMM out[M, N] (+)= A[M, K] B[K, N] of the current label, `pass` "fwd", "bwd dinp" or "bwd dW".
class GemmScope {
 public:
  GemmScope(const char* pass, int M, int N, int K) : on_(timing_here()) {
    if (on_) {
      name_ = kvs::profile::gemm_name(pass, M, N, K);
      flops_ = 2.0 * M * static_cast<double>(N) * K;
      t0_ = now_s();
    }
  }
  ~GemmScope() {
    if (on_) add(name_, now_s() - t0_, flops_);
  }
  GemmScope(const GemmScope&) = delete;
  GemmScope& operator=(const GemmScope&) = delete;

 private:
  bool on_;
  std::string name_;
  double flops_ = 0, t0_ = 0;
};

}  // namespace kvs::cpu::profile
