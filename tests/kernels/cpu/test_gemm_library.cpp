// The CPU's GEMM library (kernels/cpu/gemm_library.h): the choice per CPU and
// KVS_CPU_GEMM, the threading (split into tiles or the library's own) and
// KVS_CPU_GEMM_THREADS, both libraries' products against double-precision sums, and
// signal handlers (ours, and one installed by someone else) during oneDNN's GEMMs.
#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/signal_stack.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/cpu/gemm_library.h"
#include "kernels/cpu/gemm_peak.h"
#include "kernels/cpu/ops_test_util.h"
#include "train/stop_signals.h"

namespace kvs::cpu {
namespace {

CpuFeatures avx2(bool intel, bool amd) {
  CpuFeatures f;
  f.intel = intel;
  f.amd = amd;
  f.ssse3 = f.sse4_2 = f.avx = f.avx2 = f.fma = true;
  return f;
}
CpuFeatures avx512(bool intel, bool amd) {
  CpuFeatures f = avx2(intel, amd);
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512cd = true;
  return f;
}

TEST(GemmLibrary, CpusWithAvx512RunOneDnnAndEveryOtherCpuOpenBlas) {
  const GemmLibraryChoice intel512 = choose_gemm_library(nullptr, avx512(true, false));
  EXPECT_EQ(intel512.library, GemmLibrary::OneDNN);
  EXPECT_EQ(intel512.source, "Intel CPU with AVX-512");
  const GemmLibraryChoice amd512 = choose_gemm_library(nullptr, avx512(false, true));
  EXPECT_EQ(amd512.library, GemmLibrary::OneDNN);  // Zen 4: 1.13-1.31x OpenBLAS Cooperlake
  EXPECT_EQ(amd512.source, "AMD CPU with AVX-512");
  const GemmLibraryChoice other512 = choose_gemm_library(nullptr, avx512(false, false));
  EXPECT_EQ(other512.library, GemmLibrary::OneDNN);
  EXPECT_EQ(other512.source, "CPU (neither Intel nor AMD) with AVX-512");
  const GemmLibraryChoice intel2 = choose_gemm_library(nullptr, avx2(true, false));
  EXPECT_EQ(intel2.library, GemmLibrary::OpenBLAS);
  EXPECT_EQ(intel2.source, "Intel CPU without AVX-512");
  const GemmLibraryChoice amd2 = choose_gemm_library(nullptr, avx2(false, true));  // Zen 3: no faster
  EXPECT_EQ(amd2.library, GemmLibrary::OpenBLAS);
  EXPECT_EQ(amd2.source, "AMD CPU without AVX-512");
  EXPECT_EQ(choose_gemm_library(nullptr, avx2(false, false)).library, GemmLibrary::OpenBLAS);
  // AVX-512 needs all four subsets, as for OpenBLAS's SkylakeX kernels.
  CpuFeatures partial = avx512(true, false);
  partial.avx512vl = false;
  EXPECT_EQ(choose_gemm_library(nullptr, partial).library, GemmLibrary::OpenBLAS);
  EXPECT_EQ(choose_gemm_library("", avx512(true, false)).library, GemmLibrary::OneDNN);  // set but empty: unset
}

TEST(GemmLibrary, TheUsersKvsCpuGemmWinsAndABadValueIsAnError) {
  for (const char* v : {"openblas", "OpenBLAS"}) {
    const GemmLibraryChoice c = choose_gemm_library(v, avx512(true, false));
    EXPECT_EQ(c.library, GemmLibrary::OpenBLAS) << v;
    EXPECT_EQ(c.source, "KVS_CPU_GEMM");
  }
  for (const char* v : {"onednn", "oneDNN"})
    EXPECT_EQ(choose_gemm_library(v, avx2(false, true)).library, GemmLibrary::OneDNN);
  try {
    choose_gemm_library("mkl", avx512(true, false));
    FAIL() << "no error for KVS_CPU_GEMM=mkl";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KVS_CPU_GEMM=mkl: expected openblas or onednn"), std::string::npos)
        << e.what();
  }
}

// oneDNN's start-up check: asked only where oneDNN would run; a failure makes
// the default OpenBLAS (saying why) and the user's KVS_CPU_GEMM=onednn an
// error. Here (any x86 CPU) the real check passes.
TEST(GemmLibrary, AFailedOneDnnCheckFallsBackToOpenBlasOrIsTheUsersError) {
  int asked = 0;
  const auto works = [&] {
    ++asked;
    return std::string();
  };
  const auto broken = [&] {
    ++asked;
    return std::string("dnnl_sgemm returned status 5");
  };
  EXPECT_EQ(choose_gemm_library(nullptr, avx512(true, false), works).library, GemmLibrary::OneDNN);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(choose_gemm_library(nullptr, avx2(false, true), broken).library, GemmLibrary::OpenBLAS);
  EXPECT_EQ(choose_gemm_library("openblas", avx512(true, false), broken).library, GemmLibrary::OpenBLAS);
  EXPECT_EQ(asked, 1);  // not asked where OpenBLAS runs anyway

  const GemmLibraryChoice fell_back = choose_gemm_library(nullptr, avx512(true, false), broken);
  EXPECT_EQ(fell_back.library, GemmLibrary::OpenBLAS);
  EXPECT_TRUE(fell_back.onednn_failed);
  EXPECT_EQ(fell_back.source,
            "Intel CPU with AVX-512, but oneDNN's GEMM failed a start-up check: dnnl_sgemm returned status 5");
  EXPECT_FALSE(choose_gemm_library(nullptr, avx512(true, false), works).onednn_failed);
  // Where oneDNN may run at all (the peak calibration asks): not after a failed
  // check, nor where the user chose OpenBLAS; on a CPU that defaults to OpenBLAS, yes.
  EXPECT_FALSE(fell_back.onednn_allowed());
  EXPECT_FALSE(choose_gemm_library("openblas", avx512(true, false), works).onednn_allowed());
  EXPECT_TRUE(choose_gemm_library(nullptr, avx2(false, true), works).onednn_allowed());
  EXPECT_TRUE(choose_gemm_library("onednn", avx2(false, true), works).onednn_allowed());
  try {
    choose_gemm_library("onednn", avx2(false, true), broken);
    FAIL() << "no error for KVS_CPU_GEMM=onednn where oneDNN fails";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KVS_CPU_GEMM=onednn: oneDNN's GEMM does not work here (dnnl_sgemm "
                                         "returned status 5); use openblas"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(onednn_check(), "");
}

TEST(GemmLibrary, ThisProcessRunsWhatTheChoiceSaysAndAScopeRestoresIt) {
  const GemmLibraryChoice expected = choose_gemm_library(std::getenv("KVS_CPU_GEMM"), detect_cpu_features());
  EXPECT_EQ(select_gemm_library().library, expected.library);
  EXPECT_EQ(gemm_library(), expected.library);
  for (GemmLibrary lib : {GemmLibrary::OpenBLAS, GemmLibrary::OneDNN}) {
    {
      const GemmLibraryScope on(lib);
      EXPECT_EQ(gemm_library(), lib);
    }
    EXPECT_EQ(gemm_library(), expected.library);
  }
  EXPECT_EQ(gemm_library_name(GemmLibrary::OneDNN, true).rfind("oneDNN ", 0), 0u);
  EXPECT_EQ(gemm_library_name(GemmLibrary::OpenBLAS, true), "OpenBLAS " + openblas_core());
}

// A row-major C = alpha op(A) op(B) + beta C0 with padded leading dimensions
// (op(A) is M x K, stored K x M when transposed; op(B) K x N likewise).
struct Product {
  int M, N, K;
  bool ta, tb;
  int lda, ldb, ldc;
  ops_test::FVec A, B, C0;
  Product(int m, int n, int k, int pad, bool trans_a, bool trans_b, uint64_t seed)
      : M(m), N(n), K(k), ta(trans_a), tb(trans_b), lda((ta ? M : K) + pad), ldb((tb ? K : N) + pad), ldc(N + pad),
        A(ops_test::to_float(ops_test::randn(size_t(ta ? K : M) * lda, seed))),
        B(ops_test::to_float(ops_test::randn(size_t(tb ? N : K) * ldb, seed + 1))),
        C0(ops_test::to_float(ops_test::randn(size_t(M) * ldc, seed + 2))) {}
  // sgemm into a copy of C0 (NaN where beta = 0 says C is never read).
  ops_test::FVec run(float alpha, float beta) const {
    ops_test::FVec C = C0;
    if (beta == 0.0f)
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) C[size_t(i) * ldc + j] = std::nanf("");
    sgemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
    return C;
  }
  // C against double-precision sums (relative to the norm), every element
  // finite, the padding past N as in C0.
  void expect_matches(const ops_test::FVec& C, float alpha, float beta) const {
    double err = 0, norm = 0;
    for (int i = 0; i < M; ++i) {
      for (int j = 0; j < N; ++j) {
        double s = 0;
        for (int k = 0; k < K; ++k)
          s += double(ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k]) *
               double(tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j]);
        const double want = alpha * s + (beta == 0.0f ? 0.0 : beta * double(C0[size_t(i) * ldc + j]));
        const double got = C[size_t(i) * ldc + j];
        ASSERT_TRUE(std::isfinite(got)) << i << "," << j;
        err += (got - want) * (got - want);
        norm += want * want;
      }
      for (int j = N; j < ldc; ++j) ASSERT_EQ(C[size_t(i) * ldc + j], C0[size_t(i) * ldc + j]) << "padding of row " << i;
    }
    EXPECT_LT(std::sqrt(err / norm), ops_test::kFloatTol);
  }
};

