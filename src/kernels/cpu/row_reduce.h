// Fixed-order row reductions (max, sum, dot) with kLanes partial results, so
// the compiler can keep them in a vector register (a plain `sum += x` loop
// cannot be vectorised without reassociation). Deterministic: the order
// depends only on n. The partials are kLanes lanes of GCC/Clang vector
// registers (Lanes below): written as an array of scalars, GCC 12 left these
// loops scalar (perf: row_max had 22% of the samples of an attention-forward
// harness). Lane j still sums elements j, j + kLanes, ... in order, so the
// bits are those of that loop, whatever the register width.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

namespace kvs::cpu::detail {

constexpr int kLanes = 16;

// The partials live in the registers the build targets: 64 bytes with
// AVX-512, 32 with AVX, 16 otherwise. A single 64- or 128-byte GCC vector
// (as these were until 2026-11-30) is lowered for an AVX2 target through the
// stack with its selects lane by lane: row_max took 0.73 ns per element on
// a Zen 3 core that way, 0.17 as two 32-byte registers. Lane j is element
// j % kPerReg of register j / kPerReg, so every lane does what it did.
#if defined(__AVX512F__)
constexpr int kRegBytes = 64;
#elif defined(__AVX__)
constexpr int kRegBytes = 32;
#else
constexpr int kRegBytes = 16;
#endif

// (vector_size needs a literal: GCC ignores it on a template parameter.)
template <class T, int Bytes> struct RegOf;
#define KVS_ROW_REDUCE_REG(T, BYTES) \
  template <> struct RegOf<T, BYTES> { using type = T __attribute__((vector_size(BYTES))); }
KVS_ROW_REDUCE_REG(float, 8);
KVS_ROW_REDUCE_REG(float, 16);
KVS_ROW_REDUCE_REG(float, 32);
KVS_ROW_REDUCE_REG(float, 64);
KVS_ROW_REDUCE_REG(double, 16);
KVS_ROW_REDUCE_REG(double, 32);
KVS_ROW_REDUCE_REG(double, 64);
#undef KVS_ROW_REDUCE_REG

template <class T> struct Lanes {
  static constexpr int kPerReg = kRegBytes / (int)sizeof(T);
  static constexpr int kRegs = kLanes / kPerReg;
  using Reg = typename RegOf<T, kRegBytes>::type;
  Reg r[kRegs];

  T operator[](int j) const { return r[j / kPerReg][j % kPerReg]; }
  Lanes& operator+=(const Lanes& o) {
#pragma GCC unroll 8
    for (int i = 0; i < kRegs; ++i) r[i] += o.r[i];
    return *this;
  }
  friend Lanes operator*(Lanes a, const Lanes& b) {
#pragma GCC unroll 8
    for (int i = 0; i < kRegs; ++i) a.r[i] *= b.r[i];
    return a;
  }
};

template <class T> Lanes<T> splat_lanes(T x) {
  Lanes<T> v;
#pragma GCC unroll 8
  for (int i = 0; i < Lanes<T>::kRegs; ++i) v.r[i] = typename Lanes<T>::Reg{} + x;
  return v;
}
// Lane by lane: x where part < x, else part (NaN in x is skipped, as std::max(part, x) does).
template <class T> Lanes<T> max_lanes(Lanes<T> part, const Lanes<T>& x) {
#pragma GCC unroll 8
  for (int i = 0; i < Lanes<T>::kRegs; ++i) part.r[i] = part.r[i] < x.r[i] ? x.r[i] : part.r[i];
  return part;
}

template <class T> Lanes<T> load_lanes(const T* p) {
  Lanes<T> v;
#pragma GCC unroll 8
  for (int i = 0; i < Lanes<T>::kRegs; ++i) std::memcpy(&v.r[i], p + i * Lanes<T>::kPerReg, sizeof v.r[i]);
  return v;
}
// kLanes values of T as Acc (float to double: exact), one register of Acc at a time.
template <class Acc, class T> Lanes<Acc> load_lanes_as(const T* p) {
  if constexpr (std::is_same_v<Acc, T>) {
    return load_lanes(p);
  } else {
    constexpr int kPer = Lanes<Acc>::kPerReg;
    using Narrow = typename RegOf<T, kPer * (int)sizeof(T)>::type;
    Lanes<Acc> v;
#pragma GCC unroll 8
    for (int i = 0; i < Lanes<Acc>::kRegs; ++i) {
      Narrow n;
      std::memcpy(&n, p + i * kPer, sizeof n);
      v.r[i] = __builtin_convertvector(n, typename Lanes<Acc>::Reg);
    }
    return v;
  }
}

template <class T> T row_max(const T* r, int n) {
  Lanes<T> part = splat_lanes(r[0]);
  int s = 0;
  for (; s + kLanes <= n; s += kLanes) part = max_lanes(part, load_lanes(r + s));
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
