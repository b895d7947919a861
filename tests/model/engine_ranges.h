// The ranged host copies of an engine (Engine::read_/write_params_range,
// read_/write_optimizer_range: a checkpoint moves a window or a tensor at a
// time), checked on any engine against its whole-buffer copies: pieces that
// cut tensors, moments outside a kept range reading zero and not written,
// null outputs skipped, and the same forward after a piecewise write (an
// engine's derived copies, the CUDA engine's bf16 weights, follow the piece).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "core/error.h"
#include "model/engine.h"

namespace kvs::testing_util {

inline bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline void check_range_copies(const std::function<std::unique_ptr<Engine>()>& make, const Batch& batch) {
  std::unique_ptr<Engine> whole = make(), pieces = make();
  const size_t n = whole->layout().total;
  std::vector<float> p(n), m(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
    m[i] = 1.0f + static_cast<float>(i);
    v[i] = -1.0f - static_cast<float>(i);
  }
  whole->write_params(p.data());
  for (size_t at = 0; at < n; at += 7) pieces->write_params_range(at, std::min<size_t>(7, n - at), p.data() + at);
  std::vector<float> got(n, -9.0f);
  pieces->read_params(got.data());
  EXPECT_TRUE(same_floats(got, p)) << "parameters written in pieces of 7";
  std::fill(got.begin(), got.end(), -9.0f);
  for (size_t at = 0; at < n; at += 11) whole->read_params_range(at, std::min<size_t>(11, n - at), got.data() + at);
  EXPECT_TRUE(same_floats(got, p)) << "parameters read in pieces of 11";
  EXPECT_EQ(whole->forward(batch, nullptr, nullptr, nullptr), pieces->forward(batch, nullptr, nullptr, nullptr))
      << "the forward after a piecewise write";

  // Moments: a kept range that starts and ends inside a piece.
  const size_t begin = n / 3 + 1, end = 2 * n / 3 + 2;
  pieces->keep_optimizer_range(begin, end);
  for (size_t at = 0; at < n; at += 13) {  // exp_avg, then exp_avg_sq: the null one is left alone
    pieces->write_optimizer_range(at, std::min<size_t>(13, n - at), m.data() + at, nullptr);
    pieces->write_optimizer_range(at, std::min<size_t>(13, n - at), nullptr, v.data() + at);
  }
  std::vector<float> gm(n, -9.0f), gv(n, -9.0f);
  pieces->read_optimizer_state(gm.data(), gv.data());
  for (size_t i = 0; i < n; ++i) {
    const bool held = i >= begin && i < end;
    ASSERT_EQ(gm[i], held ? m[i] : 0.0f) << "exp_avg " << i << " of kept [" << begin << ", " << end << ")";
    ASSERT_EQ(gv[i], held ? v[i] : 0.0f) << "exp_avg_sq " << i << " of kept [" << begin << ", " << end << ")";
  }
  std::vector<float> rm(n, -9.0f);
  for (size_t at = 0; at < n; at += 5)
    pieces->read_optimizer_range(at, std::min<size_t>(5, n - at), rm.data() + at, nullptr);
  EXPECT_TRUE(same_floats(rm, gm)) << "exp_avg read in pieces of 5";
  EXPECT_THROW(pieces->read_optimizer_range(n - 1, 2, rm.data(), nullptr), kvs::Error);
  EXPECT_THROW(pieces->write_params_range(n, 1, p.data()), kvs::Error);
}

}  // namespace kvs::testing_util
