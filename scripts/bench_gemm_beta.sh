#!/usr/bin/env bash
# OpenBLAS sgemm with beta = 0 against a memset of C and beta = 1, at the
# toy models' projection shapes (gate and up as two products, as before the
# CPU engine fused them), side by side in one run (why
# kernels/cpu/gemm_library.cpp zeroes C itself on OpenBLAS;
# docs/PERFORMANCE.md). Eight buffer sets in turn, so C is as cold as in a
# step; best, p25 and median of 48.
# OpenBLAS picks its kernels from the CPU model here, not from the features
# as kvshift does: set OPENBLAS_CORETYPE to the family `kvshift bench` names.
#   OPENBLAS_CORETYPE=Zen bash scripts/bench_gemm_beta.sh [threads...]   (default: 1 2)
set -euo pipefail
inc=/usr/include/x86_64-linux-gnu/openblas-openmp
lib=/usr/lib/x86_64-linux-gnu/openblas-openmp
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/b.cpp" <<'CPP'
#include <cblas.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
extern "C" char* openblas_get_corename(void);
using Clk = std::chrono::steady_clock;
int main() {
  struct Shape { int M, N, K; bool nt; } shapes[] = {
      {2048, 688, 256, true}, {2048, 256, 688, true}, {2048, 256, 256, true},
      {2048, 128, 256, true}, {2048, 256, 688, false}, {2048, 256, 128, false}};
  constexpr int kSets = 8, kReps = 48;
  std::printf("OpenBLAS kernels: %s\n", openblas_get_corename());
  for (const Shape& s : shapes) {
    std::vector<std::vector<float>> A(kSets, std::vector<float>((size_t)s.M * s.K, 0.1f)),
        C(kSets, std::vector<float>((size_t)s.M * s.N));
    std::vector<float> B((size_t)s.N * s.K, 0.2f);
    double med[2];
    for (int mode = 0; mode < 2; ++mode) {  // 0: beta = 0; 1: memset + beta = 1
      std::vector<double> t;
      for (int r = 0; r < kReps; ++r) {
        float* c = C[r % kSets].data();
        const auto t0 = Clk::now();
        if (mode == 1) std::memset(c, 0, sizeof(float) * s.M * s.N);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, s.nt ? CblasTrans : CblasNoTrans, s.M, s.N, s.K, 1.f,
                    A[r % kSets].data(), s.K, B.data(), s.nt ? s.K : s.N, mode ? 1.f : 0.f, c, s.N);
        t.push_back(std::chrono::duration<double, std::milli>(Clk::now() - t0).count());
      }
      std::sort(t.begin(), t.end());
      med[mode] = t[kReps / 2];
      std::printf("%5dx%4dx%4d %s  %-16s best %6.3f  p25 %6.3f  median %6.3f ms\n", s.M, s.N, s.K, s.nt ? "NT" : "NN",
                  mode ? "memset, beta=1" : "beta=0", t[0], t[kReps / 4], t[kReps / 2]);
    }
    std::printf("%29s beta=0 / memset: %.3f (median)\n", "", med[0] / med[1]);
  }
}
CPP
g++ -O2 -std=c++17 "$tmp/b.cpp" -I"$inc" -L"$lib" -lopenblas -Wl,-rpath,"$lib" -o "$tmp/b"
threads=("$@")
[ ${#threads[@]} -gt 0 ] || threads=(1 2)
for n in "${threads[@]}"; do
  echo "== $n thread(s)"
  OMP_NUM_THREADS=$n "$tmp/b"
done
