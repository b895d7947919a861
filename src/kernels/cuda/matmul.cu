// cuBLASLt matmuls (see matmul.h for the contract).
//
// Row-major -> column-major mapping. cuBLASLt is column-major: a row-major
// matrix X[R, K] with row stride ld is, byte for byte, the column-major matrix
// X^T of shape [K, R] with leading dimension ld (ld >= K). Every row-major
// product therefore becomes the transposed product on the transposed views:
//
//   forward         out[N,OC] = inp[N,C] W[OC,C]^T
//                   out^T[OC,N] = W[OC,C] inp^T[C,N]
//                   W's memory is W^T[C,OC] (ld C), needed as W -> op(A) = T;
//                   inp's memory is inp^T[C,N] (ld ld_in)        -> op(B) = N
//                   gemm(T, N, m=OC, n=N, k=C, A=W, lda=C, B=inp, ldb=ld_in, D=out, ldd=ld_out)
//   backward_input  dinp[N,C] = dout[N,OC] W[OC,C]
//                   dinp^T[C,N] = W^T[C,OC] dout^T[OC,N]
//                   gemm(N, N, m=C, n=N, k=OC, A=W, lda=C, B=dout, ldb=ld_dout, D=dinp, ldd=C)
//   backward_weight dW[OC,C] += dout^T[OC,N] inp[N,C]
//                   dW^T[C,OC] += inp^T[C,N] dout[N,OC]
//                   inp's memory is inp^T (op N); dout's memory is dout^T[OC,N], needed as dout -> op(B) = T
//                   gemm(N, T, m=C, n=OC, k=N, A=inp, lda=ld_in, B=dout, ldb=ld_dout, D=dW, ldd=C, beta=1, fp32)
//
// In gemm(), the stored (pre-op) shapes are A: [m,k] (or [k,m] when
// transposed), B: [k,n] (or [n,k]), D: [m,n]; each leading dimension must be at
// least its matrix's stored row count, which gemm() checks.
//
// Numerics: CUBLAS_COMPUTE_32F (fp32 accumulation on the tensor cores), alpha
// and beta fp32 on the host. Split-K algorithms are restricted to reduction
// schemes that keep partial sums in fp32 and reduce them in a fixed order: the
// "in place" scheme adds the parts in the output type (bf16 for activations)
// through counters, and the "output type" scheme would round bf16 partials
// before summing them. For an fp32 output the output type is the compute type,
// so that scheme is allowed there.
//
// Alignment: the heuristic is told each pointer's real alignment, capped at 16
// bytes (cudaMalloc gives 256; offsets into the engine's buffers are usually
// multiples of 8 elements), and the choice is cached per shape and alignment.
// A less aligned pointer (a column offset that is not a multiple of 8 bf16, or
// a weight after a parameter tensor whose size is not a multiple of 8, as in
// small test models with one or two KV heads) gets algorithms that allow it,
// cached like the others rather than queried on every call.
//
// The single workspace means calls must not run concurrently on two streams.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/kernel_profile.h"
#include "kernels/cuda/matmul.h"

namespace kvs::cuda {

namespace {

constexpr uint32_t kCachedAlignment = 16;  // bytes: larger alignments are cached as 16

void check_lt(cublasStatus_t st, const char* call, const char* shape) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt {} failed ({}) for {}", call, cublasLtGetStatusName(st), shape);
}

// Largest power of two (capped at 256) dividing the address.
uint32_t pointer_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// One line naming a GEMM, for every error message.
void name_gemm(char* out, size_t size, bool trans_a, bool trans_b, int m, int n, int k, int lda, int ldb, int ldd,
               bool d_fp32) {
  snprintf(out, size, "gemm(%c%c, m=%d n=%d k=%d, lda=%d ldb=%d ldd=%d, D %s)", trans_a ? 'T' : 'N',
           trans_b ? 'T' : 'N', m, n, k, lda, ldb, ldd, d_fp32 ? "fp32" : "bf16");
}

// The checks every GEMM gets, and the empty ones done here: false when there
// is nothing left for cuBLASLt (m or n is 0; k is 0: D = beta D).
bool nonempty(const char* shape, int m, int n, int k, float beta, void* D, int ldd, bool d_fp32,
              cudaStream_t stream) {
  if (m < 0 || n < 0 || k < 0) fail("cuBLASLt: negative dimension in {}", shape);
  if (m == 0 || n == 0) return false;
  if (ldd < m) fail("cuBLASLt: leading dimension of D below its {} rows in {}", m, shape);
  if (k > 0) return true;
  const size_t d_elem = d_fp32 ? sizeof(float) : sizeof(__nv_bfloat16);
  if (beta == 0.0f) {  // empty sum: D = beta * D (A and B are not read)
    const cudaError_t e = cudaMemset2DAsync(D, size_t(ldd) * d_elem, 0, size_t(m) * d_elem, size_t(n), stream);
    if (e != cudaSuccess) fail("cudaMemset2DAsync failed ({}) for {}", cudaGetErrorString(e), shape);
  } else if (beta != 1.0f) {
    fail("cuBLASLt: k = 0 with beta {} is not supported in {}", beta, shape);
  }
  return false;
}

}  // namespace

