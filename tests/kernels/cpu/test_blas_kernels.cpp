// The OpenBLAS core chosen from cpuid feature flags, and the user's own
// OPENBLAS_CORETYPE kept (kernels/cpu/blas_kernels.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cpu/blas_kernels.h"
#include "kernels/cpu/ops.h"

namespace kvs::cpu {
namespace {

bool every_core(const std::string&) { return true; }
bool no_cooperlake(const std::string& core) { return core != "Cooperlake"; }
bool nothing(const std::string&) { return false; }

CpuFeatures sse() {
  CpuFeatures f;
  f.ssse3 = f.sse4_2 = true;
  return f;
}
CpuFeatures avx2() {
  CpuFeatures f = sse();
  f.avx = f.avx2 = f.fma = true;
  return f;
}
CpuFeatures avx512() {
  CpuFeatures f = avx2();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512cd = true;
  return f;
}

std::string pick(const CpuFeatures& f, bool (*available)(const std::string&) = every_core) {
  return choose_openblas_core(nullptr, f, available, "Prescott").core;
}

TEST(BlasKernels, FeatureFlagsMapToFamilies) {
  CpuFeatures bf16 = avx512();
  bf16.avx512_bf16 = true;
  EXPECT_EQ(pick(bf16), "Cooperlake");
  EXPECT_EQ(pick(avx512()), "SkylakeX");
  EXPECT_EQ(pick(avx2()), "Haswell");
  CpuFeatures amd = avx2();
  amd.amd = true;
  EXPECT_EQ(pick(amd), "Zen");
  CpuFeatures avx = sse();
  avx.avx = true;
  EXPECT_EQ(pick(avx), "Sandybridge");
  EXPECT_EQ(pick(sse()), "Nehalem");
  EXPECT_EQ(pick(CpuFeatures{}), "Prescott");
}

TEST(BlasKernels, Avx512NeedsAllFourSubsets) {
  for (int missing = 0; missing < 4; ++missing) {
    CpuFeatures f = avx512();
    f.avx512_bf16 = true;
    bool* subset[] = {&f.avx512f, &f.avx512bw, &f.avx512vl, &f.avx512dq};
    *subset[missing] = false;
    EXPECT_EQ(pick(f), "Haswell") << "AVX-512 subset " << missing << " missing";
  }
}

TEST(BlasKernels, FallsBackToWhatTheLibraryHas) {
  CpuFeatures f = avx512();
  f.avx512_bf16 = true;
  EXPECT_EQ(pick(f, no_cooperlake), "SkylakeX");
  const BlasChoice none = choose_openblas_core(nullptr, f, nothing, "Haswell");
  EXPECT_EQ(none.core, "Haswell");
  EXPECT_EQ(none.source, "OpenBLAS's own detection");
}

TEST(BlasKernels, UsersCoretypeWins) {
  CpuFeatures f = avx512();
  f.avx512_bf16 = true;
  const BlasChoice user = choose_openblas_core("Haswell", f, every_core, "Cooperlake");
  EXPECT_EQ(user.core, "Haswell");
  EXPECT_EQ(user.source, "OPENBLAS_CORETYPE");
  EXPECT_FALSE(user.slow_fallback);
  // Kept even when it is slow, but then flagged.
  const BlasChoice slow = choose_openblas_core("Prescott", f, every_core, "Cooperlake");
  EXPECT_EQ(slow.core, "Prescott");
  EXPECT_TRUE(slow.slow_fallback);
  // An empty variable is no choice.
  EXPECT_EQ(choose_openblas_core("", f, every_core, "Prescott").core, "Cooperlake");
}

TEST(BlasKernels, SlowFallbacks) {
  EXPECT_TRUE(is_slow_fallback("Prescott", avx512()));
  EXPECT_TRUE(is_slow_fallback("Sandybridge", avx2()));
  EXPECT_FALSE(is_slow_fallback("Haswell", avx512()));
  EXPECT_FALSE(is_slow_fallback("Prescott", sse()));  // nothing faster exists there
}

// In this process: the switch leaves a user's variable alone, and otherwise
// runs a core this CPU can execute (a GEMM through it gives the right answer).
TEST(BlasKernels, SelectionInProcess) {
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  const std::string user_value = user ? user : "";
  const BlasChoice& ch = select_blas_kernels();
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE") ? std::string(std::getenv("OPENBLAS_CORETYPE")) : "", user_value);
  if (!user_value.empty()) {
    EXPECT_EQ(ch.source, "OPENBLAS_CORETYPE");
  }
  EXPECT_LE(isa_level(ch.core), isa_level(detect_cpu_features()));
  const float a[4] = {1, 2, 3, 4}, w[4] = {5, 6, 7, 8};  // out = a @ w^T
  float out[4] = {};
  matmul_forward(out, a, w, 2, 2, 2);
  EXPECT_EQ(out[0], 17.0f);
  EXPECT_EQ(out[1], 23.0f);
  EXPECT_EQ(out[2], 39.0f);
  EXPECT_EQ(out[3], 53.0f);
}

// The mechanism itself: OpenBLAS switched in process runs the named kernels,
// and they compute the same product. A name it does not know changes nothing.
TEST(BlasKernels, SwitchesTheLoadedLibrary) {
  const BlasChoice& ch = select_blas_kernels();
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const std::string env_before = env ? env : "<unset>";
  const std::string before = openblas_core();
  EXPECT_EQ(before, ch.core);
  std::vector<std::string> cores = {"Prescott"};
  if (isa_level(detect_cpu_features()) >= 3) cores.push_back("Haswell");
  const float a[6] = {1, 2, 3, 4, 5, 6}, w[6] = {0.5f, -1, 2, 3, 0.25f, -2};  // [2,3] @ [2,3]^T
  for (const std::string& core : cores) {
    ASSERT_TRUE(switch_openblas_core(core)) << core;
    EXPECT_EQ(openblas_core(), core);
    float out[4] = {};
    matmul_forward(out, a, w, 2, 3, 2);
    EXPECT_EQ(out[0], 4.5f);
    EXPECT_EQ(out[1], -2.5f);
    EXPECT_EQ(out[2], 9.0f);
    EXPECT_EQ(out[3], 1.25f);
  }
  // A name it does not know: back to the kernels that ran (Haswell on an AVX2
  // machine), not the Prescott an unknown name gives, nor a fresh detection
  // (Prescott again on a VM that masks its CPU model).
  EXPECT_FALSE(switch_openblas_core("NoSuchCore"));
  EXPECT_EQ(openblas_core(), cores.back());
  ASSERT_TRUE(switch_openblas_core(before));
  env = std::getenv("OPENBLAS_CORETYPE");
  EXPECT_EQ(env ? env : "<unset>", env_before);
}

}  // namespace
}  // namespace kvs::cpu
