// The host CUDA shim's contract checks, each against a planted misuse
// (planted/planted.cu and direct API calls) that a GPU would fault on, race
// on or refuse: host pointers where device memory belongs, accesses outside
// an allocation or after its free, unordered accesses from two streams,
// host code touching device memory, results read before the stream is
// synchronised, launch limits, and cuBLASLt attributes the host GEMM does
// not implement. Each test also runs the correct version, which must pass.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "hostcuda.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/ops.h"
#include "model/cuda_engine.h"
#include "planted.h"
#include "test_util.h"

namespace {

std::string text(cudaError_t e) { return e == cudaSuccess ? "" : cudaGetErrorString(e); }

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "missing '" << (needle) << "' in: " << (haystack)

struct DeviceFloats {
  float* p = nullptr;
  explicit DeviceFloats(size_t n) { EXPECT_EQ(cudaMalloc(&p, n * sizeof(float)), cudaSuccess); }
  ~DeviceFloats() { cudaFree(p); }
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
};

float read_one(const float* d) {
  float h = 0;
  EXPECT_EQ(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

}  // namespace

TEST(HostCuda, NoCudaLibraryIsLoaded) {
  for (const char* lib : {"libcudart.so.13", "libcudart.so.12", "libcublasLt.so.13", "libcublas.so.13",
                          "libnccl.so.2", "libcudnn.so.9", "libcuda.so.1"})
    EXPECT_EQ(dlopen(lib, RTLD_NOW | RTLD_NOLOAD), nullptr) << lib << " is loaded: a real CUDA call slipped in";
}

TEST(HostCudaContracts, AHostPointerAsAKernelArgumentIsRefusedAtLaunch) {
  std::vector<float> host(100);
  planted::fill(host.data(), 100, 1.0f, nullptr);
  const cudaError_t e = cudaGetLastError();
  EXPECT_EQ(e, cudaErrorInvalidValue);
  EXPECT_HAS(text(e), "argument 0 is");
  EXPECT_HAS(text(e), "host memory, not a device pointer");
  // Through an engine launcher: its launch check names the kernel.
  EXPECT_KVS_ERROR(kvs::cuda::fill_f32(host.data(), 0.0f, host.size(), nullptr), "fill_kernel<float>",
                   "not a device pointer");
  DeviceFloats d(100);
  planted::fill(d.p, 100, 1.0f, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(read_one(d.p + 99), 1.0f);
}

TEST(HostCudaContracts, CopiesCheckWhichSideIsDeviceMemory) {
  std::vector<float> a(16), b(16);
  DeviceFloats d(16);
  cudaError_t e = cudaMemcpy(a.data(), b.data(), 64, cudaMemcpyHostToDevice);
  EXPECT_EQ(e, cudaErrorInvalidValue);
  EXPECT_HAS(text(e), "the destination is");
  EXPECT_HAS(text(e), "not a device pointer");
  e = cudaMemcpy(d.p, d.p, 64, cudaMemcpyHostToDevice);
  EXPECT_HAS(text(e), "the source is");
  EXPECT_HAS(text(e), "not host memory");
  e = cudaMemcpy(d.p, a.data(), 68, cudaMemcpyHostToDevice);  // one float too many
  EXPECT_HAS(text(e), "4 bytes past its end");
  EXPECT_EQ(cudaMemcpy(d.p, a.data(), 64, cudaMemcpyHostToDevice), cudaSuccess);
}

TEST(HostCudaContracts, AKernelAccessPastItsAllocationFailsTheSynchronisation) {
  Stream s;
  for (int n : {100, 1024}) {  // the overrun in the allocation's last page, and in the guard page after it
    DeviceFloats d(n), out(1);
    planted::fill(d.p, n + 1, 1.0f, s.s);
    cudaError_t e = cudaStreamSynchronize(s.s);
    EXPECT_EQ(e, cudaErrorIllegalAddress) << n;
    EXPECT_HAS(text(e), "kernel fill_kernel");
    EXPECT_HAS(text(e), "writes 4 bytes at 0 bytes past the end of allocation");
    EXPECT_HAS(text(e), "(out of bounds)");
    planted::sum(out.p, d.p, n + 1, s.s);
    e = cudaStreamSynchronize(s.s);
    EXPECT_HAS(text(e), "kernel sum_kernel");
    EXPECT_HAS(text(e), "reads 4 bytes at 0 bytes past the end");
    planted::fill(d.p, n, 2.0f, s.s);
    planted::sum(out.p, d.p, n, s.s);
    EXPECT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
    EXPECT_EQ(read_one(out.p), 2.0f * n);
  }
}

// KVS_CUDA_SYNC=1's wait after a launch (kernels/cuda/device.h): the fault is
// reported at the launch, naming the kernel the caller names.
TEST(HostCudaContracts, WaitingAfterALaunchNamesTheFaultingKernel) {
  Stream s;
  DeviceFloats d(100);
  planted::fill(d.p, 100, 1.0f, s.s);
  EXPECT_NO_THROW(kvs::cuda::check_launch("fill_kernel", true));
  planted::fill(d.p, 101, 1.0f, s.s);
  try {
    kvs::cuda::check_launch("fill_kernel", true);
    ADD_FAILURE() << "an access past the allocation passed the wait";
  } catch (const kvs::Error& e) {
    EXPECT_HAS(e.what(), "CUDA kernel fill_kernel failed while running (KVS_CUDA_SYNC=1)");
    EXPECT_HAS(e.what(), "past the end of allocation");
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the error was reported once
}

TEST(HostCudaContracts, UseAfterFreeIsReported) {
  Stream s;
  float* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 64 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  planted::fill(p, 64, 1.0f, s.s);
  const cudaError_t e = cudaStreamSynchronize(s.s);
  EXPECT_EQ(e, cudaErrorIllegalAddress);
  EXPECT_HAS(text(e), "(use after free)");
  EXPECT_HAS(text(e), "freed)");
  float h;
  EXPECT_HAS(text(cudaMemcpy(&h, p, 4, cudaMemcpyDeviceToHost)), "(use after free)");
  EXPECT_HAS(text(cudaFree(p)), "freed twice");
}

// Two streams with no event between a write and a read of the same bytes: a
// GPU may run them in either order or at once.
TEST(HostCudaContracts, AccessesFromTwoStreamsWithoutAnEventAreARace) {
  Stream s1, s2;
  DeviceFloats d(256), out(1);
  ASSERT_EQ(cudaMemset(d.p, 0, 256 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // Read after write.
  planted::fill(d.p, 256, 1.0f, s1.s);
  planted::sum(out.p, d.p, 256, s2.s);
  cudaError_t e = cudaDeviceSynchronize();
  EXPECT_EQ(e, cudaErrorLaunchFailure);
  EXPECT_HAS(text(e), "kernel sum_kernel");
  EXPECT_HAS(text(e), "reads byte 0 of allocation");
  EXPECT_HAS(text(e), "which kernel fill_kernel");
  EXPECT_HAS(text(e), "wrote with no event or synchronisation ordering the two");
  // Write after read.
  planted::sum(out.p, d.p, 256, s2.s);
  planted::fill(d.p, 256, 3.0f, s1.s);
  e = cudaDeviceSynchronize();
  EXPECT_HAS(text(e), "writes byte 0");
  EXPECT_HAS(text(e), "read with no event");
  // Write after read, where the writer's own stream read the bytes in between
  // (a send on a communicator's stream, then the engine's read-modify-write):
  // the other stream's read still races with the write.
  DeviceFloats out2(1);
  planted::sum(out.p, d.p, 256, s2.s);
  planted::sum(out2.p, d.p, 256, s1.s);
  planted::fill(d.p, 256, 3.0f, s1.s);
  e = cudaDeviceSynchronize();
  EXPECT_HAS(text(e), "kernel fill_kernel");
  EXPECT_HAS(text(e), "writes byte 0");
  EXPECT_HAS(text(e), "which kernel sum_kernel");
  EXPECT_HAS(text(e), "on stream #" + std::to_string(hostcuda::stream_index(s2.s, nullptr)) + " read with no event");
  // Ordered by an event: no race, and the reader sees the writer's values.
  cudaEvent_t ev;
  ASSERT_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
  planted::fill(d.p, 256, 2.0f, s1.s);
  ASSERT_EQ(cudaEventRecord(ev, s1.s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(s2.s, ev, 0), cudaSuccess);
  planted::sum(out.p, d.p, 256, s2.s);
  EXPECT_EQ(cudaStreamSynchronize(s2.s), cudaSuccess);
  EXPECT_EQ(read_one(out.p), 512.0f);
  // Ordered by the host: it synchronised with s1 before issuing on s2.
  planted::fill(d.p, 256, 4.0f, s1.s);
  ASSERT_EQ(cudaStreamSynchronize(s1.s), cudaSuccess);
  planted::sum(out.p, d.p, 256, s2.s);
  EXPECT_EQ(cudaStreamSynchronize(s2.s), cudaSuccess);
  EXPECT_EQ(read_one(out.p), 1024.0f);
  cudaEventDestroy(ev);
}

// Blocks of one launch run in any order (or at once): two blocks touching the
// same bytes, one of them writing, is a race the emulator's one-block-at-a-time
// order would hide.
TEST(HostCudaContracts, TwoBlocksOfOneLaunchWritingTheSameBytesAreARace) {
  Stream s;
  DeviceFloats out(4);
  planted::every_block_writes(out.p, 1, s.s);
  EXPECT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  planted::every_block_writes(out.p, 3, s.s);
  const cudaError_t e = cudaStreamSynchronize(s.s);
  EXPECT_EQ(e, cudaErrorLaunchFailure);
  EXPECT_HAS(text(e), "kernel every_block_writes_kernel");
  EXPECT_HAS(text(e), "block (1, 0, 0) writes byte 0 of allocation");
  EXPECT_HAS(text(e), "which block (0, 0, 0) of the same launch wrote");
}

// A GPU faults on a vector access that is not aligned to its size (and so
// does the host's aligned vector instruction here: the process dies with the
// check's message, as a GPU context would).
TEST(HostCudaContracts, AMisalignedVectorAccessFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Stream s;
  DeviceFloats x(8), out(4);
  ASSERT_EQ(cudaMemset(x.p, 0, 8 * sizeof(float)), cudaSuccess);
  planted::vector_read(out.p, x.p + 4, s.s);
  EXPECT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_DEATH(
      {
        planted::vector_read(out.p, x.p + 1, s.s);
        cudaStreamSynchronize(s.s);
      },
      "reads 16 bytes at byte 4 of allocation #[0-9]+ \\(32 bytes, live\\), not 16-byte aligned");
}

// cudaMemcpy from pageable memory returns once the source is staged, before
// the device has the data: a kernel on a non-blocking stream that reads it
// next must wait for the device (zero1_device.cpp's staged copies do).
TEST(HostCudaContracts, APageableCopyNeedsADeviceSynchronisationBeforeAnotherStreamReads) {
  Stream s;
  DeviceFloats d(64), out(1);
  const std::vector<float> ones(64, 1.0f);
  ASSERT_EQ(cudaMemcpy(d.p, ones.data(), 64 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  planted::sum(out.p, d.p, 64, s.s);
  const cudaError_t e = cudaStreamSynchronize(s.s);
  EXPECT_HAS(text(e), "cudaMemcpy(HostToDevice, 256 bytes) on stream #0 wrote");
  ASSERT_EQ(cudaMemcpy(d.p, ones.data(), 64 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  planted::sum(out.p, d.p, 64, s.s);
  EXPECT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_EQ(read_one(out.p), 64.0f);
}

TEST(HostCudaContracts, AsyncResultsInPinnedMemoryAreUndefinedUntilTheStreamIsSynchronised) {
  Stream s;
  DeviceFloats d(1);
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, sizeof(float)), cudaSuccess);
  *pinned = 7.0f;
  planted::fill(d.p, 1, 3.0f, s.s);
  ASSERT_EQ(cudaMemcpyAsync(pinned, d.p, sizeof(float), cudaMemcpyDeviceToHost, s.s), cudaSuccess);
  EXPECT_TRUE(std::isnan(*pinned)) << "read before the synchronisation: " << *pinned;
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_EQ(*pinned, 3.0f);
  cudaFreeHost(pinned);
}

TEST(HostCudaContracts, HostCodeDereferencingDeviceMemoryDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        float* p = nullptr;
        cudaMalloc(&p, 64);
        volatile float x = p[3];
        (void)x;
      },
      "host code accessed device memory at .* \\(byte 12 of allocation #[0-9]+ \\(64 bytes, live\\)\\)");
}

// An operation opens what it touches only while it runs: after the
// synchronisation the same memory faults again on the host.
TEST(HostCudaContracts, MemoryAnOperationTouchedIsClosedAgainAfterIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        float* p = nullptr;
        cudaMalloc(&p, 64);
        cudaMemset(p, 0, 64);
        cudaDeviceSynchronize();
        volatile float x = p[3];
        (void)x;
      },
      "host code accessed device memory at .* \\(byte 12 of allocation #[0-9]+ \\(64 bytes, live\\)\\)");
}

TEST(HostCudaContracts, LaunchesAreCheckedAsTheDriverChecksThem) {
  Stream s;
  DeviceFloats d(64), out(1);
  planted::fill_with_block(d.p, 64, 2048, s.s);
  cudaError_t e = cudaGetLastError();
  EXPECT_EQ(e, cudaErrorInvalidConfiguration);
  EXPECT_HAS(text(e), "block of 2048 threads");
  // Dynamic shared memory above 48 KiB needs the kernel's opt-in.
  planted::read_smem(out.p, 0, 64 * 1024, s.s);
  e = cudaGetLastError();
  EXPECT_HAS(text(e), "65536 bytes of dynamic shared memory, above the 49152");
  planted::allow_smem(64 * 1024);
  planted::read_smem(out.p, 0, 64 * 1024, s.s);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  // Reading beyond the launch's dynamic shared memory.
  planted::read_smem(out.p, 257, 1024, s.s);
  EXPECT_HAS(text(cudaStreamSynchronize(s.s)), "reads dynamic shared memory bytes [1024, 1028) beyond the 1024 bytes");
  planted::big_static_smem(out.p, s.s);
  EXPECT_HAS(text(cudaStreamSynchronize(s.s)), "53248 bytes of static shared memory (at most 48 KiB)");
  cudaStream_t dead;
  ASSERT_EQ(cudaStreamCreateWithFlags(&dead, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(dead), cudaSuccess);
  planted::fill(d.p, 64, 1.0f, dead);
  EXPECT_HAS(text(cudaGetLastError()), "used after cudaStreamDestroy");
}

// The host GEMM implements the descriptor attributes the engine sets and
// refuses the others by name; an algorithm chosen for an alignment refuses
// a less aligned pointer, as cuBLASLt's kernels would misread it.
TEST(HostCudaContracts, TheHostGemmRefusesWhatItDoesNotImplement) {
  cublasLtMatmulDescOpaque_t op_storage;
  cublasLtMatmulDesc_t op = &op_storage;
  ASSERT_EQ(cublasLtMatmulDescInit(op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_RELU;
  cublasStatus_t st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
  EXPECT_EQ(st, CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_HAS(cublasLtGetStatusName(st), "CUBLASLT_MATMUL_DESC_EPILOGUE (7) is not implemented");
  const int32_t conj = CUBLAS_OP_C;
  st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &conj, sizeof conj);
  EXPECT_HAS(cublasLtGetStatusName(st), "only CUBLAS_OP_N and CUBLAS_OP_T");

  // A 16-bit output type other than bf16.
  cublasLtHandle_t h;
  ASSERT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayoutOpaque_t a_s, b_s, d_s;
  cublasLtMatrixLayout_t a = &a_s, b = &b_s, dl = &d_s;
  cublasLtMatrixLayoutInit(a, CUDA_R_16BF, 8, 8, 8);
  cublasLtMatrixLayoutInit(b, CUDA_R_16BF, 8, 8, 8);
  cublasLtMatrixLayoutInit(dl, CUDA_R_16F, 8, 8, 8);
  cublasLtMatmulPreferenceOpaque_t p_s;
  cublasLtMatmulPreference_t pref = &p_s;
  cublasLtMatmulPreferenceInit(pref);
  cublasLtMatmulHeuristicResult_t r;
  int found = 0;
  st = cublasLtMatmulAlgoGetHeuristic(h, op, a, b, dl, dl, pref, 1, &r, &found);
  EXPECT_HAS(cublasLtGetStatusName(st), "D must be CUDA_R_16BF or CUDA_R_32F, got CUDA_R_16F");

  // An algorithm chosen for 16-byte alignment, then a 2-byte aligned A.
  cublasLtMatrixLayoutInit(dl, CUDA_R_16BF, 8, 8, 8);
  const uint32_t sixteen = 16;
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, attr, &sixteen, sizeof sixteen), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(h, op, a, b, dl, dl, pref, 1, &r, &found), CUBLAS_STATUS_SUCCESS);
  __nv_bfloat16 *A, *B, *D;
  ASSERT_EQ(cudaMalloc(&A, 66 * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&B, 64 * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&D, 64 * 2), cudaSuccess);
  const float alpha = 1.0f, beta = 0.0f;
  st = cublasLtMatmul(h, op, &alpha, A + 1, a, B, b, &beta, D, dl, D, dl, &r.algo, nullptr, 0, nullptr);
  EXPECT_EQ(st, CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_HAS(cublasLtGetStatusName(st), "A is 2-byte aligned, but the algorithm was chosen for 16-byte alignment");
  EXPECT_EQ(cublasLtMatmul(h, op, &alpha, A, a, B, b, &beta, D, dl, D, dl, &r.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(A);
  cudaFree(B);
  cudaFree(D);
  cublasLtDestroy(h);
}

namespace {

kvs::ModelConfig tiny_model() {
  kvs::ModelConfig m;
  m.hidden_size = 32;
  m.intermediate_size = 64;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.vocab_size = 40;
  m.max_position_embeddings = 16;
  m.kv_shift.enabled = true;
  return m;
}

// A ZeRO-1-like consumer of the engine's ready gradients on its own stream:
// sums each announced range there, waiting for the engine's event first, or not.
struct SumOnAnotherStream : kvs::Engine::GradReadyHook {
  kvs::Engine& engine;
  cudaStream_t stream;
  float* out;
  bool wait;
  SumOnAnotherStream(kvs::Engine& e, cudaStream_t s, float* o, bool w) : engine(e), stream(s), out(o), wait(w) {}
  void grads_ready(size_t begin, size_t end, void* ev) override {
    if (wait) {
      EXPECT_EQ(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(ev), 0), cudaSuccess);
    }
    planted::sum(out, engine.flat_grads() + begin, static_cast<int>(end - begin), stream);
  }
};

}  // namespace

// The engine's overlap protocol (grads_final's events, which ZeRO-1 over NCCL
// waits for): a consumer that waits reads final gradients; one that does not
// races with the backward that writes them.
TEST(HostCudaContracts, TheEnginesGradientEventsOrderAnotherStreamsReads) {
  const kvs::ModelConfig m = tiny_model();
  std::vector<int32_t> in(16), tg(16);
  for (int i = 0; i < 16; ++i) {
    in[i] = (i * 7 + 1) % m.vocab_size;
    tg[i] = (i * 3 + 2) % m.vocab_size;
  }
  const kvs::Batch b{2, 8, in.data(), tg.data(), nullptr};
  Stream s;
  DeviceFloats out(1);
  for (bool wait : {true, false}) {
    kvs::CudaEngine e(m, 2, 8);
    SumOnAnotherStream hook(e, s.s, out.p, wait);
    e.set_grad_ready_hook(&hook);
    e.zero_grad();
    e.forward_backward(b, 0.1);
    e.set_grad_ready_hook(nullptr);
    const cudaError_t err = cudaStreamSynchronize(s.s);
    if (wait) {
      EXPECT_EQ(err, cudaSuccess) << text(err);
    } else {
      EXPECT_EQ(err, cudaErrorLaunchFailure);
      EXPECT_HAS(text(err), "kernel sum_kernel");
      EXPECT_HAS(text(err), "with no event or synchronisation ordering the two");
    }
  }
}
