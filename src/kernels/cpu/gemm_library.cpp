#include "kernels/cpu/gemm_library.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <strings.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/signal_stack.h"

namespace kvs::cpu {

namespace {

constexpr const char* kUserSource = "KVS_CPU_GEMM";  // GemmLibraryChoice::source when the user chose

std::atomic<GemmLibrary>& running() {
  static std::atomic<GemmLibrary> lib{select_gemm_library().library};
  return lib;
}

// beta = 0 is done as a memset of C and beta = 1: OpenBLAS's own beta = 0
// pass (its gemm_beta kernel, before the product) is slower than glibc's
// memset, by about 6-7% of a forward product at the model's shapes on a Zen 3
// with 2 threads, the same on 1 (scripts/bench_gemm_beta.sh,
// docs/PERFORMANCE.md). The result is the same.
// One row (M = 1: a token of `generate`) is a matrix-vector product: OpenBLAS's
// sgemm packs all of B for it, its sgemv reads B once (about 2x the tokens/s).
void openblas_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                    int ldb, float beta, float* C, int ldc) {
  if (beta == 0.0f) {
    if (ldc == N) std::memset(C, 0, sizeof(float) * M * static_cast<size_t>(N));
    else
      for (int i = 0; i < M; ++i) std::memset(C + static_cast<size_t>(i) * ldc, 0, sizeof(float) * N);
    beta = 1.0f;
  }
  if (M == 1) {
    // C[0, :] += alpha op(B)^T a, where a (row 0 of op(A)) is A's first row, or
    // its first column (stride lda) when A is transposed. B is K x N, or N x K under tb.
    const int inc_a = ta ? lda : 1;
    if (tb) cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, alpha, B, ldb, A, inc_a, beta, C, 1);
    else cblas_sgemv(CblasRowMajor, CblasTrans, K, N, alpha, B, ldb, A, inc_a, beta, C, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
              B, ldb, beta, C, ldc);
}

// oneDNN's kernels run with rsp in a heap workspace: signals must find
// alternate stacks on every thread that runs them (core/signal_stack.h). Its
// threads get such stacks, and the handlers installed before the first GEMM
// are moved onto them (once: a sweep over every signal is ~65 syscalls).
void prepare_signals_for_onednn() {
  static std::once_flag handlers;
  std::call_once(handlers, [] { move_signal_handlers_to_alternate_stacks(); });
  ensure_signal_stacks_on_omp_threads();
}

dnnl_status_t onednn_call(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                          int ldb, float beta, float* C, int ldc) {
  return dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void check_onednn(dnnl_status_t st, bool ta, bool tb, int M, int N, int K, int lda, int ldb, int ldc) {
  KVS_CHECK(st == dnnl_success,
            "oneDNN's dnnl_sgemm failed (status {}) on {}x{}x{} (trans {}{}, ld {} {} {}); KVS_CPU_GEMM=openblas "
            "runs the GEMMs on OpenBLAS instead",
            static_cast<int>(st), M, N, K, ta ? 'T' : 'N', tb ? 'T' : 'N', lda, ldb, ldc);
}

std::atomic<GemmThreading>& threading() {
  static std::atomic<GemmThreading> t{choose_gemm_threading(std::getenv("KVS_CPU_GEMM_THREADS"))};
  return t;
}

// The split form: each tile of gemm_split_tile a single-threaded library
// call on its OpenMP thread (both libraries, Debian's OpenMP builds, run on
// the calling thread alone inside an OpenMP region). An error leaves the
// region as a status, not a throw.
void split_sgemm(GemmLibrary lib, GemmGrid g, bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  std::atomic<int> failed{static_cast<int>(dnnl_success)};
#pragma omp parallel num_threads(g.tiles())
  for (int t = omp_get_thread_num(); t < g.tiles(); t += omp_get_num_threads()) {
    const auto [m0, m1, n0, n1] = gemm_split_tile(g, M, N, t);
    const float* a = ta ? A + m0 : A + static_cast<size_t>(m0) * lda;
    const float* b = tb ? B + static_cast<size_t>(n0) * ldb : B + n0;
    float* cp = C + static_cast<size_t>(m0) * ldc + n0;
    if (lib == GemmLibrary::OneDNN) {
      const dnnl_status_t st = onednn_call(ta, tb, m1 - m0, n1 - n0, K, alpha, a, lda, b, ldb, beta, cp, ldc);
      if (st != dnnl_success) failed.store(static_cast<int>(st));
    } else {
      openblas_sgemm(ta, tb, m1 - m0, n1 - n0, K, alpha, a, lda, b, ldb, beta, cp, ldc);
    }
  }
  check_onednn(static_cast<dnnl_status_t>(failed.load()), ta, tb, M, N, K, lda, ldb, ldc);
}

}  // namespace

std::string gemm_library_name(GemmLibrary lib, bool with_version) {
  if (lib == GemmLibrary::OneDNN) {
    if (!with_version) return "oneDNN";
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  }
  return with_version ? "OpenBLAS " + openblas_core() : "OpenBLAS";
}

std::string GemmLibraryChoice::describe() const { return gemm_library_name(library, true) + " (" + source + ")"; }

bool GemmLibraryChoice::onednn_allowed() const {
  return !onednn_failed && !(source == kUserSource && library == GemmLibrary::OpenBLAS);
}

std::string onednn_check() {
  constexpr int n = 64;  // large enough for the JIT kernels, not a reference path
  std::vector<float> A(n * n), B(n * n), C(n * n, std::nanf(""));
  for (int i = 0; i < n * n; ++i) {
    A[i] = static_cast<float>(i % 7 - 3);
    B[i] = static_cast<float>(i % 5 - 2);
  }
  prepare_signals_for_onednn();
  const dnnl_status_t st = dnnl_sgemm('N', 'N', n, n, n, 1.0f, A.data(), n, B.data(), n, 0.0f, C.data(), n);
  if (st != dnnl_success) return fmt::format("dnnl_sgemm returned status {}", static_cast<int>(st));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      float want = 0.0f;  // small integers: every partial sum is exact
      for (int k = 0; k < n; ++k) want += A[i * n + k] * B[k * n + j];
      if (C[i * n + j] != want)
        return fmt::format("a {0}x{0}x{0} product came out wrong at ({1}, {2}): {3} instead of {4}", n, i, j,
                           C[i * n + j], want);
    }
  return {};
}

