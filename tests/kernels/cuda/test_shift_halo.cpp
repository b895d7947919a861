// The shift's halo (context parallelism, kernels/cuda/shift_rope.cu): a chunk
// whose W raw rows before position 0 come from the previous chunk (bf16 rows
// of a padded stride, as in the fused QKV projection), against
// kvs::cpu::kv_shift_forward/backward with their halo arguments and RoPE in
// double: y, dx with the bf16 tolerance (cuda_test_util.h), the halo gradient
// (fp32, a sum of at most W + 1 products) rtol 1e-5, atol 1e-6; then
// shift_halo_add returns a halo gradient to its rows rounding once.
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;
using FVec = std::vector<float>;
using DVec = std::vector<double>;

TEST(CudaShiftRope, HaloMatchesTheCpuShiftWithHistory) {
  KVS_REQUIRE_GPU();
  struct Case {
    int B, T, H, D, W;
  };
  for (const Case c : {Case{2, 5, 3, 16, 1}, Case{3, 37, 2, 64, 2}, Case{2, 8, 2, 32, 3}}) {
    SCOPED_TRACE(testing::Message() << "B " << c.B << " T " << c.T << " H " << c.H << " D " << c.D << " W " << c.W);
    const int HD = c.H * c.D, ld = HD + 8;  // padded rows for x, the halo and its gradient
    const size_t N = static_cast<size_t>(c.B) * c.T, R = static_cast<size_t>(c.B) * c.W;
    const FVec x = random_bf16_values(N * HD, 300 + c.T), halo = random_bf16_values(R * HD, 310 + c.T),
               dy = random_bf16_values(N * HD, 320 + c.T), coef = random_uniform(c.H * (c.W + 1), 330, -0.5f, 1.0f);
    FVec cs(static_cast<size_t>(c.T) * c.D / 2), sn(cs.size());
    kvs::cpu::rope_tables<float>(cs.data(), sn.data(), c.T, c.D, 10000.0);
    auto padded = [&](const FVec& v, size_t rows) {
      FVec p(rows * ld, 0.0f);
      for (size_t r = 0; r < rows; ++r) std::copy_n(v.begin() + r * HD, HD, p.begin() + r * ld);
      return p;
    };
    const DVec xd = to_double(x), hd = to_double(halo), dyd = to_double(dy), cd = to_double(coef),
               csd = to_double(cs), snd = to_double(sn);
    DVec sh(N * HD), want(N * HD), ds(N * HD), wdx(N * HD, 0.0), wdc(coef.size(), 0.0), wdh(R * HD, 0.0);
    kvs::cpu::kv_shift_forward<double>(sh.data(), xd.data(), cd.data(), c.B, c.T, c.H, c.D, c.W, nullptr, hd.data());
    kvs::cpu::rope_forward<double>(want.data(), sh.data(), csd.data(), snd.data(), c.B, c.T, c.H, c.D);
    kvs::cpu::rope_backward<double>(ds.data(), dyd.data(), csd.data(), snd.data(), c.B, c.T, c.H, c.D);
    kvs::cpu::kv_shift_backward<double>(wdx.data(), wdc.data(), ds.data(), xd.data(), cd.data(), c.B, c.T, c.H, c.D,
                                        c.W, nullptr, hd.data(), wdh.data());

    DeviceBuffer<bf16> d_x(to_bf16(padded(x, N))), d_halo(to_bf16(padded(halo, R))), d_y(N * HD), d_dy(to_bf16(dy)),
        d_dx(N * ld);
    DeviceBuffer<float> d_coef(coef), d_cos(cs), d_sin(sn), d_dcoef(FVec(coef.size(), 0.0f)),
        d_dhalo(FVec(R * ld, std::nanf(""))),
        d_scratch(kc::shift_rope_backward_scratch_floats(c.B, c.T, c.H, c.D, c.W));
    kc::shift_rope_forward(d_y.get(), HD, d_x.get(), ld, d_coef.get(), d_cos.get(), d_sin.get(), c.B, c.T, c.H, c.D,
                           c.W, 0, kc::ShiftHalo{d_halo.get(), ld, nullptr, 0});
    EXPECT_TRUE(all_close(download_f32(d_y), to_float(want), kBf16Rtol, kBf16Atol)) << "y";
    kc::shift_rope_backward(d_dx.get(), ld, d_dcoef.get(), d_dy.get(), HD, d_x.get(), ld, d_coef.get(), d_cos.get(),
                            d_sin.get(), c.B, c.T, c.H, c.D, c.W, d_scratch.get(), 0,
                            kc::ShiftHalo{d_halo.get(), ld, d_dhalo.get(), ld});
    const FVec dx_rows = download_f32(d_dx), dh_rows = d_dhalo.download();
    FVec got_dx(N * HD), got_dh(R * HD);
    bool pad_untouched = true;
    for (size_t r = 0; r < N; ++r) std::copy_n(dx_rows.begin() + r * ld, HD, got_dx.begin() + r * HD);
    for (size_t r = 0; r < R; ++r) {
      std::copy_n(dh_rows.begin() + r * ld, HD, got_dh.begin() + r * HD);
      for (int k = HD; k < ld; ++k) pad_untouched = pad_untouched && std::isnan(dh_rows[r * ld + k]);
    }
    EXPECT_TRUE(all_close(got_dx, to_float(wdx), kBf16Rtol, kBf16Atol)) << "dx";
    EXPECT_TRUE(all_close(got_dh, to_float(wdh), 1e-5, 1e-6)) << "halo gradient";
    EXPECT_TRUE(pad_untouched) << "the halo gradient's padding was written";
    EXPECT_TRUE(all_close(d_dcoef.download(), to_float(wdc), 1e-5, 1e-6 * c.B * c.T * c.D)) << "dcoef";
  }
}

// dx[b, T - W + j, c] = bf16(dx + dtail[b, j, c]) for c < width, bit for bit; nothing else changes.
TEST(CudaShiftRope, HaloAddRoundsOnceIntoTheLastRows) {
  KVS_REQUIRE_GPU();
  const int B = 3, T = 6, W = 2, width = 40, ld_dx = 48, ld_tail = 56;
  const FVec dx0 = random_bf16_values(static_cast<size_t>(B) * T * ld_dx, 400);
  const FVec tail = random_uniform(static_cast<size_t>(B) * W * ld_tail, 410, -1.0f, 1.0f);
  DeviceBuffer<bf16> d_dx(to_bf16(dx0));
  DeviceBuffer<float> d_tail(tail);
  kc::shift_halo_add(d_dx.get(), ld_dx, d_tail.get(), ld_tail, B, T, width, W, 0);
  const std::vector<bf16> got = d_dx.download();
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < ld_dx; ++k) {
        const size_t i = (static_cast<size_t>(b) * T + t) * ld_dx + k;
        float want = dx0[i];
        if (t >= T - W && k < width) want += tail[(static_cast<size_t>(b) * W + t - (T - W)) * ld_tail + k];
        ASSERT_EQ(bits(got[i]), bits(__float2bfloat16_rn(want))) << "b " << b << " t " << t << " column " << k;
      }
}

}  // namespace
#endif  // KVS_CUDA
