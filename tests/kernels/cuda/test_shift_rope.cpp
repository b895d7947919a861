// The KV shift fused with RoPE (kernels/cuda/shift_rope.cu), forward and
// backward on strided rows (as K inside the fused QKV projection),
// against the CPU reference op run in double on the same bf16-rounded inputs
// (bf16 outputs: kBf16Rtol/kBf16Atol, cuda_test_util.h). Outputs start
// poisoned (NaN), so an element the kernel forgets shows up.
// The coefficient gradient (fp32) is compared tighter and both backward
// outputs are checked for bitwise determinism.
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;
using FVec = std::vector<float>;
using DVec = std::vector<double>;

// x and dx live in rows of stride in_ld = H*D + in_pad at column in_off (as K
// inside the fused QKV projection); y and dy in rows of stride H*D + out_pad
// at column 0. The CPU ops take contiguous [B, T, H, D], so the tests gather.

struct ShiftCase {
  int B, T, H, D, W;
  bool coef, rope;
  int in_pad, in_off, out_pad;
};
const ShiftCase kShiftCases[] = {
    {2, 5, 3, 16, 1, true, true, 0, 0, 0},        // vector path, contiguous
    {3, 37, 2, 64, 2, true, true, 24, 8, 8},      // vector path, strided, 2 tiles of 32
    {2, 70, 4, 128, 3, true, true, 8, 0, 0},      // 16-row tiles: 5 per sequence
    {2, 40, 2, 64, 1, true, true, 384, 256, 0},   // K of a fused [N, 4*64 + 2*2*64] QKV
    {2, 40, 2, 64, 1, true, false, 0, 0, 8},      // shift only
    {2, 33, 3, 32, 0, false, true, 32, 16, 0},    // RoPE only (the query path)
    {2, 9, 2, 6, 2, true, true, 3, 1, 5},         // D = 6: scalar path, odd strides
    {3, 2, 2, 10, 3, true, true, 0, 0, 0},        // T < W: the whole window is history
    {2, 1, 1, 16, 1, true, true, 5, 2, 0},        // T = 1, unaligned rows: scalar path
    {2, 50, 2, 7, 1, true, false, 1, 0, 3},       // odd D without RoPE
    {2, 70, 2, 64, 8, true, true, 0, 0, 0},       // the largest window dcoef supports
    {4, 65, 1, 32, 2, true, true, 0, 0, 0},       // several sequences, tiles of 32: 65 = 2*32 + 1
    {2, 37, 6, 64, 1, true, true, 8, 0, 0},       // 6 heads: a block's group of 4, then 2
    {2, 21, 9, 16, 2, true, false, 0, 0, 8},      // 9 heads: groups 4 + 4 + 1, shift only
    {2, 19, 3, 32, 1, true, true, 4, 4, 4},       // 8-byte aligned rows only: 4-wide (8-wide falls back to 1)
    // Row walks (ShiftRopeWalk::kRows: W <= 1, units per head dividing 32):
    {2, 70, 9, 32, 1, true, true, 0, 0, 0},       // 2 units per head: 16 heads per warp, 9 used; 3 blocks of 32 rows
    {3, 45, 5, 128, 1, true, true, 8, 0, 8},      // 8 units: 4 heads per warp, a second group of 1
    {2, 40, 3, 64, 0, true, true, 0, 0, 0},       // window 0 with a coefficient (a scale)
    {150, 40, 1, 16, 1, true, true, 0, 0, 0},     // 150 x 2 tiles: 300 dcoef partials, more than the sum's 256 threads
};

// The kernel variants every case runs: two vector widths x two ways of
// walking the rows (kRows falls back to kUnits where it does not fit).
struct Variant {
  kc::ShiftRopeVector vector;
  kc::ShiftRopeWalk walk;
  const char* name;
};
const Variant kVariants[] = {
    {kc::ShiftRopeVector::k8, kc::ShiftRopeWalk::kUnits, "8-wide units"},
    {kc::ShiftRopeVector::k4, kc::ShiftRopeWalk::kUnits, "4-wide units"},
    {kc::ShiftRopeVector::k8, kc::ShiftRopeWalk::kRows, "8-wide row walk"},
    {kc::ShiftRopeVector::k4, kc::ShiftRopeWalk::kRows, "4-wide row walk"},
};

// Rows [B*T, ld] with head h at columns off + h*D: gather to contiguous [B, T, H, D].
DVec gather(const FVec& full, const ShiftCase& c, int ld, int off) {
  DVec out((size_t)c.B * c.T * c.H * c.D);
  for (size_t r = 0; r < (size_t)c.B * c.T; ++r)
    for (int k = 0; k < c.H * c.D; ++k) out[r * c.H * c.D + k] = full[r * ld + off + k];
  return out;
}
// The gathered part of a strided bf16 buffer, and whether every other element still holds the poison.
FVec gather_f32(const std::vector<bf16>& full, const ShiftCase& c, int ld, int off, bool* rest_poisoned) {
  FVec out((size_t)c.B * c.T * c.H * c.D);
  *rest_poisoned = true;
  for (size_t r = 0; r < (size_t)c.B * c.T; ++r)
    for (int k = 0; k < ld; ++k) {
      if (k >= off && k < off + c.H * c.D)
        out[r * c.H * c.D + k - off] = __bfloat162float(full[r * ld + k]);
      else if (bits(full[r * ld + k]) != 0xFFFF)
        *rest_poisoned = false;
    }
  return out;
}