GemmLibraryChoice choose_gemm_library(const char* user, const CpuFeatures& f,
                                      const std::function<std::string()>& onednn_works) {
  GemmLibraryChoice ch;
  if (user && *user) {
    ch.source = kUserSource;
    if (strcasecmp(user, "openblas") == 0) ch.library = GemmLibrary::OpenBLAS;
    else if (strcasecmp(user, "onednn") == 0) ch.library = GemmLibrary::OneDNN;
    else fail("KVS_CPU_GEMM={}: expected openblas or onednn (or unset it for the CPU's default)", user);
    if (ch.library == GemmLibrary::OneDNN)
      if (const std::string why = onednn_works(); !why.empty())
        fail("KVS_CPU_GEMM={}: oneDNN's GEMM does not work here ({}); use openblas", user, why);
    return ch;
  }
  const char* vendor = f.intel ? "Intel CPU" : f.amd ? "AMD CPU" : "CPU (neither Intel nor AMD)";
  if (isa_level(f) >= 4) {
    ch.library = GemmLibrary::OneDNN;
    ch.source = std::string(vendor) + " with AVX-512";
    if (const std::string why = onednn_works(); !why.empty()) {
      ch.library = GemmLibrary::OpenBLAS;
      ch.onednn_failed = true;
      ch.source += ", but oneDNN's GEMM failed a start-up check: " + why;
    }
  } else {
    ch.library = GemmLibrary::OpenBLAS;
    ch.source = std::string(vendor) + " without AVX-512";
  }
  return ch;
}

