// Helpers shared by the CPU kernel tests (tests/kernels/cpu/test_*.cpp):
// seeded random vectors, float/double copies, norms, central finite
// differences and the gradient check.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/rng.h"

namespace kvs::ops_test {

using Vec = std::vector<double>;
using FVec = std::vector<float>;

inline Vec randn(size_t n, uint64_t seed, double scale = 1.0) {
  Vec v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * kvs::normal01(seed, i);
  return v;
}
inline FVec to_float(const Vec& v) { return FVec(v.begin(), v.end()); }
inline Vec to_double(const FVec& v) { return Vec(v.begin(), v.end()); }

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
inline double norm(const Vec& a) { return std::sqrt(dot(a, a)); }
// ||a - b|| / ||b||
inline double rel_err(const Vec& a, const Vec& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(d) / std::max(norm(b), 1e-300);
}
inline Vec add(const Vec& a, const Vec& b) {
  Vec c(a.size());
  for (size_t i = 0; i < a.size(); ++i) c[i] = a[i] + b[i];
  return c;
}

// Central differences of the scalar f() with respect to every element of x
// (x is perturbed in place and restored).
inline Vec numgrad(Vec& x, const std::function<double()>& f, double eps = 1e-6) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double fp = f();
    x[i] = x0 - eps;
    const double fm = f();
    x[i] = x0;
    g[i] = (fp - fm) / (2 * eps);
  }
  return g;
}

// Analytic gradient vs finite differences, and the gradient is not trivially small.
inline void expect_grad_close(const Vec& analytic, const Vec& numeric, const char* what, double tol = 1e-6) {
  EXPECT_GT(norm(numeric), 1e-3) << what << ": gradient too small for a meaningful check";
  EXPECT_LT(rel_err(analytic, numeric), tol) << what;
}

constexpr double kFloatTol = 1e-5;  // float vs double, relative to the norm

}  // namespace kvs::ops_test
