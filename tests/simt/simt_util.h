// Helpers shared by the SIMT emulator drivers (tests/simt/README.md).
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace simt {

using bf16 = __nv_bfloat16;

// Failures of the current run (main() sums them over families and orders).
inline int g_fails = 0;
inline bool g_verbose = false;

inline float r16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Normal(0, s) values rounded to bf16 (what the CUDA tests feed the kernels).
inline std::vector<float> randn(size_t n, uint64_t seed, float s = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, s);
  std::vector<float> x(n);
  for (auto& v : x) v = r16(d(g));
  return x;
}
inline std::vector<float> randu(size_t n, uint64_t seed, float lo, float hi, bool round = true) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> x(n);
  for (auto& v : x) v = round ? r16(d(g)) : d(g);
  return x;
}
inline std::vector<float> f32(const std::vector<bf16>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = __bfloat162float(v[i]);
  return o;
}
inline std::vector<bf16> b16(const std::vector<float>& v) {
  std::vector<bf16> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = __float2bfloat16_rn(v[i]);
  return o;
}
inline bf16 poison_bf16() { return __ushort_as_bfloat16(0xFFFF); }  // a NaN

// all_close as in tests/cuda_test_util.h: |got - want| <= atol + rtol |want|,
// NaN fails. Prints one FAIL line (worst element) per failing comparison.
template <class W>
bool check(const std::string& tag, const char* what, const std::vector<float>& got, const std::vector<W>& want,
           double rtol, double atol) {
  size_t bad = 0, worst = 0;
  double worst_ratio = -1;
  if (got.size() != want.size()) {
    printf("  FAIL %s %s: size %zu vs %zu\n", tag.c_str(), what, got.size(), want.size());
    ++g_fails;
    return false;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs((double)got[i] - (double)want[i]), tol = atol + rtol * std::fabs((double)want[i]);
    const double r = std::isnan(err) ? 1e300 : (tol > 0 ? err / tol : (err > 0 ? 1e300 : 0));
    if (r > 1) ++bad;
    if (r > worst_ratio) worst_ratio = r, worst = i;
  }
  if (bad) {
    ++g_fails;
    printf("  FAIL %s %s: %zu of %zu bad, worst [%zu] got %.9g want %.9g\n", tag.c_str(), what, bad, got.size(), worst,
           (double)got[worst], (double)want[worst]);
  }
  return bad == 0;
}
inline void expect(bool ok, const std::string& tag, const char* what) {
  if (!ok) {
    ++g_fails;
    printf("  FAIL %s %s\n", tag.c_str(), what);
  }
}
inline void done(const std::string& tag) {
  if (g_verbose) printf("  case %s\n", tag.c_str());
}

// One family per translation unit (each includes its own generated kernels:
// their anonymous-namespace helpers collide across .cu files).
void run_flash_attention();
void run_shift_rope();
void run_rmsnorm();
void run_cross_entropy();
void run_vocab_parallel_ce();
void run_embedding();
void run_swiglu();
void run_adamw();
void run_reduce();
void run_convert();
void run_shift_gate();

}  // namespace simt