const GemmLibraryChoice& select_gemm_library() {
  static const GemmLibraryChoice choice = choose_gemm_library(std::getenv("KVS_CPU_GEMM"), detect_cpu_features());
  return choice;
}

void check_gemm_library_variable() {
  (void)choose_gemm_library(std::getenv("KVS_CPU_GEMM"), detect_cpu_features(), [] { return std::string(); });
  (void)choose_gemm_threading(std::getenv("KVS_CPU_GEMM_THREADS"));
}

GemmLibrary gemm_library() { return running().load(std::memory_order_relaxed); }

void set_gemm_library(GemmLibrary lib) { running().store(lib, std::memory_order_relaxed); }

const char* gemm_threading_name(GemmThreading t) {
  return t == GemmThreading::kSplit ? "split" : t == GemmThreading::kLibrary ? "library" : "default";
}

GemmThreading choose_gemm_threading(const char* user) {
  if (!user || !*user) return GemmThreading::kDefault;
  if (strcasecmp(user, "split") == 0) return GemmThreading::kSplit;
  if (strcasecmp(user, "library") == 0) return GemmThreading::kLibrary;
  fail("KVS_CPU_GEMM_THREADS={}: expected split or library (or unset it for the library's default)", user);
}

GemmThreading effective_gemm_threading(GemmLibrary lib, GemmThreading setting) {
  if (setting != GemmThreading::kDefault) return setting;
  return lib == GemmLibrary::OpenBLAS ? GemmThreading::kSplit : GemmThreading::kLibrary;
}

GemmThreading gemm_threading() { return threading().load(std::memory_order_relaxed); }

void set_gemm_threading(GemmThreading t) { threading().store(t, std::memory_order_relaxed); }

GemmTile gemm_split_tile(GemmGrid g, int M, int N, int t) {
  auto col = [&](int c) { return c == g.cols ? N : static_cast<int>(static_cast<long>(N) * c / g.cols) / 16 * 16; };
  const int r = t / g.cols, c = t % g.cols;
  return {static_cast<int>(static_cast<long>(M) * r / g.rows), static_cast<int>(static_cast<long>(M) * (r + 1) / g.rows),
          col(c), col(c + 1)};
}

GemmGrid gemm_split_grid(GemmLibrary lib, int M, int N, int threads) {
  // Of the grids rows x cols = threads whose tiles keep kMinRows x kMinCols:
  // oneDNN's the one with the most columns, OpenBLAS's the one with the fewest.
  GemmGrid chosen{};
  bool found = false;
  for (int cols = 1; cols <= threads; ++cols) {
    if (threads % cols != 0) continue;
    const int rows = threads / cols;
    if (M / rows < GemmGrid::kMinRows || N / cols < GemmGrid::kMinCols) continue;
    if (!found || lib == GemmLibrary::OneDNN) chosen = {rows, cols};
    found = true;
  }
  return chosen;
}

void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc) {
  if (K == 0) {  // an empty sum: C = beta C (oneDNN left C as it was for beta = 0)
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float& c = C[static_cast<size_t>(i) * ldc + j];
        c = beta == 0.0f ? 0.0f : beta * c;
      }
    return;
  }
  const GemmLibrary lib = gemm_library();
  if (lib == GemmLibrary::OneDNN) prepare_signals_for_onednn();  // every thread of the team, before the region
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const bool split = effective_gemm_threading(lib, gemm_threading()) == GemmThreading::kSplit;
  const GemmGrid g = split ? gemm_split_grid(lib, M, N, threads) : GemmGrid{};  // 1 x 1 for small (or empty) C
  if (g.tiles() > 1) {
    split_sgemm(lib, g, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else if (lib == GemmLibrary::OneDNN) {
    check_onednn(onednn_call(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc), ta, tb, M, N, K, lda, ldb, ldc);
  } else {
    openblas_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

}  // namespace kvs::cpu
