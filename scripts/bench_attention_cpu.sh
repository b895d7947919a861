#!/usr/bin/env bash
# The CPU attention kernels (src/kernels/cpu/attention.h) of the working tree
# against those of an earlier commit, in one process: lm-small's shapes (8 x
# 256 tokens, 4 query heads, 2 KV heads, head_dim 64), forward and backward
# alternated between the two versions 200 times, medians, and whether both
# give the same bits. The old headers are compiled in a namespace of their
# own (kvs_old), so nothing else of the build is involved.
#   bash scripts/bench_attention_cpu.sh <commit> [threads...]   (default threads: 1 2)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bench_attention_cpu.sh <commit> [threads...]" >&2; exit 1; }
root=$(cd "$(dirname "$0")/.." && pwd)
old=$1; shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/oldk"
git -C "$root" archive "$old" src/kernels/cpu | tar -x -C "$tmp"
cp "$tmp"/src/kernels/cpu/*.h "$tmp/oldk/"
sed -i -e 's|#include "kernels/cpu/|#include "oldk/|' -e 's/namespace kvs\b/namespace kvs_old/g' -e 's/kvs::/kvs_old::/g' \
  "$tmp"/oldk/*.h
cat >"$tmp/b.cpp" <<'CPP'
#include "kernels/cpu/attention.h"
#include "oldk/attention.h"
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
int main(int argc, char** argv) {
  const int B = 8, T = 256, Hq = 4, Hkv = 2, D = 64, threads = std::atoi(argv[1]);
  omp_set_num_threads(threads);
  std::vector<float> q(B * T * Hq * D), k(B * T * Hkv * D), v(k.size()), dout(q.size()), att((size_t)B * Hq * T * T);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.1 * i), dout[i] = std::cos(0.3 * i);
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.7 * i), v[i] = std::sin(1.3 * i);
  std::vector<float> o[2], dq[2], dk[2], dv[2];
  for (int w = 0; w < 2; ++w) o[w].resize(q.size()), dq[w].resize(q.size()), dk[w].resize(k.size()), dv[w].resize(k.size());
  std::vector<double> tf[2], tb[2];
  for (int r = 0; r < 200; ++r) {
    const int w = r % 2;  // 0: the old commit's, 1: the working tree's
    const auto t0 = std::chrono::steady_clock::now();
    if (w) kvs::cpu::attention_forward(o[w].data(), att.data(), q.data(), k.data(), v.data(), B, T, Hq, Hkv, D);
    else kvs_old::cpu::attention_forward(o[w].data(), att.data(), q.data(), k.data(), v.data(), B, T, Hq, Hkv, D);
    const auto t1 = std::chrono::steady_clock::now();
    if (w)
      kvs::cpu::attention_backward(dq[w].data(), dk[w].data(), dv[w].data(), dout.data(), q.data(), k.data(), v.data(),
                                   att.data(), B, T, Hq, Hkv, D, true);
    else
      kvs_old::cpu::attention_backward(dq[w].data(), dk[w].data(), dv[w].data(), dout.data(), q.data(), k.data(),
                                       v.data(), att.data(), B, T, Hq, Hkv, D, true);
    const auto t2 = std::chrono::steady_clock::now();
    if (r >= 10) {
      tf[w].push_back(std::chrono::duration<double>(t1 - t0).count());
      tb[w].push_back(std::chrono::duration<double>(t2 - t1).count());
    }
  }
  double mf[2], mb[2];
  for (int w = 0; w < 2; ++w) {
    std::sort(tf[w].begin(), tf[w].end());
    std::sort(tb[w].begin(), tb[w].end());
    mf[w] = tf[w][tf[w].size() / 2], mb[w] = tb[w][tb[w].size() / 2];
  }
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0 ? "yes" : "NO";
  };
  std::printf("%d threads: forward old %.3f new %.3f ms (%.3fx), backward old %.3f new %.3f ms (%.3fx); same bits: "
              "out %s, dq %s, dk %s, dv %s\n",
              threads, mf[0] * 1e3, mf[1] * 1e3, mf[0] / mf[1], mb[0] * 1e3, mb[1] * 1e3, mb[0] / mb[1],
              same(o[0], o[1]), same(dq[0], dq[1]), same(dk[0], dk[1]), same(dv[0], dv[1]));
}
CPP
g++ -std=c++20 -O3 -march=native -fopenmp -I"$root/src" -iquote "$tmp" "$tmp/b.cpp" -o "$tmp/b"
[ $# -gt 0 ] || set -- 1 2
for t in "$@"; do "$tmp/b" "$t"; done
