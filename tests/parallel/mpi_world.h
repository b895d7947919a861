// The world of the multi-process unit tests (tests/parallel/mpi_*.cpp): ctest
// starts the kvshift_mpi_tests binary under mpirun with 1, 2 and 4 ranks; every
// rank runs every test, and each test checks what the parallel pieces compute
// across the ranks against what one process computes alone (every rank also
// computes that reference itself, from the same seeded data).
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dist/comm.h"

namespace kvs::testing_util {

// The MPI world (set up by mpi_main.cpp).
dist::Communicator& world();

// The same n values on every rank: uniform in [-scale, scale).
inline std::vector<float> seeded(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// max |a - b| / max(1, max |b|): a relative error that tolerates zeros.
inline double rel_err(const float* a, const float* b, size_t n) {
  double num = 0, den = 1;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return num / den;
}

}  // namespace kvs::testing_util
