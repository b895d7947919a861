// KV shift + RoPE (shift_rope_forward_kernel, shift_rope_backward_kernel,
// shift_dcoef_reduce_kernel) under the emulator vs kvs::cpu::kv_shift_* and
// rope_* in double, with tests/kernels/cuda/test_shift_rope.cpp's tolerances:
//   y, dx (bf16): rtol 1e-2, atol 1e-4; columns outside the heads untouched
//   dcoef (fp32, added into random initial values): rtol 1e-5, atol 1e-6 B T D
// Both vector widths: V = 8 where the launcher would take it, V = 1 always.
// The row-walking kernels (ShiftRopeWalk::kRows) on their own grid wherever
// they fit (W <= 1, no halo, units per head dividing 32): against the same
// references, and y and dx bit for bit with the unit kernels'.
// Grids mirror shift_rope_forward/backward: (ceil(T / TT), head groups, B) x kThreads,
// then H (W + 1) blocks of 256 for the dcoef reduction.
// With a halo (context parallelism: W raw rows before position 0, padded row
// stride) against the CPU ops' halo arguments: y, dx as above, the halo's
// gradient (fp32, padding untouched) rtol 1e-5, atol 1e-6 (an fp32 sum of at
// most W + 1 products of bf16-exact values), dcoef now including the halo rows.
// shift_halo_add_kernel: dx rows T - W .. T - 1 get bf16(dx + dtail), bit for
// bit, every other element untouched.
// With documents (model.document_boundaries): doc starts at rows 0, a few
// later rows per sequence, and with a halo some before the chunk (negative),
// against the CPU ops' doc_start: y, dx, dcoef and dhalo with the tolerances
// above (the unit kernels only: the walks take no documents).
#include "gen_shift_rope.h"
#include "kernels/cpu/ops.h"
#include "simt_util.h"