// Odd sizes (edge tiles) and a K past one cache block, and one row (M = 1:
// generate's tokens, OpenBLAS's sgemv), every transpose and beta 0 (C full of
// NaN: never read), 1 and 0.25; the padding stays as it was.
TEST(GemmLibrary, BothLibrariesComputeEveryTransposeAndBetaAgainstDoubleSums) {
  for (GemmLibrary lib : {GemmLibrary::OpenBLAS, GemmLibrary::OneDNN})
    for (int M : {67, 1}) {
      const GemmLibraryScope on(lib);
      for (int t = 0; t < 4; ++t) {
        const Product p(M, 45, 300, 3, t & 1, t & 2, 60 + 3 * t);
        for (float beta : {0.0f, 1.0f, 0.25f}) {
          SCOPED_TRACE(gemm_library_name(lib) + " M " + std::to_string(M) + " trans " + std::to_string(p.ta) +
                       std::to_string(p.tb) + " beta " + std::to_string(beta));
          p.expect_matches(p.run(0.5f, beta), 0.5f, beta);
        }
      }
    }
}

TEST(GemmLibrary, KvsCpuGemmThreadsPicksTheThreadingAndABadValueIsAnError) {
  EXPECT_EQ(choose_gemm_threading(nullptr), GemmThreading::kDefault);
  EXPECT_EQ(choose_gemm_threading(""), GemmThreading::kDefault);
  EXPECT_EQ(choose_gemm_threading("Split"), GemmThreading::kSplit);
  EXPECT_EQ(choose_gemm_threading("LIBRARY"), GemmThreading::kLibrary);
  try {
    (void)choose_gemm_threading("auto");
    FAIL() << "no error for KVS_CPU_GEMM_THREADS=auto";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KVS_CPU_GEMM_THREADS=auto: expected split or library"), std::string::npos)
        << e.what();
  }
  // The default: split on OpenBLAS (faster), oneDNN's own threading (no gain to measure).
  EXPECT_EQ(effective_gemm_threading(GemmLibrary::OpenBLAS, GemmThreading::kDefault), GemmThreading::kSplit);
  EXPECT_EQ(effective_gemm_threading(GemmLibrary::OneDNN, GemmThreading::kDefault), GemmThreading::kLibrary);
  for (GemmLibrary lib : {GemmLibrary::OpenBLAS, GemmLibrary::OneDNN})
    for (GemmThreading t : {GemmThreading::kSplit, GemmThreading::kLibrary})
      EXPECT_EQ(effective_gemm_threading(lib, t), t);
  const GemmThreading before = gemm_threading();
  {
    const GemmThreadingScope with(GemmThreading::kLibrary);
    EXPECT_EQ(gemm_threading(), GemmThreading::kLibrary);
  }
  EXPECT_EQ(gemm_threading(), before);
}

