// Counter-based random numbers: value i of a stream is a pure function of
// (seed, i). Parameter init, data generation and sampling use it so that any
// process (or tensor-parallel slice) can produce exactly its own part.
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

namespace kvs {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a, to derive a stream seed from a name (e.g. a parameter's name).
inline uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

inline uint64_t mix_seed(uint64_t a, uint64_t b) { return splitmix64(a ^ splitmix64(b)); }

// Uniform in [0, 1) with 53 random bits.
inline double uniform01(uint64_t seed, uint64_t i) {
  return (splitmix64(seed + splitmix64(i)) >> 11) * (1.0 / 9007199254740992.0);
}

// Standard normal via Box-Muller on two independent uniforms.
inline double normal01(uint64_t seed, uint64_t i) {
  double u1 = uniform01(seed, 2 * i), u2 = uniform01(seed, 2 * i + 1);
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// A small sequential generator (state = seed + counter) for code that draws
// numbers one after another; its state is two integers, easy to checkpoint.
struct CounterRng {
  uint64_t seed = 0, counter = 0;
  uint64_t next_u64() { return splitmix64(seed + splitmix64(counter++)); }
  double next_uniform() { return (next_u64() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform integer in [0, n) without modulo bias worth caring about (n << 2^64).
  uint64_t next_below(uint64_t n) { return next_u64() % n; }
};

}  // namespace kvs