Matmul::Matmul(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  check_lt(cublasLtCreate(&handle_), "cublasLtCreate", "the handle");
  if (workspace_bytes_ > 0) {
    const cudaError_t e = cudaMalloc(&workspace_, workspace_bytes_);
    if (e != cudaSuccess) {
      cublasLtDestroy(handle_);
      fail("cudaMalloc of the {}-byte cuBLASLt workspace failed: {}", workspace_bytes_, cudaGetErrorString(e));
    }
  }
}

Matmul::~Matmul() {
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

void Matmul::forward(__nv_bfloat16* out, int ld_out, const __nv_bfloat16* inp, int ld_in, const __nv_bfloat16* W,
                     int N, int C, int OC, cudaStream_t stream) {
  gemm(true, false, OC, N, C, W, C, inp, ld_in, 0.0f, out, ld_out, false, stream);
  if (profile::enabled()) profile::mark(kvs::profile::gemm_name("fwd", N, OC, C), stream, 2.0 * N * OC * C);
}

void Matmul::backward_input(__nv_bfloat16* dinp, const __nv_bfloat16* dout, int ld_dout, const __nv_bfloat16* W,
                            int N, int C, int OC, cudaStream_t stream) {
  gemm(false, false, C, N, OC, W, C, dout, ld_dout, 0.0f, dinp, C, false, stream);
  if (profile::enabled()) profile::mark(kvs::profile::gemm_name("bwd dinp", N, C, OC), stream, 2.0 * N * C * OC);
}

void Matmul::backward_weight(float* dW, const __nv_bfloat16* dout, int ld_dout, const __nv_bfloat16* inp, int ld_in,
                             int N, int C, int OC, cudaStream_t stream) {
  gemm(false, true, C, OC, N, inp, ld_in, dout, ld_dout, 1.0f, dW, C, true, stream);
  if (profile::enabled()) profile::mark(kvs::profile::gemm_name("bwd dW", OC, C, N), stream, 2.0 * OC * C * N);
}

// One GEMM's problem in cuBLASLt's terms: the descriptors (stack storage, so
// that a call allocates nothing), the pointers' alignments and a line naming
// it for error messages. Empty (m, n or k zero) problems are handled by
// gemm() before one is built.
struct Matmul::Problem {
  cublasLtMatmulDescOpaque_t op_storage;
  cublasLtMatrixLayoutOpaque_t a_storage, b_storage, d_storage;
  cublasLtMatmulDesc_t op = &op_storage;
  cublasLtMatrixLayout_t a_desc = &a_storage, b_desc = &b_storage, d_desc = &d_storage;
  uint32_t align_a = 0, align_b = 0, align_d = 0;  // capped at kCachedAlignment
  bool d_fp32 = false;
  char shape[200];
};

void Matmul::describe(Problem& p, bool trans_a, bool trans_b, int m, int n, int k, const __nv_bfloat16* A, int lda,
                      const __nv_bfloat16* B, int ldb, const void* D, int ldd, bool d_fp32) {
  const char* shape = p.shape;
  const int a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  if (lda < a_rows || ldb < b_rows)
    fail("cuBLASLt: leading dimension below the stored rows (A {} x {}, B {} x {}) in {}", a_rows, a_cols, b_rows,
         b_cols, shape);
  p.d_fp32 = d_fp32;
  const cudaDataType_t d_type = d_fp32 ? CUDA_R_32F : CUDA_R_16BF;
  check_lt(cublasLtMatmulDescInit(p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescInit", shape);
  const int32_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a),
           "cublasLtMatmulDescSetAttribute(TRANSA)", shape);
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b),
           "cublasLtMatmulDescSetAttribute(TRANSB)", shape);
  check_lt(cublasLtMatrixLayoutInit(p.a_desc, CUDA_R_16BF, uint64_t(a_rows), uint64_t(a_cols), int64_t(lda)),
           "cublasLtMatrixLayoutInit(A)", shape);
  check_lt(cublasLtMatrixLayoutInit(p.b_desc, CUDA_R_16BF, uint64_t(b_rows), uint64_t(b_cols), int64_t(ldb)),
           "cublasLtMatrixLayoutInit(B)", shape);
  check_lt(cublasLtMatrixLayoutInit(p.d_desc, d_type, uint64_t(m), uint64_t(n), int64_t(ldd)),
           "cublasLtMatrixLayoutInit(D)", shape);
  p.align_a = std::min(pointer_alignment(A), kCachedAlignment);
  p.align_b = std::min(pointer_alignment(B), kCachedAlignment);
  p.align_d = std::min(pointer_alignment(D), kCachedAlignment);
}