struct ShiftData {
  int in_ld, out_ld;
  FVec x_full, coef, cos, sin;
  DVec x, coef_d, cos_d, sin_d;
};
ShiftData make_shift_data(const ShiftCase& c, uint64_t seed) {
  ShiftData s;
  s.in_ld = c.H * c.D + c.in_pad;
  s.out_ld = c.H * c.D + c.out_pad;
  s.x_full = random_bf16_values((size_t)c.B * c.T * s.in_ld, seed);
  s.x = gather(s.x_full, c, s.in_ld, c.in_off);
  // Coefficients and tables are made even when the case passes null for them
  // (the device buffers are then simply unused).
  s.coef = random_uniform((size_t)c.H * (c.W + 1), seed + 1, -0.5f, 1.0f);
  s.cos.resize((size_t)c.T * std::max(1, c.D / 2));
  s.sin.resize(s.cos.size());
  kvs::cpu::rope_tables<float>(s.cos.data(), s.sin.data(), c.T, c.D, 10000.0);
  s.coef_d = to_double(s.coef);
  s.cos_d = to_double(s.cos);
  s.sin_d = to_double(s.sin);
  return s;
}
std::string describe(const ShiftCase& c) {
  return testing::PrintToString(std::vector<int>{c.B, c.T, c.H, c.D, c.W, c.coef, c.rope, c.in_pad, c.in_off,
                                                 c.out_pad});
}

// y within the bf16 tolerance of the double shift-then-rotate; the columns of
// y outside the heads are never written.
TEST(CudaShiftRope, ForwardMatchesCpuShiftThenRope) {
  KVS_REQUIRE_GPU();
  for (const auto& c : kShiftCases) {
    SCOPED_TRACE("B T H D W coef rope in_pad in_off out_pad = " + describe(c));
    const ShiftData s = make_shift_data(c, 200 + c.T * 7 + c.D);
    const int W = c.coef ? c.W : 0;
    DVec shifted = s.x, want(s.x.size());
    if (c.coef)
      kvs::cpu::kv_shift_forward<double>(shifted.data(), s.x.data(), s.coef_d.data(), c.B, c.T, c.H, c.D, W);
    if (c.rope)
      kvs::cpu::rope_forward<double>(want.data(), shifted.data(), s.cos_d.data(), s.sin_d.data(), c.B, c.T, c.H, c.D);
    else
      want = shifted;

    DeviceBuffer<bf16> d_x(to_bf16(s.x_full));
    DeviceBuffer<float> d_coef(s.coef), d_cos(s.cos), d_sin(s.sin);
    std::vector<std::vector<bf16>> ys;
    for (const Variant& v : kVariants) {
      SCOPED_TRACE(v.name);
      DeviceBuffer<bf16> d_y((size_t)c.B * c.T * s.out_ld);
      kc::shift_rope_forward(d_y.get(), s.out_ld, d_x.get() + c.in_off, s.in_ld, c.coef ? d_coef.get() : nullptr,
                             c.rope ? d_cos.get() : nullptr, c.rope ? d_sin.get() : nullptr, c.B, c.T, c.H, c.D, W, 0,
                             {}, v.vector, v.walk);
      ys.push_back(d_y.download());
      bool rest_poisoned = false;
      const FVec got = gather_f32(ys.back(), c, s.out_ld, 0, &rest_poisoned);
      EXPECT_TRUE(all_close(got, to_float(want), kBf16Rtol, kBf16Atol));
      EXPECT_TRUE(rest_poisoned) << "wrote outside the heads' columns";
    }
    for (size_t i = 1; i < ys.size(); ++i) EXPECT_TRUE(same_bits(ys[0], ys[i])) << kVariants[i].name << "'s y";
  }
}

