// The machine's fp32 GEMM peak on a given number of threads: a large square
// SGEMM, best of a few repetitions, on each GEMM library the engine may run
// here (not oneDNN where its start-up check failed or KVS_CPU_GEMM=openblas)
// and with each threading (gemm_library.h), and the fastest one's figure.
// `kvshift bench` divides the model's FLOP/s by it ("fraction of the
// calibrated peak"), whichever library the run uses. Cached per CPU (model
// name, family, model and stepping), library (OpenBLAS's kernel family,
// oneDNN's version), threading and thread count (in $XDG_CACHE_HOME/kvshift,
// else ~/.cache/kvshift) so repeated benches agree; `recalibrate` measures
// again and replaces the entries.
#pragma once
#include <string>

namespace kvs::cpu {

struct GemmPeak {
  double gflops = 0;  // best 2*n^3 / seconds over the repetitions
  int n = 0, threads = 0;
  std::string core;        // the library it ran on: "OpenBLAS SkylakeX", "oneDNN 2.6.3, split", ...
  std::string measured_at; // UTC time of the measurement
  double loadavg = 0;      // 1-minute load average when measured (other work lowers the peak)
  bool cached = false;     // read from the cache rather than measured now
};

// Measures now: n x n x n SGEMM on the running library and threading
// (gemm_library(), gemm_threading()) and
// `threads` OpenMP/OpenBLAS threads (n = 0: a size that keeps every thread
// busy for about 0.1-0.2 s per product). Sets the thread counts; the caller
// sets them back if it needs others.
GemmPeak measure_sgemm_peak(int threads, int n = 0);

// The best of the libraries' and threadings' cached values for this machine and thread count,
// each measured and stored first if absent (or if `recalibrate`). A cache that
// cannot be read or written is ignored: the values are then measured every
// time. The running library and threading are the same after the call.
GemmPeak sgemm_peak(int threads, bool recalibrate);

// The CPU as /proc/cpuinfo gives it, the cache's key: model name, family,
// model and stepping ("AMD EPYC (family 25, model 1, stepping 1)").
std::string cpu_identity();

}  // namespace kvs::cpu