// The heuristic's first `count` algorithms for the problem, best first (at least one, or a one-line error).
std::vector<cublasLtMatmulHeuristicResult_t> Matmul::heuristics(const Problem& p, int count) {
  const char* shape = p.shape;
  cublasLtMatmulPreferenceOpaque_t pref_storage;
  cublasLtMatmulPreference_t pref = &pref_storage;
  check_lt(cublasLtMatmulPreferenceInit(pref), "cublasLtMatmulPreferenceInit", shape);
  const uint64_t ws = workspace_bytes_;
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
           "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", shape);
  const uint32_t schemes = p.d_fp32 ? uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) |
                                          uint32_t(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)
                                    : uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                sizeof schemes),
           "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)", shape);
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  const uint32_t align_val[4] = {p.align_a, p.align_b, p.align_d, p.align_d};  // C is D
  for (int i = 0; i < 4; ++i)
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align_val[i], sizeof align_val[i]),
             "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)", shape);
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
  int found = 0;
  check_lt(cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a_desc, p.b_desc, p.d_desc, p.d_desc, pref, count,
                                          results.data(), &found),
           "cublasLtMatmulAlgoGetHeuristic", shape);
  results.resize(static_cast<size_t>(std::max(found, 0)));
  if (results.empty() || results[0].state != CUBLAS_STATUS_SUCCESS)
    fail("cuBLASLt cublasLtMatmulAlgoGetHeuristic found no algorithm for {} (alignment A {} B {} D {} bytes)", shape,
         p.align_a, p.align_b, p.align_d);
  return results;
}

cublasStatus_t Matmul::launch(const Problem& p, const cublasLtMatmulAlgo_t& algo, const __nv_bfloat16* A,
                              const __nv_bfloat16* B, float beta, void* D, cudaStream_t stream) {
  const float alpha = 1.0f;
  return cublasLtMatmul(handle_, p.op, &alpha, A, p.a_desc, B, p.b_desc, &beta, D, p.d_desc, D, p.d_desc, &algo,
                        workspace_, workspace_bytes_, stream);
}

void Matmul::run(const Problem& p, const cublasLtMatmulAlgo_t& algo, const __nv_bfloat16* A, const __nv_bfloat16* B,
                 float beta, void* D, cudaStream_t stream) {
  check_lt(launch(p, algo, A, B, beta, D, stream), "cublasLtMatmul", p.shape);
  if (sync_after_launch()) {  // KVS_CUDA_SYNC=1: a fault inside the GEMM is reported here, with its shape
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) fail("cuBLASLt cublasLtMatmul {} failed while running (KVS_CUDA_SYNC=1): {}", p.shape,
                                 cudaGetErrorString(err));
  }
}

