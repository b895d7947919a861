// The small kernels under the emulator: reduce.cu, convert.cu, shift_gate.cu.
// - sum_partials_kernel / sum_final_kernel (sum_f32, sum_squares_f32) vs a
//   host double sum, tests/kernels/cuda/test_reduce.cpp's CudaReduce sizes up
//   to 262144*4+5 (the (1<<24)+3 one is left out for time; 4096*1024+7 takes
//   the most blocks) and tolerance (sum: 1e-11 * sum |x|, squares: 1e-11 *
//   sum x^2). Launches mirror launch_sum: sum_blocks(n) blocks of 256 (1 up
//   to n = 4096, 257 for 262144*4+5, the most, 1024, for 4096*1024+7, where
//   a few threads read a 17th element), then one block of 1024 over their
//   partials; scratch and out start as NaN. The result must have the same
//   bits when the launch is repeated (twice in the first fiber order run) and in every later order
//   (the first order's bits are kept).
// - f32_to_bf16_kernel / bf16_to_f32_kernel: tests/kernels/cuda/test_convert.cpp's
//   CudaConvert cases (n 1, 7, 8, 1000, 4099; offset 0 and 1, the path
//   chosen as the launcher chooses it; aligned data also through the scalar
//   kernel): bf16 bits equal __float2bfloat16_rn (and an integer
//   round-to-nearest-even reference), the round trip exact, the element past
//   the range untouched. fill_kernel: n 1, 9, 100003, every element.
//   add_f32_kernel and add_bf16_to_f32_kernel: y += x (x fp32, or bf16 widened)
//   for n 1, 9, 100003, bit for bit the host's fp32 add, the element past n untouched.
// - shift_gate_forward_kernel / shift_gate_backward_kernel vs the CPU ops
//   shift_gate_forward / shift_gate_backward ("sigmoid_gate",
//   src/kernels/cpu/shift_gate.h, in float): H 1, 5, 128, 130 (a partial second block of 128),
//   logits up to +-20, rtol 1e-5 atol 1e-7 (the GPU's expf is not glibc's);
//   dstored accumulates (+=) into nonzero values and column 0 is untouched.
#include "gen_convert.h"
#include "gen_reduce.h"
#include "gen_shift_gate.h"
#include "kernels/cpu/shift_gate.h"
#include "simt_util.h"

#include <cstring>
#include <map>