namespace simt {
namespace {

namespace kc = kvs::cuda;

struct Case {
  int B, T, H, D, W;
  bool coef, rope;
  int in_pad, in_off, out_pad;
  bool halo = false;
  bool docs = false;
};

// Where each position's document starts, [B][T]: a new document every 3 to
// 9 rows from a seeded position (so a window's rows straddle starts), and with
// a halo the first document of odd sequences begun before the chunk.
std::vector<int32_t> doc_starts(const Case& c) {
  std::vector<int32_t> doc((size_t)c.B * c.T);
  for (int b = 0; b < c.B; ++b) {
    int start = c.halo && b % 2 ? -1 - b % 3 : 0, next = 1 + (b * 5) % 4;
    for (int t = 0; t < c.T; ++t) {
      if (t == next) start = t, next = t + 3 + (t * 7 + b) % 7;
      doc[(size_t)b * c.T + t] = start;
    }
  }
  return doc;
}

bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (__bfloat16_as_ushort(a[i]) != __bfloat16_as_ushort(b[i])) return false;
  return true;
}

// Whether the launcher would run a case's row walk (its walk_fits, and no halo).
bool walks(const Case& c, int V) {
  return !c.halo && !c.docs && kc::walk_fits(c.D, c.rope, c.coef ? c.W : 0, V);
}

// y and dx as the kernels wrote them (every element of the padded rows), for
// comparing the unit and walk kernels bit for bit.
struct Outputs {
  std::vector<bf16> y, dx;
};

// Walk: the row-walking kernels (ShiftRopeWalk::kRows) on their own grid.
template <int V, bool Walk = false>
Outputs run(const Case& c) {
  const int W = c.coef ? c.W : 0;
  const int in_ld = c.H * c.D + c.in_pad, out_ld = c.H * c.D + c.out_pad;
  const size_t N = (size_t)c.B * c.T, HD = (size_t)c.H * c.D;
  const std::string tag = "shift_rope V=" + std::to_string(V) + " B" + std::to_string(c.B) + " T" +
                          std::to_string(c.T) + " H" + std::to_string(c.H) + " D" + std::to_string(c.D) + " W" +
                          std::to_string(W) + (c.rope ? " rope" : "") + (c.coef ? " coef" : "") + " pads " +
                          std::to_string(c.in_pad) + "/" + std::to_string(c.in_off) + "/" + std::to_string(c.out_pad) +
                          (c.halo ? " halo" : "") + (c.docs ? " docs" : "") + (Walk ? " walk" : "");
  const std::vector<int32_t> docv = c.docs ? doc_starts(c) : std::vector<int32_t>();
  const int32_t* doc = c.docs ? docv.data() : nullptr;
  const auto xf = randu(N * in_ld, 1 + c.T * 7 + c.D, -1, 1);
  const auto coef = randu((size_t)c.H * (c.W + 1), 2, -0.5f, 1.0f, false);
  std::vector<float> cs((size_t)c.T * std::max(1, c.D / 2)), sn(cs.size());
  kvs::cpu::rope_tables<float>(cs.data(), sn.data(), c.T, c.D, 10000.0);
  std::vector<double> x(N * HD);
  for (size_t r = 0; r < N; ++r)
    for (size_t k = 0; k < HD; ++k) x[r * HD + k] = xf[r * in_ld + c.in_off + k];
  const std::vector<double> coefd(coef.begin(), coef.end()), csd(cs.begin(), cs.end()), snd(sn.begin(), sn.end());
  // The halo: [B][W] rows of stride halo_ld (8 padding columns), bf16-exact values.
  const bool halo = c.halo && W > 0;
  const int halo_ld = (int)HD + 8;
  const auto halof = randu((size_t)c.B * W * halo_ld, 7 + c.T, -1, 1);
  std::vector<double> halod((size_t)c.B * W * HD);
  for (size_t r = 0; r < (size_t)c.B * W; ++r)
    for (size_t k = 0; k < HD; ++k) halod[r * HD + k] = halof[r * halo_ld + k];
  const std::vector<bf16> halob = b16(halof);
  std::vector<double> sh = x, want(N * HD);
  if (c.coef)
    kvs::cpu::kv_shift_forward<double>(sh.data(), x.data(), coefd.data(), c.B, c.T, c.H, c.D, W, doc,
                                       halo ? halod.data() : nullptr);
  if (c.rope)
    kvs::cpu::rope_forward<double>(want.data(), sh.data(), csd.data(), snd.data(), c.B, c.T, c.H, c.D);
  else
    want = sh;
  const std::vector<bf16> xb = b16(xf);
  std::vector<bf16> yb(N * out_ld, poison_bf16());
  const int TT = kc::tile_rows(c.D);
  const emu::Dim grid{(unsigned)((c.T + TT - 1) / TT), (unsigned)kc::head_groups(c.H), (unsigned)c.B};
  // The walks' grid, as the launcher makes it (only where the walk fits: it divides by the units per head).
  emu::Dim wgrid;
  if constexpr (Walk) {
    const dim3 g = kc::walk_grid(c.T, c.H, c.D, c.rope, V, c.B);
    wgrid = {g.x, g.y, g.z};
  }
  const float* cp = c.coef ? coef.data() : nullptr;
  const float* cosp = c.rope ? cs.data() : nullptr;
  const float* sinp = c.rope ? sn.data() : nullptr;
  if constexpr (Walk) {
    emu::launch(wgrid, kc::kThreads, [&] {
      if (W == 1)
        kc::shift_rope_forward_walk_kernel<V, 1>(yb.data(), out_ld, xb.data() + c.in_off, in_ld, cp, cosp, sinp, c.T,
                                                 c.H, c.D);
      else
        kc::shift_rope_forward_walk_kernel<V, 0>(yb.data(), out_ld, xb.data() + c.in_off, in_ld, cp, cosp, sinp, c.T,
                                                 c.H, c.D);
    });
  } else {
    emu::launch(grid, kc::kThreads, [&] {
      if (doc && c.coef)
        kc::shift_rope_forward_kernel<V, true>(yb.data(), out_ld, xb.data() + c.in_off, in_ld, cp, cosp, sinp, c.T,
                                               c.H, c.D, W, TT, halo ? halob.data() : nullptr, halo_ld, doc);
      else
        kc::shift_rope_forward_kernel<V>(yb.data(), out_ld, xb.data() + c.in_off, in_ld, cp, cosp, sinp, c.T, c.H,
                                         c.D, W, TT, halo ? halob.data() : nullptr, halo_ld, nullptr);
    });
  }
  std::vector<float> got(N * HD);
  size_t outside = 0;
  for (size_t r = 0; r < N; ++r)
    for (int k = 0; k < out_ld; ++k) {
      if (k < (int)HD) got[r * HD + k] = __bfloat162float(yb[r * out_ld + k]);
      else outside += __bfloat16_as_ushort(yb[r * out_ld + k]) != 0xFFFF;
    }
  check(tag, "fwd y", got, want, 1e-2, 1e-4);
  expect(outside == 0, tag, "fwd wrote outside the heads");

  // Backward: dy -> RoPE^T -> shift^T; dcoef from the block partials.
  const auto dyf = randu(N * out_ld, 3 + c.T, -1, 1);
  std::vector<double> dy(N * HD);
  for (size_t r = 0; r < N; ++r)
    for (size_t k = 0; k < HD; ++k) dy[r * HD + k] = dyf[r * out_ld + k];
  const auto dcoef0 = randu((size_t)c.H * (W + 1), 500, -1.0f, 1.0f, false);
  std::vector<double> ds(N * HD, 0.0), wdx(N * HD, 0.0), wdc(dcoef0.begin(), dcoef0.end());
  std::vector<double> wdh((size_t)c.B * W * HD, 0.0);
  if (c.rope)
    kvs::cpu::rope_backward<double>(ds.data(), dy.data(), csd.data(), snd.data(), c.B, c.T, c.H, c.D);
  else
    ds = dy;
  if (c.coef)
    kvs::cpu::kv_shift_backward<double>(wdx.data(), wdc.data(), ds.data(), x.data(), coefd.data(), c.B, c.T, c.H, c.D,
                                        W, doc, halo ? halod.data() : nullptr, halo ? wdh.data() : nullptr);
  else
    wdx = ds;
  const std::vector<bf16> dyb = b16(dyf);
  std::vector<bf16> dxb(N * in_ld, poison_bf16());
  const size_t nblk = Walk ? (size_t)wgrid.x * wgrid.z : (size_t)grid.x * grid.z;
  std::vector<float> partial(c.coef ? (size_t)c.H * nblk * (W + 1) : 0, NAN), dcoef = dcoef0;
  float* pp = c.coef ? partial.data() : nullptr;
  const int dh_ld = (int)HD + 8;
  std::vector<float> dhalo((size_t)c.B * W * dh_ld, NAN);
  if constexpr (Walk) {
    emu::launch(wgrid, kc::kThreads, [&] {
      if (W == 1)
        kc::shift_rope_backward_walk_kernel<V, 1>(dxb.data() + c.in_off, in_ld, pp, dyb.data(), out_ld,
                                                  xb.data() + c.in_off, in_ld, cp, cosp, sinp, c.T, c.H, c.D);
      else
        kc::shift_rope_backward_walk_kernel<V, 0>(dxb.data() + c.in_off, in_ld, pp, dyb.data(), out_ld,
                                                  xb.data() + c.in_off, in_ld, cp, cosp, sinp, c.T, c.H, c.D);
    });
  } else {
    emu::launch(grid, kc::kThreads, [&] {
      if (doc && c.coef)
        kc::shift_rope_backward_kernel<V, true>(dxb.data() + c.in_off, in_ld, pp, dyb.data(), out_ld,
                                                xb.data() + c.in_off, in_ld, cp, cosp, sinp, c.T, c.H, c.D, W, TT,
                                                halo ? halob.data() : nullptr, halo_ld, halo ? dhalo.data() : nullptr,
                                                dh_ld, doc);
      else
        kc::shift_rope_backward_kernel<V>(dxb.data() + c.in_off, in_ld, pp, dyb.data(), out_ld, xb.data() + c.in_off,
                                          in_ld, cp, cosp, sinp, c.T, c.H, c.D, W, TT, halo ? halob.data() : nullptr,
                                          halo_ld, halo ? dhalo.data() : nullptr, dh_ld, nullptr);
    });
  }
  if (halo) {
    std::vector<float> gdh((size_t)c.B * W * HD);
    size_t pad = 0;
    for (size_t r = 0; r < (size_t)c.B * W; ++r)
      for (int k = 0; k < dh_ld; ++k) {
        if (k < (int)HD) gdh[r * HD + k] = dhalo[r * dh_ld + k];
        else pad += !std::isnan(dhalo[r * dh_ld + k]);
      }
    check(tag, "bwd dhalo", gdh, wdh, 1e-5, 1e-6);
    expect(pad == 0, tag, "bwd wrote the halo gradient's padding");
  }
  if (c.coef)
    emu::launch(emu::Dim{(unsigned)(c.H * (W + 1)), 1, 1}, 256,
                [&] { kc::shift_dcoef_reduce_kernel(dcoef.data(), partial.data(), (int)nblk, W); });
  std::vector<float> gdx(N * HD);
  outside = 0;
  for (size_t r = 0; r < N; ++r)
    for (int k = 0; k < in_ld; ++k) {
      if (k >= c.in_off && k < c.in_off + (int)HD) gdx[r * HD + k - c.in_off] = __bfloat162float(dxb[r * in_ld + k]);
      else outside += __bfloat16_as_ushort(dxb[r * in_ld + k]) != 0xFFFF;
    }
  check(tag, "bwd dx", gdx, wdx, 1e-2, 1e-4);
  expect(outside == 0, tag, "bwd wrote outside the heads");
  if (c.coef) check(tag, "bwd dcoef", dcoef, wdc, 1e-5, 1e-6 * c.B * c.T * c.D);
  done(tag);
  return {yb, dxb};
}

// A case through the unit kernels at V and, where the walk fits, the walk
// kernels too: the same y and dx bits.
template <int V>
void run_both(const Case& c) {
  const Outputs units = run<V>(c);
  if (!walks(c, V)) return;
  const Outputs walk = run<V, true>(c);
  const std::string tag = "shift_rope walk vs units V=" + std::to_string(V) + " T" + std::to_string(c.T) + " H" +
                          std::to_string(c.H) + " D" + std::to_string(c.D);
  expect(same_bits(units.y, walk.y), tag, "y differs from the unit kernel's");
  expect(same_bits(units.dx, walk.dx), tag, "dx differs from the unit kernel's");
}

void halo_add(int B, int T, int width, int W, int ld_dx, int ld_tail) {
  const std::string tag = "shift_halo_add B" + std::to_string(B) + " T" + std::to_string(T) + " width" +
                          std::to_string(width) + " W" + std::to_string(W);
  const std::vector<bf16> dx0 = b16(randu((size_t)B * T * ld_dx, 900 + T, -1, 1));
  const auto tail = randu((size_t)B * W * ld_tail, 910 + T, -1, 1, false);
  std::vector<bf16> dx = dx0;
  const size_t n = (size_t)B * W * width;
  emu::launch(emu::Dim{(unsigned)((n + 255) / 256), 1, 1}, 256,
              [&] { kc::shift_halo_add_kernel(dx.data(), ld_dx, tail.data(), ld_tail, T, width, W, n); });
  size_t bad = 0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < ld_dx; ++k) {
        const size_t i = ((size_t)b * T + t) * ld_dx + k;
        uint16_t want = __bfloat16_as_ushort(dx0[i]);
        if (t >= T - W && k < width)
          want = __bfloat16_as_ushort(__float2bfloat16_rn(
              __bfloat162float(dx0[i]) + tail[((size_t)b * W + t - (T - W)) * ld_tail + k]));
        bad += __bfloat16_as_ushort(dx[i]) != want;
      }
  expect(bad == 0, tag, "rows differ from bf16(dx + dtail), or other elements changed");
  done(tag);
}

}  // namespace

