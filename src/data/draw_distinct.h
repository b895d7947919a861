// Sampling without replacement for the synthetic tasks (induction's token
// pool, the 3-gram table's pairs).
#pragma once
#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace kvs {

// `n` distinct values of [0, range), in draw order: a partial Fisher-Yates
// shuffle whose swapped entries live in a hash map, so memory is O(n). One
// rng.next_below per value: a task's data follows from its seed.
std::vector<uint64_t> draw_distinct(uint64_t range, int n, CounterRng& rng);

}  // namespace kvs
