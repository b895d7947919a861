// The CPU kernels' tests compiled for AVX2 (x86-64-v3) on a machine whose own
// build targets AVX-512: the 32-byte paths (block_gemm's 2-vector tiles,
// row_reduce's two registers per sixteen lanes, SwiGLU's eight lanes) run in
// CI on every x86 machine, not only on the AVX2 ones the project's users have.
// Header-only kernels, so nothing of kvs_lib (built for the native ISA) is
// linked in beside them. CMakeLists.txt: kvshift_kernel_tests_avx2.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
