#!/usr/bin/env bash
# The measurement behind fusing the MLP's gate and up projections into one
# [2F, C] weight on the CPU engine (model/cpu_block.cpp now runs them as one
# product, as the CUDA engine does): oneDNN's dnnl_sgemm at lm-small's shapes
# (N = 2048 tokens, C = 256, F = 688), the two products against the one fused product,
# alternated in one process, forward, dinp and dW, medians of 40.
#   bash scripts/bench_gemm_gate_up.sh [threads...]   (default: 1 2)
set -euo pipefail
[ -f /usr/include/oneapi/dnnl/dnnl.h ] || { echo "bench_gemm_gate_up: needs libdnnl-dev (scripts/setup.sh)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/b.cpp" <<'CPP'
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
using clk = std::chrono::steady_clock;
static double secs(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }
static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
int main(int argc, char** argv) {
  const int T = argc > 1 ? std::atoi(argv[1]) : 2;
  omp_set_num_threads(T);
  const int N = 2048, C = 256, F = 688;
  // W: gate rows then up rows ([2F, C]); G: the fused output / its gradient [N, 2F].
  std::vector<float> x(N * C, 0.01f), W(2 * F * C, 0.02f), G(N * 2 * F, 0.03f), dW(2 * F * C), dx(N * C);
  std::vector<float> g1(N * F, 0.03f), g2(N * F, 0.03f);
  std::vector<double> sep[3], fus[3];
  for (int rep = 0; rep < 44; ++rep) {
    const auto t0 = clk::now();
    dnnl_sgemm('N', 'T', N, F, C, 1.f, x.data(), C, W.data(), C, 0.f, g1.data(), F);
    dnnl_sgemm('N', 'T', N, F, C, 1.f, x.data(), C, W.data() + F * C, C, 0.f, g2.data(), F);
    const auto t1 = clk::now();
    dnnl_sgemm('N', 'T', N, 2 * F, C, 1.f, x.data(), C, W.data(), C, 0.f, G.data(), 2 * F);
    const auto t2 = clk::now();
    dnnl_sgemm('N', 'N', N, C, F, 1.f, g1.data(), F, W.data(), C, 0.f, dx.data(), C);
    dnnl_sgemm('N', 'N', N, C, F, 1.f, g2.data(), F, W.data() + F * C, C, 1.f, dx.data(), C);
    const auto t3 = clk::now();
    dnnl_sgemm('N', 'N', N, C, 2 * F, 1.f, G.data(), 2 * F, W.data(), C, 0.f, dx.data(), C);
    const auto t4 = clk::now();
    dnnl_sgemm('T', 'N', F, C, N, 1.f, g1.data(), F, x.data(), C, 1.f, dW.data(), C);
    dnnl_sgemm('T', 'N', F, C, N, 1.f, g2.data(), F, x.data(), C, 1.f, dW.data() + F * C, C);
    const auto t5 = clk::now();
    dnnl_sgemm('T', 'N', 2 * F, C, N, 1.f, G.data(), 2 * F, x.data(), C, 1.f, dW.data(), C);
    const auto t6 = clk::now();
    if (rep < 4) continue;  // warm-up
    sep[0].push_back(secs(t0, t1));
    fus[0].push_back(secs(t1, t2));
    sep[1].push_back(secs(t2, t3));
    fus[1].push_back(secs(t3, t4));
    sep[2].push_back(secs(t4, t5));
    fus[2].push_back(secs(t5, t6));
  }
  const char* names[] = {"fwd", "dinp", "dW"};
  double all_s = 0, all_f = 0;
  for (int i = 0; i < 3; ++i) {
    const double s = median(sep[i]), f = median(fus[i]);
    all_s += s;
    all_f += f;
    std::printf("threads %d %-4s gate and up %.3f ms, fused %.3f ms: fused %.3fx\n", T, names[i], s * 1e3, f * 1e3,
                s / f);
  }
  std::printf("threads %d one layer's gate/up GEMMs: %.3f ms, fused %.3f ms: fused %.3fx\n", T, all_s * 1e3,
              all_f * 1e3, all_s / all_f);
}
CPP
g++ -O2 -fopenmp "$tmp/b.cpp" -o "$tmp/b" -ldnnl
[ $# -gt 0 ] || set -- 1 2
for t in "$@"; do "$tmp/b" "$t"; done
