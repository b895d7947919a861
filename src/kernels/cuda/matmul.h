// Matmuls through cuBLASLt: bf16 inputs, fp32 accumulation, bf16 activations
// out, fp32 weight gradients accumulated in place. Row-major like the rest of
// the code (weights [out, in], y = x W^T); the wrapper maps that onto
// cuBLASLt's column-major view. One handle and one workspace, allocated in the
// constructor (nothing is allocated per call); algorithm choices are cached
// per shape so the heuristic query runs once per shape, not per step.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace kvs::cuda {

class Matmul {
 public:
  explicit Matmul(size_t workspace_bytes = size_t{32} << 20);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // out[N, OC] (row stride ld_out) = inp[N, C] (row stride ld_in) @ W[OC, C]^T.
  void forward(__nv_bfloat16* out, int ld_out, const __nv_bfloat16* inp, int ld_in, const __nv_bfloat16* W, int N,
               int C, int OC, cudaStream_t stream);
  // dinp[N, C] (contiguous) = dout[N, OC] (row stride ld_dout) @ W[OC, C]   (overwritten).
  void backward_input(__nv_bfloat16* dinp, const __nv_bfloat16* dout, int ld_dout, const __nv_bfloat16* W, int N,
                      int C, int OC, cudaStream_t stream);
  // dW[OC, C] (fp32) += dout[N, OC]^T (row stride ld_dout) @ inp[N, C] (row stride ld_in).
  void backward_weight(float* dW, const __nv_bfloat16* dout, int ld_dout, const __nv_bfloat16* inp, int ld_in, int N,
                       int C, int OC, cudaStream_t stream);

  // One column-major GEMM D = alpha op(A) op(B) + beta C with C == D
  // (cuBLASLt's terms): A, B bf16; D bf16 or fp32 (d_fp32). Public for tests.
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, const __nv_bfloat16* A, int lda, const __nv_bfloat16* B,
            int ldb, float beta, void* D, int ldd, bool d_fp32, cudaStream_t stream);

  // `bench-gemm`: gemm()'s problem run with each of the heuristic's first
  // `max_algos` algorithms (gemm() runs rank 0), each timed with CUDA events
  // as the median of `reps` runs after one untimed run. D is overwritten
  // (beta as given, so an accumulating D grows). Waits for the stream.
  struct AlgoTime {
    int rank;   // the heuristic's order
    double ms;  // median
  };
  std::vector<AlgoTime> time_algorithms(bool trans_a, bool trans_b, int m, int n, int k, const __nv_bfloat16* A,
                                        int lda, const __nv_bfloat16* B, int ldb, float beta, void* D, int ldd,
                                        bool d_fp32, int max_algos, int reps, cudaStream_t stream);

  // train.time_gemm_algorithms. On: every shape gemm() meets runs the
  // heuristic's first algorithm as before and is remembered; then
  // time_new_shapes(), called when no GEMM of this Matmul is in flight (they
  // share its workspace) and nothing in flight waits for another process,
  // times the heuristic's first `max_algos` algorithms for each remembered
  // shape on scratch operands of its own (the same dimensions, leading
  // dimensions, alignments and beta; on a stream of its own, so the callers'
  // buffers are not touched) and keeps the fastest for every later call.
  // Which is fastest depends on the timing, so two runs may choose
  // differently and sum in a different order.
  void set_timed_algorithms(bool on) { timed_ = on; }
  struct TimedChoice {
    std::string shape;              // the GEMM, as error messages name it
    int candidates = 0, rank = 0;   // algorithms timed; the chosen one's place in the heuristic's order
    double first_ms = 0, best_ms = 0;  // medians of the heuristic's first and of the chosen one
  };
  // Times the shapes met since the last call (none: returns at once). Scratch
  // it cannot allocate leaves those shapes on the heuristic's first and says so
  // in the result. `reps` timed runs each after one untimed.
  struct TimingReport {
    std::vector<TimedChoice> chosen;  // this call's shapes
    std::string skipped;              // why shapes were left on the heuristic's first ("" if none)
  };
  TimingReport time_new_shapes(int max_algos = 8, int reps = 5);
  bool has_new_shapes() const { return !untimed_.empty(); }

 private:
  struct Problem;
  void describe(Problem& p, bool trans_a, bool trans_b, int m, int n, int k, const __nv_bfloat16* A, int lda,
                const __nv_bfloat16* B, int ldb, const void* D, int ldd, bool d_fp32);
  std::vector<cublasLtMatmulHeuristicResult_t> heuristics(const Problem& p, int count);
  // One cublasLtMatmul; run() fails on its error, the timing skips the candidate.
  cublasStatus_t launch(const Problem& p, const cublasLtMatmulAlgo_t& algo, const __nv_bfloat16* A,
                        const __nv_bfloat16* B, float beta, void* D, cudaStream_t stream);
  void run(const Problem& p, const cublasLtMatmulAlgo_t& algo, const __nv_bfloat16* A, const __nv_bfloat16* B,
           float beta, void* D, cudaStream_t stream);
  // Each successful result's median of `reps` timed runs (after one untimed), in the results' order.
  std::vector<AlgoTime> time_results(const Problem& p, const std::vector<cublasLtMatmulHeuristicResult_t>& results,
                                     const __nv_bfloat16* A, const __nv_bfloat16* B, float beta, void* D, int reps,
                                     cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  // (trans_a, trans_b, m, n, k, lda, ldb, ldd, d_fp32, alignment of A, B, D in
  // bytes capped at 16) -> heuristic result
  using Key = std::tuple<bool, bool, int, int, int, int, int, int, bool, uint32_t, uint32_t, uint32_t>;
  std::map<Key, cublasLtMatmulHeuristicResult_t> algos_;
  // set_timed_algorithms: shapes met and not yet timed (with the beta of their first call).
  bool timed_ = false;
  std::vector<std::pair<Key, float>> untimed_;
};

}  // namespace kvs::cuda