// The tiles keep 128 x 128 (else the library's own threading: 1 x 1);
// oneDNN's grid has the most columns, OpenBLAS's the fewest.
TEST(GemmLibrary, SplitGridsKeepTilesOf128By128OnEachLibrarysAxis) {
  struct Case {
    GemmLibrary lib;
    int M, N, threads, rows, cols;
  };
  const GemmLibrary D = GemmLibrary::OneDNN, O = GemmLibrary::OpenBLAS;
  const Case cases[] = {
      {D, 2048, 256, 2, 1, 2},   {O, 2048, 256, 2, 2, 1},    // lm-small's projections
      {D, 2048, 128, 2, 2, 1},   {O, 2048, 128, 2, 2, 1},    // K and V: 64 columns each would be too few
      {D, 128, 256, 2, 1, 2},    {O, 128, 256, 2, 1, 2},     // K and V's dW: 64 rows each would be too few
      {D, 2048, 1376, 16, 2, 8}, {O, 2048, 1376, 16, 16, 1}, // gate and up on 16 threads
      {D, 2048, 256, 7, 7, 1},   {D, 256, 256, 16, 1, 1},    // 7: rows only; 16 tiles of 256 x 256: too small
      {D, 1, 4096, 2, 1, 1},     {O, 1, 4096, 2, 1, 1},      // one row (generate): the library's
      {D, 2048, 2048, 1, 1, 1},  {D, 255, 255, 2, 1, 1},
  };
  for (const Case& c : cases) {
    const GemmGrid g = gemm_split_grid(c.lib, c.M, c.N, c.threads);
    EXPECT_EQ(g.rows, c.rows) << gemm_library_name(c.lib) << " " << c.M << "x" << c.N << " on " << c.threads;
    EXPECT_EQ(g.cols, c.cols) << gemm_library_name(c.lib) << " " << c.M << "x" << c.N << " on " << c.threads;
  }
}

