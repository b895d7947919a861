// Helpers for the CUDA tests: skip without a GPU, device buffers that upload
// and download host vectors, bf16 rounding on the host, and comparisons that
// print the worst element. Compiled only with KVS_CUDA.
#pragma once
#ifdef KVS_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>  // the templated cudaMalloc(T**) overload
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"
#include "model/engine.h"
#include "model/params.h"

namespace kvs::cuda_test {

using bf16 = __nv_bfloat16;

inline bool have_gpu() {
  std::string why;
  return cuda::device_count(&why) > 0;
}

// First statement of every CUDA test.
#define KVS_REQUIRE_GPU()                                          \
  do {                                                             \
    if (!::kvs::cuda_test::have_gpu()) GTEST_SKIP() << "skipped: no GPU"; \
  } while (0)

inline constexpr cuda::ErrorCheck check{"CUDA test"};

// A device buffer of n elements of T. Filled with a poison byte pattern
// (0xFF: NaN for float and bf16, -1 for ints) so that an element a kernel
// forgets to write shows up as a mismatch.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n = 0) : n_(n) {
    if (n_) {
      check(cudaMalloc(&p_, n_ * sizeof(T)), "cudaMalloc");
      poison();
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void poison() { check(cudaMemset(p_, 0xFF, n_ * sizeof(T)), "cudaMemset"); }
  void zero() { check(cudaMemset(p_, 0, n_ * sizeof(T)), "cudaMemset"); }
  void upload(const std::vector<T>& host) {
    check(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    check(cudaDeviceSynchronize(), "kernel");
    check(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

inline float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
inline std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __float2bfloat16_rn(x[i]);
  return y;
}
inline std::vector<float> to_f32(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __bfloat162float(x[i]);
  return y;
}
inline std::vector<double> to_double(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }
inline std::vector<float> to_float(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }
inline std::vector<float> download_f32(const DeviceBuffer<bf16>& b) { return to_f32(b.download()); }

// The bit pattern of a bf16 (0xFFFF: the poison of an unwritten element).
inline uint16_t bits(bf16 x) {
  uint16_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Random values already rounded to bf16, so the CPU oracle sees exactly the
// kernel's inputs.
inline std::vector<float> random_bf16_values(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = bf16_round(d(g));
  return x;
}
inline std::vector<float> random_uniform(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Tolerance of a bf16 output against a double reference. A bf16 output is an
// fp32 result rounded once: within half a bf16 ulp (2^-9 relative) of the exact
// value plus fp32 noise, so rtol 1e-2 (about 2.5 ulp) with a small atol for
// results near zero. fp32 reductions are compared much tighter, per test.
constexpr double kBf16Rtol = 1e-2, kBf16Atol = 1e-4;

// Every element within atol + rtol * |want|; on failure reports the worst one.
inline ::testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                                            double atol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  size_t worst = 0, bad = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double tol = atol + rtol * std::fabs(static_cast<double>(want[i]));
    const double excess = std::isnan(err) ? 1e30 : err - tol;
    if (excess > 0) ++bad;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " elements out of tolerance (rtol " << rtol
                                       << ", atol " << atol << "); worst at " << worst << ": got " << got[worst]
                                       << ", want " << want[worst];
}

// |got - want| <= rtol |want| + atol + mtol * mag for every element (mag: the
// sum of the absolute values of the terms that make up the element).
inline ::testing::AssertionResult close_scaled(const std::vector<float>& got, const std::vector<double>& want,
                                               const std::vector<double>& mag, double rtol, double atol, double mtol) {
  if (got.size() != want.size() || got.size() != mag.size())
    return ::testing::AssertionFailure() << "size mismatch: " << got.size() << " / " << want.size();
  size_t bad = 0, worst = 0;
  double worst_excess = -1e300;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    const double excess = std::isnan(err) ? 1e300 : err - (rtol * std::fabs(want[i]) + atol + mtol * mag[i]);
    if (excess > 0) ++bad;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " out of tolerance; worst at " << worst
                                       << ": got " << got[worst] << ", want " << want[worst] << " (mag "
                                       << mag[worst] << ")";
}

// ||a - b|| / ||b|| over one tensor (NaN anywhere gives NaN).
inline double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The model's initial parameters (seed) rounded to bf16, so that a CUDA engine
// (bf16 copy) and a reference computing in fp32/fp64 start from the same values.
// The RMSNorm gains, which start at exactly 1, get noise (1 + 0.2 N(0, 1)): with
// all of them 1, an engine reading the wrong gain (another layer's, ln1 for
// ln2) would match its reference bit for bit.
inline std::vector<float> bf16_params(const ParamLayout& layout, const ModelConfig& m, uint64_t seed) {
  std::vector<float> params(layout.total);
  init_params(layout, m, seed, params.data());
  for (const ParamTensor& t : layout.tensors)
    if (t.kind == ParamKind::Norm)
      for (size_t i = 0; i < t.numel; ++i)
        params[t.offset + i] = 1.0f + 0.2f * static_cast<float>(normal01(seed + 1000003, t.offset + i));
  for (float& x : params) x = bf16_round(x);
  return params;
}

// B x T random tokens and targets in [0, vocab_size) with about a quarter of
// the positions masked out (mt19937 seeded with `seed`).
struct RandomBatch {
  int B, T;
  std::vector<int32_t> inputs, targets;
  std::vector<float> mask;
  RandomBatch(const ModelConfig& m, int B_, int T_, uint32_t seed)
      : B(B_), T(T_), inputs(B_ * T_), targets(B_ * T_), mask(B_ * T_) {
    std::mt19937 g(seed);
    for (int i = 0; i < B * T; ++i) {
      inputs[i] = static_cast<int32_t>(g() % m.vocab_size);
      targets[i] = static_cast<int32_t>(g() % m.vocab_size);
      mask[i] = (g() % 4 == 0) ? 0.0f : 1.0f;
    }
  }
  Batch batch() const { return {B, T, inputs.data(), targets.data(), mask.data()}; }
};

}  // namespace kvs::cuda_test
#endif  // KVS_CUDA
