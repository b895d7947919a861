// Which library the CPU engine's fp32 GEMMs (matmul.h, the calibrated peak)
// run on: OpenBLAS, with the kernel family blas_kernels.h picks, or oneDNN's
// dnnl_sgemm, whose JIT kernels follow the CPU's ISA flags.
//
// The default follows measurements (docs/PERFORMANCE.md, issue 21): on CPUs
// with AVX-512 oneDNN's GEMMs were faster than OpenBLAS's best kernels at the
// model's step shapes (Intel model 207: 1.09-1.12x SkylakeX; AMD Zen 4:
// 1.13x Cooperlake on 1 thread, 1.31x on 2) and gave the same bits on 1 and
// 2 threads; on an AMD Zen 3 (AVX2) they were no faster, and held to AVX2 on
// the Intel VM 1.00-1.04x, so every CPU without AVX-512 keeps OpenBLAS.
// KVS_CPU_GEMM=openblas|onednn overrides the choice. The double-precision
// GEMMs (tests, references) are always OpenBLAS's.
//
// The two libraries' results differ in the last bits, as two OpenBLAS kernel
// families' do: a run is bit-reproducible for a fixed library, kernel family
// and thread count.
//
// Signals: Debian's oneDNN 2.6.3 runs its GEMM kernels with rsp pointing into
// a heap workspace (oneDNN issue #4845, fixed in 3.11), so a signal handler
// whose frame lands there corrupts the product and the heap. Our handlers
// run on alternate stacks, which every thread of a oneDNN GEMM gets
// (core/signal_stack.h); so do the handlers others installed before the
// first oneDNN GEMM (SA_ONSTACK is added to them). A handler installed
// without SA_ONSTACK after that (a profiler attached mid-run) is not
// covered: use KVS_CPU_GEMM=openblas with one.
#pragma once
#include <functional>
#include <string>

#include "kernels/cpu/blas_kernels.h"

namespace kvs::cpu {

enum class GemmLibrary { OpenBLAS, OneDNN };

// "OpenBLAS", "oneDNN"; with_version adds the library's own (oneDNN 2.6.3,
// OpenBLAS SkylakeX: its kernel family).
std::string gemm_library_name(GemmLibrary lib, bool with_version = false);

struct GemmLibraryChoice {
  GemmLibrary library = GemmLibrary::OpenBLAS;
  std::string source;  // "KVS_CPU_GEMM" (the user's), "AMD CPU with AVX-512", "Intel CPU without AVX-512", ...
  bool onednn_failed = false;  // the default would have been oneDNN, whose start-up check failed
  std::string describe() const;  // one line for logs: "oneDNN 2.6.3 (Intel CPU with AVX-512)"
  // Whether oneDNN may run in this process at all: not where its start-up
  // check failed, nor where the user chose OpenBLAS (KVS_CPU_GEMM=openblas
  // keeps oneDNN out of the process, e.g. beside a profiler's signals).
  bool onednn_allowed() const;
};

// Whether oneDNN's GEMM works in this process: "" when a 64x64x64 product of
// small integers comes out exact, else what went wrong (its JIT needs
// executable memory, which a hardened sandbox may refuse).
std::string onednn_check();

// The decision alone, for tests: `user` is KVS_CPU_GEMM (null when unset).
// Throws kvs::Error naming the variable for a value other than openblas or
// onednn (any case). `onednn_works` is asked only when the answer would be
// oneDNN: a non-empty reply makes the default OpenBLAS (the source says
// why), and KVS_CPU_GEMM=onednn an error.
GemmLibraryChoice choose_gemm_library(const char* user, const CpuFeatures& f,
                                      const std::function<std::string()>& onednn_works = onednn_check);

// Decides once per process from KVS_CPU_GEMM, the CPU and oneDNN's start-up
// check (later calls return the first answer) and makes it the running
// library. The first GEMM calls it if nobody has.
const GemmLibraryChoice& select_gemm_library();

// Throws kvs::Error for a bad KVS_CPU_GEMM or KVS_CPU_GEMM_THREADS value, without the oneDNN check
// (which costs tens of milliseconds): for main, before any work.
void check_gemm_library_variable();

// The library the GEMMs run on now (the selected one unless set_gemm_library
// changed it).
GemmLibrary gemm_library();

// Runs the GEMMs on `lib` from now on: for `bench --compare-gemm` and tests
// that check both. No GEMM may run at the same time.
void set_gemm_library(GemmLibrary lib);

// Runs the GEMMs on `lib` while it lives, then on the library that ran before.
class GemmLibraryScope {
 public:
  explicit GemmLibraryScope(GemmLibrary lib) : prev_(gemm_library()) { set_gemm_library(lib); }
  ~GemmLibraryScope() { set_gemm_library(prev_); }
  GemmLibraryScope(const GemmLibraryScope&) = delete;
  GemmLibraryScope& operator=(const GemmLibraryScope&) = delete;