namespace simt {
namespace {

namespace kc = kvs::cuda;

// Bits of the first fiber order's results, per (case, quantity).
std::map<std::string, uint64_t> g_reduce_bits;

uint64_t bits64(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

// sum (kSquare false) or sum of squares, as launch_sum runs it.
template <bool kSquare>
double emu_sum(const std::vector<float>& x, const std::string& tag) {
  const int blocks = kc::sum_blocks(x.size());
  std::vector<double> scratch(kc::kSumBlocks, std::nan("")), out(2, std::nan(""));
  emu::launch(emu::Dim{(unsigned)blocks, 1, 1}, kc::kSumThreads,
              [&] { kc::sum_partials_kernel<kSquare>(scratch.data(), x.data(), x.size()); });
  emu::launch(emu::Dim{1, 1, 1}, kc::kFinalThreads, [&] { kc::sum_final_kernel(out.data(), scratch.data(), blocks); });
  expect(blocks == kc::kSumBlocks || std::isnan(scratch[blocks]), tag, "sum_partials_kernel wrote past its blocks");
  expect(std::isnan(out[1]), tag, "sum_final_kernel wrote past *out");
  return out[0];
}

void reduce(size_t n) {
  const std::string tag = "reduce n" + std::to_string(n);
  std::mt19937_64 g(91 + n);
  std::normal_distribution<float> nd(0.5f, 2.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(g);
  double sum = 0, sum_abs = 0, sum_sq = 0;
  for (float v : x) {
    sum += v;
    sum_abs += std::fabs(double(v));
    sum_sq += double(v) * v;
  }
  double first[2] = {0, 0};
  // Repeated in the first fiber order only; the later orders repeat it again (time).
  const int reps = g_reduce_bits.count(tag + "sum_f32") ? 1 : 2;
  for (int rep = 0; rep < reps; ++rep) {
    const double got[2] = {emu_sum<false>(x, tag), emu_sum<true>(x, tag)};
    const double tol[2] = {1e-11 * sum_abs + 1e-300, 1e-11 * sum_sq + 1e-300}, want[2] = {sum, sum_sq};
    const char* what[2] = {"sum_f32", "sum_squares_f32"};
    for (int k = 0; k < 2; ++k) {
      if (!(std::fabs(got[k] - want[k]) <= tol[k])) {
        ++g_fails;
        printf("  FAIL %s %s: got %.17g want %.17g (tol %.3g)\n", tag.c_str(), what[k], got[k], want[k], tol[k]);
      }
      if (rep == 0) first[k] = got[k];
      else expect(bits64(first[k]) == bits64(got[k]), tag, (std::string(what[k]) + ": repeat differs in bits").c_str());
      const auto [it, fresh] = g_reduce_bits.emplace(tag + what[k], bits64(got[k]));
      if (!fresh) expect(it->second == bits64(got[k]), tag, (std::string(what[k]) + ": bits differ from the first fiber order").c_str());
    }
  }
  done(tag);
}

uint16_t bits16(bf16 h) { return __bfloat16_as_ushort(h); }

// fp32 -> bf16 round to nearest even on the bits (finite and inf inputs).
uint16_t rne_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// When non-zero, the convert/fill/add launches take at most this many blocks
// instead of the launcher's grid, so their grid-stride loops take several
// passes (the launcher caps the grid only past 65536 blocks).
unsigned g_grid_cap = 0;
unsigned grid(unsigned launcher_blocks) { return g_grid_cap ? std::min(launcher_blocks, g_grid_cap) : launcher_blocks; }
std::string grid_tag() { return g_grid_cap ? " grid " + std::to_string(g_grid_cap) : ""; }

// Runs the launcher's choice (or the scalar kernel when force_scalar).
void run_f32_to_bf16(bf16* out, const float* in, size_t n, bool force_scalar) {
  if (!force_scalar && kc::aligned16(out) && kc::aligned16(in) && n >= 8)
    emu::launch(emu::Dim{grid(kc::blocks_for(n / 8)), 1, 1}, kc::kThreads, [&] { kc::f32_to_bf16_kernel<true>(out, in, n); });
  else
    emu::launch(emu::Dim{grid(kc::blocks_for(n)), 1, 1}, kc::kThreads, [&] { kc::f32_to_bf16_kernel<false>(out, in, n); });
}
void run_bf16_to_f32(float* out, const bf16* in, size_t n, bool force_scalar) {
  if (!force_scalar && kc::aligned16(out) && kc::aligned16(in) && n >= 8)
    emu::launch(emu::Dim{grid(kc::blocks_for(n / 8)), 1, 1}, kc::kThreads, [&] { kc::bf16_to_f32_kernel<true>(out, in, n); });
  else
    emu::launch(emu::Dim{grid(kc::blocks_for(n)), 1, 1}, kc::kThreads, [&] { kc::bf16_to_f32_kernel<false>(out, in, n); });
}

// back's padding (not NaN: bf16_to_f32 of mid's NaN padding would be NaN too).
constexpr float kBackPoison = -12345.0f;

void convert(size_t n, int offset, bool force_scalar) {
  const bool vec = !force_scalar && offset == 0 && n >= 8;
  const std::string tag = "convert n" + std::to_string(n) + " offset " + std::to_string(offset) + (vec ? " vec" : " scalar") + grid_tag();
  std::vector<float> x = randu(n, 11 + n, -3.0f, 3.0f, false);  // not bf16-representable
  if (n >= 4) x[1] = 1e-30f, x[2] = -0.0f, x[3] = 3.0e38f;
  // 16-byte aligned storage (vectors of float4 / uint4), one element of padding.
  std::vector<float4> in_s((n + 1 + 3) / 4 + 1), back_s((n + 1 + 3) / 4 + 1);
  std::vector<uint4> mid_s((n + 1 + 7) / 8 + 1);
  float* in = reinterpret_cast<float*>(in_s.data());
  float* back = reinterpret_cast<float*>(back_s.data());
  bf16* mid = reinterpret_cast<bf16*>(mid_s.data());
  for (size_t i = 0; i < n + 1; ++i) in[i] = 0.0f, back[i] = kBackPoison, mid[i] = poison_bf16();
  std::copy(x.begin(), x.end(), in + offset);
  run_f32_to_bf16(mid + offset, in + offset, n, force_scalar);
  run_bf16_to_f32(back + offset, mid + offset, n, force_scalar);
  size_t bad_mid = 0, bad_back = 0, first_bad = n;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t got = bits16(mid[i + offset]);
    if (got != bits16(__float2bfloat16_rn(x[i])) || got != rne_bits(x[i])) {
      if (!bad_mid++) first_bad = i;
    }
    float want_back;
    const uint32_t wb = uint32_t(rne_bits(x[i])) << 16;
    std::memcpy(&want_back, &wb, 4);
    if (std::memcmp(&back[i + offset], &want_back, 4) != 0) ++bad_back;
  }
  if (bad_mid) {
    ++g_fails;
    printf("  FAIL %s f32_to_bf16: %zu of %zu differ in bits, first [%zu] got 0x%04x want 0x%04x (x %.9g)\n", tag.c_str(),
           bad_mid, n, first_bad, bits16(mid[first_bad + offset]), rne_bits(x[first_bad]), (double)x[first_bad]);
  }
  if (bad_back) {
    ++g_fails;
    printf("  FAIL %s bf16_to_f32: %zu of %zu not exact\n", tag.c_str(), bad_back, n);
  }
  // Nothing written outside [offset, offset + n).
  const size_t outside = offset ? 0 : n;
  expect(bits16(mid[outside]) == 0xFFFF, tag, "f32_to_bf16 wrote outside the range");
  expect(back[outside] == kBackPoison, tag, "bf16_to_f32 wrote outside the range");
  done(tag);
}

void fill(size_t n) {
  const std::string tag = "fill n" + std::to_string(n) + grid_tag();
  std::vector<float> f(n + 1, std::nanf(""));
  std::vector<bf16> h(n + 1, poison_bf16());
  emu::launch(emu::Dim{grid(kc::blocks_for(n)), 1, 1}, kc::kThreads, [&] { kc::fill_kernel<float>(f.data(), 1.5f, n); });
  const bf16 v = __float2bfloat16_rn(0.1f);  // as fill_bf16 converts it
  emu::launch(emu::Dim{grid(kc::blocks_for(n)), 1, 1}, kc::kThreads, [&] { kc::fill_kernel<bf16>(h.data(), v, n); });
  size_t bad_f = 0, bad_h = 0;
  for (size_t i = 0; i < n; ++i) bad_f += f[i] != 1.5f, bad_h += bits16(h[i]) != bits16(v);
  expect(bad_f == 0, tag, "fill_f32: elements not 1.5");
  expect(bad_h == 0, tag, "fill_bf16: elements not bf16(0.1)");
  expect(std::isnan(f[n]) && bits16(h[n]) == 0xFFFF, tag, "fill wrote past n");
  done(tag);
}

void add(size_t n) {
  const std::string tag = "add_f32 n" + std::to_string(n) + grid_tag();
  const std::vector<float> x = randu(n, 40 + n, -2.0f, 2.0f, false);
  std::vector<float> y = randu(n + 1, 50 + n, -2.0f, 2.0f, false);
  std::vector<float> want = y;
  for (size_t i = 0; i < n; ++i) want[i] += x[i];
  emu::launch(emu::Dim{grid(kc::blocks_for(n)), 1, 1}, kc::kThreads, [&] { kc::add_f32_kernel(y.data(), x.data(), n); });
  size_t bad = 0;
  for (size_t i = 0; i <= n; ++i) bad += std::memcmp(&y[i], &want[i], 4) != 0;
  expect(bad == 0, tag, "y + x differs from the host's fp32 add (or the element past n changed)");
  const std::vector<bf16> xb = b16(x);
  for (size_t i = 0; i < n; ++i) want[i] += __bfloat162float(xb[i]);
  emu::launch(emu::Dim{grid(kc::blocks_for(n)), 1, 1}, kc::kThreads,
              [&] { kc::add_bf16_to_f32_kernel(y.data(), xb.data(), n); });
  bad = 0;
  for (size_t i = 0; i <= n; ++i) bad += std::memcmp(&y[i], &want[i], 4) != 0;
  expect(bad == 0, tag, "y + bf16 x differs from the host's fp32 add (or the element past n changed)");
  done(tag);
}

void shift_gate(int H) {
  const std::string tag = "shift_gate H" + std::to_string(H);
  std::vector<float> stored = randu(2 * H, 300 + H, -4.0f, 4.0f, false);
  if (H >= 5) stored[1] = 20.0f, stored[3] = -20.0f, stored[5] = 0.0f;
  const std::vector<float> deff = randu(2 * H, 310 + H, -2.0f, 2.0f, false);
  const std::vector<float> d0 = randu(2 * H, 320 + H, -1.0f, 1.0f, false);
  std::vector<float> want_eff(2 * H), want_d = d0;
  kvs::cpu::shift_gate_forward(want_eff.data(), stored.data(), H);
  kvs::cpu::shift_gate_backward(want_d.data(), deff.data(), stored.data(), H);
  const unsigned blocks = (unsigned)((H + 127) / 128);  // the launchers' grid: ceil_div(H, 128) x 128
  std::vector<float> eff(2 * H + 1, std::nanf(""));
  emu::launch(emu::Dim{blocks, 1, 1}, 128, [&] { kc::shift_gate_forward_kernel(eff.data(), stored.data(), H); });
  expect(std::isnan(eff[2 * H]), tag, "forward wrote past 2H");
  eff.pop_back();
  check(tag, "eff", eff, want_eff, 1e-5, 1e-7);
  std::vector<float> d = d0;
  d.push_back(std::nanf(""));
  emu::launch(emu::Dim{blocks, 1, 1}, 128, [&] { kc::shift_gate_backward_kernel(d.data(), deff.data(), stored.data(), H); });
  expect(std::isnan(d[2 * H]), tag, "backward wrote past 2H");
  d.pop_back();
  size_t col0 = 0;
  for (int h = 0; h < H; ++h) col0 += std::memcmp(&d[h * 2], &d0[h * 2], 4) != 0;
  expect(col0 == 0, tag, "backward changed column 0");
  check(tag, "dstored", d, want_d, 1e-5, 1e-7);
  done(tag);
}

}  // namespace

void run_reduce() {
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{262144 * 4 + 5}, size_t{4096 * 1024 + 7}}) reduce(n);
}

void run_convert() {
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{1000}, size_t{4099}}) {
    convert(n, 0, false);
    convert(n, 1, false);
    if (n >= 8) convert(n, 0, true);  // aligned, scalar kernel
  }
  for (size_t n : {size_t{1}, size_t{9}, size_t{100003}}) fill(n);
  for (size_t n : {size_t{1}, size_t{9}, size_t{100003}}) add(n);
  // 3 blocks of 256: 100003 elements take 17 passes in chunks of 8, 131 one at a time.
  g_grid_cap = 3;
  convert(100003, 0, false);
  convert(100003, 1, false);
  convert(100003, 0, true);
  fill(100003);
  add(100003);
  g_grid_cap = 0;
}

void run_shift_gate() {
  for (int H : {1, 5, 128, 130}) shift_gate(H);
}

}  // namespace simt