void run_shift_rope() {
  // {B, T, H, D, W, coef, rope, in_pad, in_off, out_pad}: tests/kernels/cuda/test_shift_rope.cpp's kinds of
  // cases (several tiles with a partial last one, padded/offset rows as in the fused QKV buffer,
  // odd D for the scalar path, W up to kMaxDcoefWindow, RoPE without shift and shift without RoPE;
  // H = 6 and 9: head groups of 4 + 2 and 4 + 4 + 1).
  const Case cases[] = {
      {2, 5, 3, 16, 1, true, true, 0, 0, 0},    {3, 37, 2, 64, 2, true, true, 24, 8, 8},
      {2, 70, 4, 128, 3, true, true, 8, 0, 0},  {2, 40, 2, 64, 1, true, true, 384, 256, 0},
      {2, 40, 2, 64, 1, true, false, 0, 0, 8},  {2, 33, 3, 32, 0, false, true, 32, 16, 0},
      {2, 9, 2, 6, 2, true, true, 3, 1, 5},     {3, 2, 2, 10, 3, true, true, 0, 0, 0},
      {2, 1, 1, 16, 1, true, true, 5, 2, 0},    {2, 50, 2, 7, 1, true, false, 1, 0, 3},
      {2, 70, 2, 64, 8, true, true, 0, 0, 0},   {4, 65, 1, 32, 2, true, true, 0, 0, 0},
      {2, 37, 6, 64, 1, true, true, 8, 0, 0},   {2, 21, 9, 16, 2, true, false, 0, 0, 8},
      {2, 19, 3, 32, 1, true, true, 4, 4, 4},  // 4-wide only (ShiftRopeVector::k4)
      {2, 70, 9, 32, 1, true, true, 0, 0, 0},  {3, 45, 5, 128, 1, true, true, 8, 0, 8},  // row walks
      {2, 40, 3, 64, 0, true, true, 0, 0, 0},
  };
  // The launcher's vector conditions for V = 8 and 4 (alignment holds: std::vector data + in_off % V == 0).
  auto fits = [](const Case& c, int v) {
    return c.D % (2 * v) == 0 && (c.H * c.D + c.in_pad) % v == 0 && (c.H * c.D + c.out_pad) % v == 0 &&
           c.in_off % v == 0;
  };
  for (const Case& c : cases) {
    if (fits(c, 8)) run_both<8>(c);
    if (fits(c, 4)) run_both<4>(c);
    run_both<1>(c);
  }
  // 150 sequences x 2 tiles (and 2 walk blocks): 300 dcoef partials per (head, w), more than
  // shift_dcoef_reduce_kernel's 256 threads (its loop's second pass, every warp's sum).
  run_both<8>(Case{150, 40, 1, 16, 1, true, true, 0, 0, 0});
  // With a halo: chunks of a longer sequence (one tile and several, W 1 to 3, padded QKV-like rows).
  const Case halo_cases[] = {
      {2, 5, 3, 16, 1, true, true, 0, 0, 0, true},
      {3, 37, 2, 64, 2, true, true, 24, 8, 8, true},
      {2, 9, 2, 6, 3, true, false, 3, 1, 5, true},
  };
  for (const Case& c : halo_cases) {
    if (fits(c, 8)) run<8>(c);
    if (fits(c, 4)) run<4>(c);
    run<1>(c);
  }
  // With documents: several tiles, W 1 to 3 and 8, RoPE or not, padded rows, with a halo too.
  const Case doc_cases[] = {
      {2, 37, 2, 64, 1, true, true, 24, 8, 8, false, true},  {3, 70, 3, 32, 3, true, true, 0, 0, 0, false, true},
      {2, 40, 2, 16, 2, true, false, 0, 0, 8, false, true},  {2, 50, 1, 16, 8, true, true, 0, 0, 0, false, true},
      {3, 37, 2, 64, 2, true, true, 24, 8, 8, true, true},   {4, 9, 2, 6, 3, true, false, 3, 1, 5, true, true},
  };
  for (const Case& c : doc_cases) {
    if (fits(c, 8)) run<8>(c);
    run<1>(c);
  }
  halo_add(2, 5, 48, 2, 56, 64);
  halo_add(3, 4, 7, 1, 9, 7);
}

}  // namespace simt