 private:
  GemmLibrary prev_;
};

// How a product's threads share it. kSplit: C is cut into one tile per
// thread, each a one-thread call of the library (which runs single-threaded
// inside an OpenMP region); kLibrary: the library's own threading; kDefault:
// kSplit on OpenBLAS, kLibrary on oneDNN. At lm-small's step shapes on 2
// threads (AMD Zen 4, scripts/bench_gemm_split.sh, docs/PERFORMANCE.md)
// OpenBLAS's GEMMs were 1.05-1.08x as fast split (by rows), oneDNN's
// 1.01-1.04x, and whole steps 0.995-1.14x and 0.98-1.03x: a gain for
// OpenBLAS, none to measure for oneDNN, which keeps its own threading where
// more threads were never measured. Each tile's bits are its one-thread
// call's (a sum over all of K); whether they are also the whole product's
// one-thread bits is the library's affair (they were on the CPUs in
// docs/KERNELS.md, not on every CPU).
// KVS_CPU_GEMM_THREADS=split|library chooses for both libraries.
enum class GemmThreading { kDefault, kSplit, kLibrary };

// "split" or "library" (kDefault: "default").
const char* gemm_threading_name(GemmThreading t);

// The user's KVS_CPU_GEMM_THREADS (null or empty: kDefault). Throws kvs::Error
// naming the variable for another value.
GemmThreading choose_gemm_threading(const char* user);

// The threading setting now (KVS_CPU_GEMM_THREADS's unless set_gemm_threading
// changed it), and a change of it (bench, tests; no GEMM may run at the same
// time).
GemmThreading gemm_threading();
void set_gemm_threading(GemmThreading t);

// What `setting` means on `lib`: kSplit or kLibrary.
GemmThreading effective_gemm_threading(GemmLibrary lib, GemmThreading setting);

// kSplit's tiles for C[M, N] on `threads` threads: rows x cols = threads, or
// 1 x 1 (the library's own threading) where a tile would have fewer than
// kMinRows rows or kMinCols columns: small tiles pack their operands for
// little work, and the libraries' own threading can split K instead (more
// threads than 2 were never measured split). oneDNN takes the grid with the
// most columns (faster by columns at N >= 256 on 2 threads), OpenBLAS the one
// with the fewest (faster by rows at every shape measured).
struct GemmGrid {
  static constexpr int kMinRows = 128, kMinCols = 128;
  int rows = 1, cols = 1;
  int tiles() const { return rows * cols; }
};
GemmGrid gemm_split_grid(GemmLibrary lib, int M, int N, int threads);

// Tile t (row-major over the grid) of C[M, N]: rows [M r / rows, M (r+1) /
// rows), columns cut at multiples of 16 floats (a 64-byte line: no two
// threads write one). kSplit computes each with one single-threaded call of
// the library on that block of A, B and C.
struct GemmTile {
  int m0, m1, n0, n1;
};
GemmTile gemm_split_tile(GemmGrid g, int M, int N, int t);

// Runs the GEMMs with `t` while it lives, then as before.
class GemmThreadingScope {
 public:
  explicit GemmThreadingScope(GemmThreading t) : prev_(gemm_threading()) { set_gemm_threading(t); }
  ~GemmThreadingScope() { set_gemm_threading(prev_); }
  GemmThreadingScope(const GemmThreadingScope&) = delete;
  GemmThreadingScope& operator=(const GemmThreadingScope&) = delete;

 private:
  GemmThreading prev_;
};

// Row-major C[M,N] = alpha op(A) op(B) + beta C on the running library, on
// omp_get_max_threads() threads (split over them, or by the library: OpenBLAS
// then on its own thread count, which the callers set alongside); inside an
// OpenMP region on the calling thread alone. beta = 0: C is not read (it may
// hold NaN).
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
           int ldb, float beta, float* C, int ldc);

}  // namespace kvs::cpu