// Split products (2 and 4 threads: grids 1 x 2 / 2 x 1 and 2 x 2; columns cut
// at 16-float boundaries, a padded ldc) against double sums, with every
// transpose, alpha 1 and 0.75 and beta 0 (C full of NaN) and 0.25; and bit
// for bit against each tile's own one-thread call of the same library on the
// same block (what the split promises, on any CPU). Whether the tiles also
// give the whole product's one-thread bits depends on the library's kernels:
// they did on the Zen 3, Zen 4 and Intel VMs of docs/KERNELS.md, not on CI's
// machine of 2026-12-01, so that is printed, not asserted.
TEST(GemmLibrary, SplitProductsMatchDoubleSumsAndEachTilesOneThreadCall) {
  const int M = 300, N = 290, K = 200;
  const int threads_before = omp_get_max_threads();
  for (GemmLibrary lib : {GemmLibrary::OpenBLAS, GemmLibrary::OneDNN})
    for (int t = 0; t < 4; ++t) {
      const GemmLibraryScope on(lib);
      const Product p(M, N, K, 5, t & 1, t & 2, 160 + 3 * t);
      for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{1.0f, 0.25f}, std::pair{0.75f, 0.0f}}) {
        auto product = [&](int threads, GemmThreading th) {
          omp_set_num_threads(threads);
          const GemmThreadingScope with(th);
          ops_test::FVec C = p.run(alpha, beta);
          omp_set_num_threads(threads_before);
          return C;
        };
        const ops_test::FVec whole = product(1, GemmThreading::kLibrary);
        for (int threads : {2, 4}) {
          const std::string what = gemm_library_name(lib) + " trans " + std::to_string(p.ta) + std::to_string(p.tb) +
                                   " alpha " + std::to_string(alpha) + " beta " + std::to_string(beta) + " threads " +
                                   std::to_string(threads);
          SCOPED_TRACE(what);
          const GemmGrid g = gemm_split_grid(lib, M, N, threads);
          ASSERT_GT(g.tiles(), 1);
          const ops_test::FVec C = product(threads, GemmThreading::kSplit);
          p.expect_matches(C, alpha, beta);
          // Each tile again, one call on one thread outside any region.
          ops_test::FVec tiles = p.C0;
          omp_set_num_threads(1);
          for (int i = 0; i < g.tiles(); ++i) {
            const auto [m0, m1, n0, n1] = gemm_split_tile(g, M, N, i);
            ASSERT_TRUE(m0 < m1 && n0 < n1 && n0 % 16 == 0) << "tile " << i;
            float* c = tiles.data() + size_t(m0) * p.ldc + n0;
            if (beta == 0.0f)
              for (int r = 0; r < m1 - m0; ++r)
                std::fill(c + size_t(r) * p.ldc, c + size_t(r) * p.ldc + n1 - n0, std::nanf(""));
            sgemm(p.ta, p.tb, m1 - m0, n1 - n0, K, alpha, p.ta ? p.A.data() + m0 : p.A.data() + size_t(m0) * p.lda,
                  p.lda, p.tb ? p.B.data() + size_t(n0) * p.ldb : p.B.data() + n0, p.ldb, beta, c, p.ldc);
          }
          omp_set_num_threads(threads_before);
          p.expect_matches(tiles, alpha, beta);  // the tiles cover C
          EXPECT_EQ(std::memcmp(C.data(), tiles.data(), C.size() * sizeof(float)), 0)
              << "split bits differ from its tiles' one-thread calls";
          if (alpha == 1.0f && std::memcmp(C.data(), whole.data(), C.size() * sizeof(float)) != 0)
            std::printf("note: %s: the split's bits are not the whole product's one-thread bits here (%s, %s)\n",
                        what.c_str(), cpu_identity().c_str(), openblas_core().c_str());
        }
      }
    }
}