// dx: bf16 tolerance. dcoef (fp32, added into random initial values) is a sum
// of B*T*D products of order 1 through fp32 partials: rtol 1e-5 plus an atol
// of 1e-6 per summed term. Two runs are bitwise equal. Scratch starts poisoned.
TEST(CudaShiftRope, BackwardMatchesCpuAndIsDeterministic) {
  KVS_REQUIRE_GPU();
  for (const auto& c : kShiftCases) {
    SCOPED_TRACE("B T H D W coef rope in_pad in_off out_pad = " + describe(c));
    const ShiftData s = make_shift_data(c, 300 + c.T * 7 + c.D);
    const int W = c.coef ? c.W : 0;
    const FVec dy_full = random_bf16_values((size_t)c.B * c.T * s.out_ld, 400 + c.T);
    const DVec dy = gather(dy_full, c, s.out_ld, 0);
    const FVec dcoef0 = random_uniform((size_t)c.H * (W + 1), 500, -1.0f, 1.0f);

    DVec ds(dy.size(), 0.0), want_dx(dy.size(), 0.0), want_dcoef = to_double(dcoef0);
    if (c.rope)
      kvs::cpu::rope_backward<double>(ds.data(), dy.data(), s.cos_d.data(), s.sin_d.data(), c.B, c.T, c.H, c.D);
    else
      ds = dy;
    if (c.coef)
      kvs::cpu::kv_shift_backward<double>(want_dx.data(), want_dcoef.data(), ds.data(), s.x.data(), s.coef_d.data(),
                                          c.B, c.T, c.H, c.D, W);
    else
      want_dx = ds;

    DeviceBuffer<bf16> d_x(to_bf16(s.x_full)), d_dy(to_bf16(dy_full));
    DeviceBuffer<float> d_coef(s.coef), d_cos(s.cos), d_sin(s.sin);
    DeviceBuffer<float> d_scratch(kc::shift_rope_backward_scratch_floats(c.B, c.T, c.H, c.D, W));
    std::vector<std::vector<bf16>> first_dx;
    for (const Variant& v : kVariants) {
      SCOPED_TRACE(v.name);
      std::vector<std::vector<bf16>> dxs;
      std::vector<FVec> dcoefs;
      for (int run = 0; run < 2; ++run) {
        DeviceBuffer<bf16> d_dx((size_t)c.B * c.T * s.in_ld);
        DeviceBuffer<float> d_dcoef(dcoef0);
        kc::shift_rope_backward(d_dx.get() + c.in_off, s.in_ld, c.coef ? d_dcoef.get() : nullptr, d_dy.get(),
                                s.out_ld, d_x.get() + c.in_off, s.in_ld, c.coef ? d_coef.get() : nullptr,
                                c.rope ? d_cos.get() : nullptr, c.rope ? d_sin.get() : nullptr, c.B, c.T, c.H, c.D, W,
                                d_scratch.get(), 0, {}, v.vector, v.walk);
        dxs.push_back(d_dx.download());
        dcoefs.push_back(d_dcoef.download());
      }
      bool rest_poisoned = false;
      const FVec got_dx = gather_f32(dxs[0], c, s.in_ld, c.in_off, &rest_poisoned);
      EXPECT_TRUE(all_close(got_dx, to_float(want_dx), kBf16Rtol, kBf16Atol));
      EXPECT_TRUE(rest_poisoned) << "wrote outside the heads' columns";
      EXPECT_TRUE(all_close(dcoefs[0], to_float(want_dcoef), 1e-5, 1e-6 * c.B * c.T * c.D));
      EXPECT_TRUE(same_bits(dxs[0], dxs[1]));
      EXPECT_TRUE(same_bits(dcoefs[0], dcoefs[1]));
      first_dx.push_back(dxs[0]);
    }
    for (size_t i = 1; i < first_dx.size(); ++i)
      EXPECT_TRUE(same_bits(first_dx[0], first_dx[i])) << kVariants[i].name << "'s dx";
  }
}

// dcoef null (a frozen shift): dx alone, no scratch needed.
TEST(CudaShiftRope, BackwardWithoutDcoefNeedsNoScratch) {
  KVS_REQUIRE_GPU();
  const ShiftCase c{2, 37, 2, 64, 2, true, true, 0, 0, 0};
  const ShiftData s = make_shift_data(c, 600);
  const FVec dy_full = random_bf16_values((size_t)c.B * c.T * s.out_ld, 601);
  const DVec dy = gather(dy_full, c, s.out_ld, 0);
  DVec ds(dy.size(), 0.0), want_dx(dy.size(), 0.0);
  kvs::cpu::rope_backward<double>(ds.data(), dy.data(), s.cos_d.data(), s.sin_d.data(), c.B, c.T, c.H, c.D);
  kvs::cpu::kv_shift_backward<double>(want_dx.data(), nullptr, ds.data(), s.x.data(), s.coef_d.data(), c.B, c.T, c.H,
                                      c.D, c.W);
  DeviceBuffer<bf16> d_x(to_bf16(s.x_full)), d_dy(to_bf16(dy_full)), d_dx(dy.size());
  DeviceBuffer<float> d_coef(s.coef), d_cos(s.cos), d_sin(s.sin);
  kc::shift_rope_backward(d_dx.get(), s.in_ld, nullptr, d_dy.get(), s.out_ld, d_x.get(), s.in_ld, d_coef.get(),
                          d_cos.get(), d_sin.get(), c.B, c.T, c.H, c.D, c.W, nullptr, 0);
  EXPECT_TRUE(all_close(download_f32(d_dx), to_float(want_dx), kBf16Rtol, kBf16Atol));
}

}  // namespace
#endif  // KVS_CUDA