void Matmul::gemm(bool trans_a, bool trans_b, int m, int n, int k, const __nv_bfloat16* A, int lda,
                  const __nv_bfloat16* B, int ldb, float beta, void* D, int ldd, bool d_fp32, cudaStream_t stream) {
  Problem p;
  name_gemm(p.shape, sizeof p.shape, trans_a, trans_b, m, n, k, lda, ldb, ldd, d_fp32);
  if (!nonempty(p.shape, m, n, k, beta, D, ldd, d_fp32, stream)) return;
  describe(p, trans_a, trans_b, m, n, k, A, lda, B, ldb, D, ldd, d_fp32);
  // The algorithm, cached per shape and alignment (16 bytes and more count as 16).
  const Key key{trans_a, trans_b, m, n, k, lda, ldb, ldd, d_fp32, p.align_a, p.align_b, p.align_d};
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    it = algos_.emplace(key, heuristics(p, 1)[0]).first;
    if (timed_) untimed_.emplace_back(key, beta);  // timed by the next time_new_shapes()
  }
  run(p, it->second.algo, A, B, beta, D, stream);
}

std::vector<Matmul::AlgoTime> Matmul::time_algorithms(bool trans_a, bool trans_b, int m, int n, int k,
                                                      const __nv_bfloat16* A, int lda, const __nv_bfloat16* B,
                                                      int ldb, float beta, void* D, int ldd, bool d_fp32,
                                                      int max_algos, int reps, cudaStream_t stream) {
  Problem p;
  name_gemm(p.shape, sizeof p.shape, trans_a, trans_b, m, n, k, lda, ldb, ldd, d_fp32);
  if (m <= 0 || n <= 0 || k <= 0 || ldd < m) fail("cuBLASLt: time_algorithms needs a nonempty problem, got {}", p.shape);
  KVS_CHECK(max_algos >= 1 && reps >= 1, "cuBLASLt: time_algorithms needs max_algos and reps >= 1");
  describe(p, trans_a, trans_b, m, n, k, A, lda, B, ldb, D, ldd, d_fp32);
  return time_results(p, heuristics(p, max_algos), A, B, beta, D, reps, stream);
}

std::vector<Matmul::AlgoTime> Matmul::time_results(const Problem& p,
                                                   const std::vector<cublasLtMatmulHeuristicResult_t>& results,
                                                   const __nv_bfloat16* A, const __nv_bfloat16* B, float beta,
                                                   void* D, int reps, cudaStream_t stream) {
  std::vector<AlgoTime> out;
  struct Events {  // destroyed on every way out
    cudaEvent_t e[2] = {nullptr, nullptr};
    ~Events() {
      for (cudaEvent_t x : e)
        if (x) cudaEventDestroy(x);
    }
  } ev;
  for (cudaEvent_t& e : ev.e)
    if (cudaEventCreate(&e) != cudaSuccess) fail("cudaEventCreate failed while timing {}", p.shape);
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].state != CUBLAS_STATUS_SUCCESS) continue;
    // A candidate the heuristic offered that cuBLASLt then refuses to run is
    // left out, not an error: the timing only chooses among what runs.
    if (launch(p, results[r].algo, A, B, beta, D, stream) != CUBLAS_STATUS_SUCCESS) continue;  // untimed: set-up
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      float t = 0.0f;
      if (cudaEventRecord(ev.e[0], stream) != cudaSuccess) fail("cuBLASLt: timing {} failed", p.shape);
      if (launch(p, results[r].algo, A, B, beta, D, stream) != CUBLAS_STATUS_SUCCESS) break;
      if (cudaEventRecord(ev.e[1], stream) != cudaSuccess || cudaEventSynchronize(ev.e[1]) != cudaSuccess ||
          cudaEventElapsedTime(&t, ev.e[0], ev.e[1]) != cudaSuccess)
        fail("cuBLASLt: timing {} failed", p.shape);
      ms.push_back(t);
    }
    if (ms.size() != static_cast<size_t>(reps)) continue;
    std::sort(ms.begin(), ms.end());
    out.push_back({static_cast<int>(r), ms[ms.size() / 2]});
  }
  return out;
}