// K = 0: C = beta C on both libraries (oneDNN's own call left C as it was
// with beta = 0, NaN included); the padding untouched.
TEST(GemmLibrary, AnEmptySumLeavesBetaTimesC) {
  const int M = 3, N = 5, ldc = 7;
  for (GemmLibrary lib : {GemmLibrary::OpenBLAS, GemmLibrary::OneDNN})
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      SCOPED_TRACE(gemm_library_name(lib) + " beta " + std::to_string(beta));
      const GemmLibraryScope on(lib);
      std::vector<float> C(size_t(M) * ldc);
      for (size_t i = 0; i < C.size(); ++i) C[i] = beta == 0.0f && int(i % ldc) < N ? std::nanf("") : float(i);
      const float dummy = 1.0f;
      sgemm(false, false, M, N, 0, 1.0f, &dummy, 1, &dummy, N, beta, C.data(), ldc);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < ldc; ++j) {
          const size_t at = size_t(i) * ldc + j;
          const float want = j >= N ? float(at) : beta == 0.0f ? 0.0f : beta * float(at);
          EXPECT_EQ(C[at], want) << i << "," << j;
        }
    }
}

// oneDNN 2.6's GEMM kernels run with rsp in a heap workspace, where a
// handler's frame would land (core/signal_stack.h): before the fix, these
// shapes gave wrong products and wrote outside C within a few hundred calls
// under this storm of `sig`, and `kvshift train` aborted with a corrupted
// heap when SIGTERM stopped it. Every product and the memory around it must
// stay as they are: with the signals going to this thread, then with this
// thread blocking them, so that they go to the other OpenMP threads of the
// GEMMs.
void expect_gemms_unchanged_under_signal_storm(int sig, const std::vector<GemmLibrary>& libs) {
  struct Shape {
    bool ta, tb;
    int M, N, K;
  };
  const Shape shapes[] = {{false, false, 2048, 64, 256}, {true, false, 64, 64, 2048}, {false, true, 2048, 256, 64}};
  const size_t guard = 4096;
  const float fill = 7.0f;
  struct Case {
    GemmLibrary lib;
    Shape s;
    ops_test::FVec A, B, quiet;
  };
  std::vector<Case> cases;
  // The quiet products first, before any signal (and with no signal blocked:
  // the OpenMP threads they start keep this thread's mask).
  for (GemmLibrary lib : libs)
    for (const Shape& s : shapes) {
      Case c{lib, s, ops_test::to_float(ops_test::randn(size_t(s.M) * s.K, 90)),
             ops_test::to_float(ops_test::randn(size_t(s.K) * s.N, 91)), ops_test::FVec(size_t(s.M) * s.N)};
      const GemmLibraryScope on(lib);
      sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, c.A.data(), s.ta ? s.M : s.K, c.B.data(), s.tb ? s.K : s.N, 0.0f,
            c.quiet.data(), s.N);
      cases.push_back(std::move(c));
    }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  std::atomic<bool> stop{false};
  std::atomic<long> sent{0};
  const pid_t pid = getpid();
  std::thread sender([&] {
    pthread_sigmask(SIG_BLOCK, &set, nullptr);  // never this thread's: it goes to one that runs the GEMMs
    while (!stop.load()) {
      kill(pid, sig);
      sent.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  for (const Case& c : cases) {
    const Shape& s = c.s;
    SCOPED_TRACE(gemm_library_name(c.lib) + " " + std::to_string(s.M) + "x" + std::to_string(s.N) + "x" +
                 std::to_string(s.K));
    const GemmLibraryScope on(c.lib);
    const size_t nc = c.quiet.size();
    ops_test::FVec buf(nc + 2 * guard, fill);
    float* C = buf.data() + guard;
    for (bool to_workers : {false, true}) {
      if (to_workers) pthread_sigmask(SIG_BLOCK, &set, nullptr);
      int wrong = 0, outside = 0;
      for (int rep = 0; rep < 100; ++rep) {
        sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, c.A.data(), s.ta ? s.M : s.K, c.B.data(), s.tb ? s.K : s.N, 0.0f, C,
              s.N);
        wrong += std::memcmp(c.quiet.data(), C, nc * sizeof(float)) != 0;
        for (size_t i = 0; i < guard; ++i) outside += buf[i] != fill || buf[guard + nc + i] != fill;
      }
      if (to_workers) pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
      const char* to = to_workers ? "the other OpenMP threads" : "this thread";
      EXPECT_EQ(wrong, 0) << "products that differ from the quiet one, of 100, signals to " << to;
      EXPECT_EQ(outside, 0) << "writes outside C, signals to " << to;
      if (outside) break;
    }
  }
  stop = true;
  sender.join();
  EXPECT_GT(sent.load(), 100);
}

// Our handlers (StopSignals, here with SIGUSR2 as the extra signal: repeated,
// it only counts), on both libraries, split over the threads (one shape is
// split on 2 threads) and with the libraries' own threading.
TEST(GemmLibrary, OurSignalHandlersDuringGemmsChangeNoProductAndNoMemoryAroundIt) {
  const StopSignals handlers(StopSignal::Usr2, /*announce=*/false);
  for (GemmThreading t : {GemmThreading::kSplit, GemmThreading::kLibrary}) {
    SCOPED_TRACE(gemm_threading_name(t));
    const GemmThreadingScope with(t);
    expect_gemms_unchanged_under_signal_storm(SIGUSR2, {GemmLibrary::OpenBLAS, GemmLibrary::OneDNN});
  }
}

std::atomic<long> foreign_calls{0};
extern "C" void foreign_handler(int) { foreign_calls.fetch_add(1, std::memory_order_relaxed); }

// A handler someone else installed without SA_ONSTACK (a profiler's, an MPI
// library's) before the first oneDNN GEMM: the GEMM path moves it onto the
// alternate stacks (once per process, so here the test does it, as the
// first GEMM of a fresh process would).
TEST(GemmLibrary, AForeignHandlerInstalledWithoutOnStackChangesNoProduct) {
  struct sigaction old {}, foreign {};
  foreign.sa_handler = foreign_handler;
  foreign.sa_flags = SA_RESTART;
  sigemptyset(&foreign.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR1, &foreign, &old), 0);
  EXPECT_GE(move_signal_handlers_to_alternate_stacks(), 1);
  expect_gemms_unchanged_under_signal_storm(SIGUSR1, {GemmLibrary::OneDNN});
  EXPECT_GT(foreign_calls.load(), 100);
  ::sigaction(SIGUSR1, &old, nullptr);
}

}  // namespace
}  // namespace kvs::cpu
