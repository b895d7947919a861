#!/usr/bin/env bash
# Each GEMM split into one tile per thread (rows or columns, each a one-thread
# library call: the CPU engine's default, kernels/cpu/gemm_library.h) against
# the library's own threading, at lm-small's step shapes as the engine runs
# them (gate and up fused), on OpenBLAS or oneDNN: the three alternated in one
# process, eight buffer sets in turn, medians of 48, and the sums weighted by
# each shape's calls per step. The tiles of a split cut at the engine's
# 16-float column boundaries; unlike the engine (gemm_split_grid), every
# shape is split both ways, also k,v dW's 128 rows into two of 64 (the
# engine splits that one by columns).
#   bash scripts/bench_gemm_split.sh onednn|openblas [threads]   (default: onednn 2)
# OpenBLAS picks its kernels from the CPU model here: set OPENBLAS_CORETYPE to
# the family `kvshift bench` names.
set -euo pipefail
inc=/usr/include/x86_64-linux-gnu/openblas-openmp
lib=/usr/lib/x86_64-linux-gnu/openblas-openmp
[ -f /usr/include/dnnl.h ] || { echo "bench_gemm_split: needs libdnnl-dev (apt-get install libdnnl-dev)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/b.cpp" <<'CPP'
#include <cblas.h>
#include <dnnl.h>
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
extern "C" void openblas_set_num_threads(int);
struct Shape { const char* name; bool ta, tb; int M, N, K, calls; };
static bool use_onednn;
static void gemm(const Shape& s, int m0, int m1, int n0, int n1, const float* A, const float* B, float* C) {
  const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
  const float* a = s.ta ? A + m0 : A + (size_t)m0 * lda;
  const float* b = s.tb ? B + (size_t)n0 * ldb : B + n0;
  float* c = C + (size_t)m0 * s.N + n0;
  if (use_onednn)
    dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', m1 - m0, n1 - n0, s.K, 1.f, a, lda, b, ldb, 0.f, c, s.N);
  else
    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, m1 - m0, n1 - n0,
                s.K, 1.f, a, lda, b, ldb, 0.f, c, s.N);
}
// by = 0: the library's threads; 1: rows split; 2: columns split (16-float boundaries).
static void run(const Shape& s, int by, const float* A, const float* B, float* C) {
  if (by == 0) return gemm(s, 0, s.M, 0, s.N, A, B, C);
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    if (by == 1) gemm(s, (long)s.M * t / n, (long)s.M * (t + 1) / n, 0, s.N, A, B, C);
    else gemm(s, 0, s.M, (int)((long)s.N * t / n) / 16 * 16, t + 1 == n ? s.N : (int)((long)s.N * (t + 1) / n) / 16 * 16,
              A, B, C);
  }
}
int main(int argc, char** argv) {
  use_onednn = std::strcmp(argv[1], "onednn") == 0;
  const int T = std::atoi(argv[2]);
  omp_set_num_threads(T);
  openblas_set_num_threads(T);
  // lm-small (configs/toy/lm-small-kvshift.json): 2048 tokens a step, out = inp W^T and its backward (matmul.h).
  const Shape shapes[] = {
      {"gate,up fwd", 0, 1, 2048, 1376, 256, 4}, {"gate,up dinp", 0, 0, 2048, 256, 1376, 4},
      {"gate,up dW", 1, 0, 1376, 256, 2048, 4},  {"down fwd", 0, 1, 2048, 256, 688, 4},
      {"down dinp", 0, 0, 2048, 688, 256, 4},    {"down dW", 1, 0, 256, 688, 2048, 4},
      {"q,o fwd", 0, 1, 2048, 256, 256, 9},      {"q,o dinp", 0, 0, 2048, 256, 256, 9},
      {"q,o dW", 1, 0, 256, 256, 2048, 9},       {"k,v fwd", 0, 1, 2048, 128, 256, 8},
      {"k,v dinp", 0, 0, 2048, 256, 128, 8},     {"k,v dW", 1, 0, 128, 256, 2048, 8}};
  std::printf("%s, %d threads: GFLOP/s with the library's threads, split by rows, split by columns\n",
              use_onednn ? "oneDNN" : "OpenBLAS", T);
  double sum[3] = {0, 0, 0};
  for (const Shape& s : shapes) {
    constexpr int kSets = 8, kReps = 48;
    std::vector<std::vector<float>> A(kSets), B(kSets), C(kSets);
    for (int i = 0; i < kSets; ++i) {
      A[i].resize((size_t)s.M * s.K);
      B[i].resize((size_t)s.K * s.N);
      C[i].assign((size_t)s.M * s.N, 0.f);
      for (size_t j = 0; j < A[i].size(); ++j) A[i][j] = float((j * 7 + i) % 13) / 13 - 0.5f;
      for (size_t j = 0; j < B[i].size(); ++j) B[i][j] = float((j * 5 + i) % 11) / 11 - 0.5f;
    }
    std::vector<double> t[3];
    for (int rep = 0; rep < kReps + 4; ++rep)
      for (int by = 0; by < 3; ++by) {
        const int i = (rep * 3 + by) % kSets;
        const auto t0 = std::chrono::steady_clock::now();
        run(s, by, A[i].data(), B[i].data(), C[i].data());
        if (rep >= 4) t[by].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    std::printf("%-13s %4dx%4dx%4d", s.name, s.M, s.N, s.K);
    for (int by = 0; by < 3; ++by) {
      std::sort(t[by].begin(), t[by].end());
      const double m = t[by][t[by].size() / 2];
      sum[by] += m * s.calls;
      std::printf("  %6.1f", 2.0 * s.M * s.N * s.K / m / 1e9);
    }
    std::printf("\n");
  }
  std::printf("all shapes, weighted by calls per step: library %.1f ms, rows %.1f ms (%.3fx), columns %.1f ms (%.3fx)\n",
              sum[0] * 1e3, sum[1] * 1e3, sum[0] / sum[1], sum[2] * 1e3, sum[0] / sum[2]);
}
CPP
g++ -O2 -fopenmp -I"$inc" "$tmp/b.cpp" -o "$tmp/b" -L"$lib" -Wl,-rpath,"$lib" -lopenblas -ldnnl
"$tmp/b" "${1:-onednn}" "${2:-2}"