Matmul::TimingReport Matmul::time_new_shapes(int max_algos, int reps) {
  TimingReport report;
  if (untimed_.empty()) return report;
  KVS_CHECK(max_algos >= 1 && reps >= 1, "cuBLASLt: time_new_shapes needs max_algos and reps >= 1");
  // One scratch buffer holds the largest A, B and D of the shapes (stored
  // column-major: ld x (cols - 1) + rows elements), each part 256-byte aligned.
  auto stored = [](int rows, int cols, int ld) { return size_t(ld) * size_t(cols - 1) + size_t(rows); };
  auto round256 = [](size_t n) { return (n + 255) / 256 * 256; };
  size_t a_bytes = 0, b_bytes = 0, d_bytes = 0;
  for (const auto& [key, beta] : untimed_) {
    const auto& [ta, tb, m, n, k, lda, ldb, ldd, fp32, al_a, al_b, al_d] = key;
    a_bytes = std::max(a_bytes, stored(ta ? k : m, ta ? m : k, lda) * sizeof(__nv_bfloat16));
    b_bytes = std::max(b_bytes, stored(tb ? n : k, tb ? k : n, ldb) * sizeof(__nv_bfloat16));
    d_bytes = std::max(d_bytes, stored(m, n, ldd) * (fp32 ? sizeof(float) : sizeof(__nv_bfloat16)));
  }
  // 256 more bytes per part: a pointer is placed at its shape's alignment.
  const size_t a_at = 0, b_at = round256(a_bytes) + 256, d_at = b_at + round256(b_bytes) + 256;
  const size_t total = d_at + round256(d_bytes) + 256;
  struct Scratch {  // the stream and buffer, released on every way out
    cudaStream_t stream = nullptr;
    char* buf = nullptr;
    ~Scratch() {
      if (stream) cudaStreamSynchronize(stream);
      if (buf) cudaFree(buf);
      if (stream) cudaStreamDestroy(stream);
    }
  } scratch;
  if (cudaStreamCreateWithFlags(&scratch.stream, cudaStreamNonBlocking) != cudaSuccess)
    fail("cudaStreamCreate failed while timing GEMM algorithms");
  cudaStream_t stream = scratch.stream;
  if (const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&scratch.buf), total); e != cudaSuccess) {
    cudaGetLastError();  // clear it: the run goes on with the heuristic's first
    report.skipped = fmt::format("{} GEMM shapes kept the heuristic's first algorithm: no {:.0f} MiB of GPU memory "
                                 "to time them in ({})",
                                 untimed_.size(), total / 1048576.0, cudaGetErrorString(e));
    untimed_.clear();
    return report;
  }
  char* buf = scratch.buf;
  // Inputs of 0.0115 (bf16 0x3c3c): the values do not change which algorithm is fastest.
  if (cudaMemsetAsync(buf, 0x3c, d_at, stream) != cudaSuccess ||
      cudaMemsetAsync(buf + d_at, 0, total - d_at, stream) != cudaSuccess)
    fail("cudaMemsetAsync failed while timing GEMM algorithms");
  // Alignment al (a power of two, 16 meaning 16 or more): base + al is aligned to exactly al below 16.
  auto place = [buf](size_t at, uint32_t al) { return buf + at + (al < kCachedAlignment ? al : 0); };
  for (const auto& [key, beta] : untimed_) {
    const auto& [ta, tb, m, n, k, lda, ldb, ldd, fp32, al_a, al_b, al_d] = key;
    const auto* A = reinterpret_cast<const __nv_bfloat16*>(place(a_at, al_a));
    const auto* B = reinterpret_cast<const __nv_bfloat16*>(place(b_at, al_b));
    void* D = place(d_at, al_d);
    Problem p;
    name_gemm(p.shape, sizeof p.shape, ta, tb, m, n, k, lda, ldb, ldd, fp32);
    describe(p, ta, tb, m, n, k, A, lda, B, ldb, D, ldd, fp32);
    KVS_CHECK(p.align_a == al_a && p.align_b == al_b && p.align_d == al_d,
              "cuBLASLt: the scratch operands of {} do not have its alignments", p.shape);
    const auto results = heuristics(p, max_algos);
    const auto times = time_results(p, results, A, B, beta, D, reps, stream);
    if (times.empty()) continue;  // nothing ran: the first algorithm stays
    const AlgoTime* best = &times[0];
    for (const AlgoTime& t : times)
      if (t.ms < best->ms) best = &t;
    algos_[key] = results[static_cast<size_t>(best->rank)];
    report.chosen.push_back({p.shape, static_cast<int>(times.size()), best->rank,
                             times[0].rank == 0 ? times[0].ms : 0.0, best->ms});
  }
  untimed_.clear();
  return report;
}

}  // namespace kvs::cuda
