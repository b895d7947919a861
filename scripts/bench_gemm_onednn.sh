#!/usr/bin/env bash
# OpenBLAS sgemm against oneDNN's dnnl_sgemm (Debian's libdnnl-dev, which
# scripts/setup.sh installs: the engine's GEMMs on Intel CPUs with AVX-512
# since 2026-11-29, on every CPU with AVX-512 since 2026-12-01) at lm-small's
# step shapes (gate and up as two products each way, as the CPU engine ran them before fusing them), the
# two alternated in one process: eight buffer sets in turn, medians of 48, and
# the sum weighted by each shape's calls per step. Also whether each library
# gives the same bits with 1 thread and with the given threads (kvshift's
# runs are bit-reproducible only for a fixed library, kernel family and
# thread count: OpenBLAS's products can differ between 1 and 2 threads;
# docs/KERNELS.md).
# OpenBLAS picks its kernels from the CPU model here, not from the features as
# kvshift does: set OPENBLAS_CORETYPE to the family `kvshift bench` names.
#   OPENBLAS_CORETYPE=SkylakeX bash scripts/bench_gemm_onednn.sh [threads...]   (default: 1 2)
set -euo pipefail
inc=/usr/include/x86_64-linux-gnu/openblas-openmp
lib=/usr/lib/x86_64-linux-gnu/openblas-openmp
[ -f /usr/include/dnnl.h ] || { echo "bench_gemm_onednn: needs libdnnl-dev (apt-get install libdnnl-dev)" >&2; exit 1; }
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
extern "C" char* openblas_get_corename(void);
extern "C" void openblas_set_num_threads(int);
struct Shape { const char* name; bool ta, tb; int M, N, K, calls; };
static void openblas(const Shape& s, const float* A, const float* B, float* C) {
  cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.M, s.N, s.K, 1.f,
              A, s.ta ? s.M : s.K, B, s.tb ? s.K : s.N, 1.f, C, s.N);
}
static void onednn(const Shape& s, const float* A, const float* B, float* C) {
  dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.f, A, s.ta ? s.M : s.K, B, s.tb ? s.K : s.N, 1.f,
             C, s.N);
}
static void threads(int n) {
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}
int main(int argc, char** argv) {
  const int T = argc > 1 ? std::atoi(argv[1]) : 1;
  // lm-small (configs/toy/lm-small-kvshift.json): 2048 tokens a step, out = inp W^T and its backward (matmul.h);
  // gate and up as two products each, as before the CPU engine fused them (bench_gemm_gate_up.sh).
  const Shape shapes[] = {
      {"gate,up fwd", 0, 1, 2048, 688, 256, 8}, {"gate,up dinp", 0, 0, 2048, 256, 688, 8},
      {"gate,up dW", 1, 0, 688, 256, 2048, 8},  {"down fwd", 0, 1, 2048, 256, 688, 4},
      {"down dinp", 0, 0, 2048, 688, 256, 4},   {"down dW", 1, 0, 256, 688, 2048, 4},
      {"q,o fwd", 0, 1, 2048, 256, 256, 9},     {"q,o dinp", 0, 0, 2048, 256, 256, 9},
      {"q,o dW", 1, 0, 256, 256, 2048, 9},      {"k,v fwd", 0, 1, 2048, 128, 256, 8},
      {"k,v dinp", 0, 0, 2048, 256, 128, 8},    {"k,v dW", 1, 0, 128, 256, 2048, 8}};
  std::printf("threads %d, OpenBLAS kernels %s\n", T, openblas_get_corename());
  double sum_o = 0, sum_d = 0;
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
    // The same bits with 1 thread and with T?
    bool same[2] = {true, true};
    for (int lib = 0; lib < 2; ++lib) {
      std::vector<float> one((size_t)s.M * s.N, 0.f), many(one.size(), 0.f);
      threads(1);
      (lib ? onednn : openblas)(s, A[0].data(), B[0].data(), one.data());
      threads(T);
      (lib ? onednn : openblas)(s, A[0].data(), B[0].data(), many.data());
      same[lib] = std::memcmp(one.data(), many.data(), one.size() * sizeof(float)) == 0;
    }
    std::vector<double> to, td;
    for (int rep = 0; rep < kReps + 4; ++rep) {
      const int i = rep % kSets;
      const auto t0 = std::chrono::steady_clock::now();
      openblas(s, A[i].data(), B[i].data(), C[i].data());
      const auto t1 = std::chrono::steady_clock::now();
      onednn(s, A[i].data(), B[i].data(), C[i].data());
      const auto t2 = std::chrono::steady_clock::now();
      if (rep < 4) continue;  // warm-up
      to.push_back(std::chrono::duration<double>(t1 - t0).count());
      td.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    std::sort(to.begin(), to.end());
    std::sort(td.begin(), td.end());
    const double mo = to[to.size() / 2], md = td[td.size() / 2], flop = 2.0 * s.M * s.N * s.K;
    sum_o += mo * s.calls;
    sum_d += md * s.calls;
    std::printf("%-13s %4dx%4dx%4d  OpenBLAS %6.1f GFLOP/s  oneDNN %6.1f GFLOP/s  oneDNN/OpenBLAS %.3f  same bits 1 vs %d "
                "threads: OpenBLAS %s, oneDNN %s\n",
                s.name, s.M, s.N, s.K, flop / mo / 1e9, flop / md / 1e9, mo / md, T, same[0] ? "yes" : "NO",
                same[1] ? "yes" : "NO");
  }
  std::printf("all shapes, weighted by calls per step: OpenBLAS %.1f ms, oneDNN %.1f ms, oneDNN %.3fx\n", sum_o * 1e3,
              sum_d * 1e3, sum_o / sum_d);
}
CPP
g++ -O2 -fopenmp -I"$inc" "$tmp/b.cpp" -o "$tmp/b" -L"$lib" -Wl,-rpath,"$lib" -lopenblas -ldnnl
[ $# -gt 0 ] || set -- 1 2
for t in "$@"; do "$tmp/b" "$t"; done
