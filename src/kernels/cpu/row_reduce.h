// Fixed-order row reductions (max, sum, dot) with kLanes partial results, so
// the compiler can keep them in a vector register (a plain `sum += x` loop
// cannot be vectorised without reassociation). Deterministic: the order
// depends only on n.
#pragma once
#include <algorithm>
#include <cstddef>

namespace kvs::cpu::detail {

constexpr int kLanes = 16;

template <class T> T row_max(const T* r, int n) {
  T part[kLanes];
  for (int j = 0; j < kLanes; ++j) part[j] = r[0];
  int s = 0;
  for (; s + kLanes <= n; s += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] = part[j] < r[s + j] ? r[s + j] : part[j];
  T m = part[0];
  for (int j = 1; j < kLanes; ++j) m = std::max(m, part[j]);
  for (; s < n; ++s) m = std::max(m, r[s]);
  return m;
}

template <class T, class Acc = T> Acc row_sum(const T* r, int n) {
  Acc part[kLanes] = {};
  int s = 0;
  for (; s + kLanes <= n; s += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] += r[s + j];
  Acc sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += part[j];
  for (; s < n; ++s) sum += r[s];
  return sum;
}

template <class T> T row_dot(const T* a, const T* b, int n) {
  T part[kLanes] = {};
  int s = 0;
  for (; s + kLanes <= n; s += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] += a[s + j] * b[s + j];
  T sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += part[j];
  for (; s < n; ++s) sum += a[s] * b[s];
  return sum;
}

// a . b with every product and partial sum in Acc (double for float rows):
// the same precision as a sequential double loop, kLanes times shorter chains.
template <class Acc, class T> Acc row_dot_wide(const T* a, const T* b, size_t n) {
  Acc part[kLanes] = {};
  size_t s = 0;
  for (; s + kLanes <= n; s += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] += static_cast<Acc>(a[s + j]) * static_cast<Acc>(b[s + j]);
  Acc sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += part[j];
  for (; s < n; ++s) sum += static_cast<Acc>(a[s]) * static_cast<Acc>(b[s]);
  return sum;
}

}  // namespace kvs::cpu::detail
