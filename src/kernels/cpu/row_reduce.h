// Fixed-order row reductions (max, sum, dot) with kLanes partial results, so
// the compiler can keep them in a vector register (a plain `sum += x` loop
// cannot be vectorised without reassociation). Deterministic: the order
// depends only on n. The partials are a kLanes-wide vector (GCC/Clang vector
// extensions): written as an array of scalars, GCC 12 left these loops
// scalar (perf: row_max had 22% of the samples of an attention-forward
// harness). Lane j still sums elements j, j + kLanes, ... in order, so the
// bits are those of that loop.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

namespace kvs::cpu::detail {

constexpr int kLanes = 16;

template <class T> struct LanesOf;
template <> struct LanesOf<float> {
  using type = float __attribute__((vector_size(kLanes * sizeof(float))));
};
template <> struct LanesOf<double> {
  using type = double __attribute__((vector_size(kLanes * sizeof(double))));
};
template <class T> using Lanes = typename LanesOf<T>::type;

template <class T> Lanes<T> load_lanes(const T* p) {
  Lanes<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// kLanes values of T as Acc (float to double: exact).
template <class Acc, class T> Lanes<Acc> load_lanes_as(const T* p) {
  if constexpr (std::is_same_v<Acc, T>) return load_lanes(p);
  else return __builtin_convertvector(load_lanes(p), Lanes<Acc>);
}

template <class T> T row_max(const T* r, int n) {
  Lanes<T> part = Lanes<T>{} + r[0];
  int s = 0;
  for (; s + kLanes <= n; s += kLanes) {
    const Lanes<T> x = load_lanes(r + s);
    part = part < x ? x : part;
  }
  T m = part[0];
  for (int j = 1; j < kLanes; ++j) m = std::max(m, part[j]);
  for (; s < n; ++s) m = std::max(m, r[s]);
  return m;
}

template <class T, class Acc = T> Acc row_sum(const T* r, int n) {
  Lanes<Acc> part{};
  int s = 0;
  for (; s + kLanes <= n; s += kLanes) part += load_lanes_as<Acc>(r + s);
  Acc sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += part[j];
  for (; s < n; ++s) sum += r[s];
  return sum;
}

template <class T> T row_dot(const T* a, const T* b, int n) {
  Lanes<T> part{};
  int s = 0;
  for (; s + kLanes <= n; s += kLanes) part += load_lanes(a + s) * load_lanes(b + s);
  T sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += part[j];
  for (; s < n; ++s) sum += a[s] * b[s];
  return sum;
}

// a . b with every product and partial sum in Acc (double for float rows):
// the same precision as a sequential double loop, kLanes times shorter chains.
template <class Acc, class T> Acc row_dot_wide(const T* a, const T* b, size_t n) {
  Lanes<Acc> part{};
  size_t s = 0;
  for (; s + kLanes <= n; s += kLanes) part += load_lanes_as<Acc>(a + s) * load_lanes_as<Acc>(b + s);
  Acc sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += part[j];
  for (; s < n; ++s) sum += static_cast<Acc>(a[s]) * static_cast<Acc>(b[s]);
  return sum;
}

}  // namespace kvs::cpu::detail
