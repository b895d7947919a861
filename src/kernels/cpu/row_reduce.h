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

// kLanes lanes of T in registers of B bytes (the build's by default; tests
// instantiate the other widths to check that the bits do not depend on it).
template <class T, int B = kRegBytes> struct Lanes {
  static constexpr int kPerReg = B / (int)sizeof(T);
  static constexpr int kRegs = kLanes / kPerReg;
  using Reg = typename RegOf<T, B>::type;
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

template <int B = kRegBytes, class T> Lanes<T, B> splat_lanes(T x) {
  Lanes<T, B> v;
#pragma GCC unroll 8
  for (int i = 0; i < v.kRegs; ++i) v.r[i] = typename Lanes<T, B>::Reg{} + x;
  return v;
}
// Lane by lane: x where part < x, else part (NaN in x is skipped, as std::max(part, x) does).
template <class T, int B> Lanes<T, B> max_lanes(Lanes<T, B> part, const Lanes<T, B>& x) {
#pragma GCC unroll 8
  for (int i = 0; i < part.kRegs; ++i) part.r[i] = part.r[i] < x.r[i] ? x.r[i] : part.r[i];
  return part;
}

template <int B = kRegBytes, class T> Lanes<T, B> load_lanes(const T* p) {
  Lanes<T, B> v;
#pragma GCC unroll 8
  for (int i = 0; i < v.kRegs; ++i) std::memcpy(&v.r[i], p + i * v.kPerReg, sizeof v.r[i]);
  return v;
}
template <class T, int B> void store_lanes(T* p, const Lanes<T, B>& v) {
#pragma GCC unroll 8
  for (int i = 0; i < v.kRegs; ++i) std::memcpy(p + i * v.kPerReg, &v.r[i], sizeof v.r[i]);
}
// kLanes values of T as Acc (float to double: exact), one register of Acc at a time.
template <class Acc, int B = kRegBytes, class T> Lanes<Acc, B> load_lanes_as(const T* p) {
  if constexpr (std::is_same_v<Acc, T>) {
    return load_lanes<B>(p);
  } else {
    constexpr int kPer = Lanes<Acc, B>::kPerReg;
    using Narrow = typename RegOf<T, kPer * (int)sizeof(T)>::type;
    Lanes<Acc, B> v;
#pragma GCC unroll 8
    for (int i = 0; i < v.kRegs; ++i) {
      Narrow n;
      std::memcpy(&n, p + i * kPer, sizeof n);
      v.r[i] = __builtin_convertvector(n, typename Lanes<Acc, B>::Reg);
    }
    return v;
  }
}

template <class T, int B = kRegBytes> T row_max(const T* r, int n) {
  Lanes<T, B> part = splat_lanes<B>(r[0]);
  int s = 0;
  for (; s + kLanes <= n; s += kLanes) part = max_lanes(part, load_lanes<B>(r + s));
  T m = part[0];
  for (int j = 1; j < kLanes; ++j) m = std::max(m, part[j]);
  for (; s < n; ++s) m = std::max(m, r[s]);
  return m;
}

template <class T, class Acc = T, int B = kRegBytes> Acc row_sum(const T* r, int n) {
  Lanes<Acc, B> part{};
  int s = 0;
  for (; s + kLanes <= n; s += kLanes) part += load_lanes_as<Acc, B>(r + s);
  Acc sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += part[j];
  for (; s < n; ++s) sum += r[s];
  return sum;
}

template <class T, int B = kRegBytes> T row_dot(const T* a, const T* b, int n) {
  Lanes<T, B> part{};
  int s = 0;
  for (; s + kLanes <= n; s += kLanes) part += load_lanes<B>(a + s) * load_lanes<B>(b + s);
  T sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += part[j];
  for (; s < n; ++s) sum += a[s] * b[s];
  return sum;
}

// a . b with every product and partial sum in Acc (double for float rows):
// the same precision as a sequential double loop, kLanes times shorter chains.
template <class Acc, class T, int B = kRegBytes> Acc row_dot_wide(const T* a, const T* b, size_t n) {
  Lanes<Acc, B> part{};
  size_t s = 0;
  for (; s + kLanes <= n; s += kLanes) part += load_lanes_as<Acc, B>(a + s) * load_lanes_as<Acc, B>(b + s);
  Acc sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += part[j];
  for (; s < n; ++s) sum += static_cast<Acc>(a[s]) * static_cast<Acc>(b[s]);
  return sum;
}

}  // namespace kvs::cpu::detail
