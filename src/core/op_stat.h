// What the two engines' per-op profiles (`kvshift bench --profile`) share:
// the CPU engine's wall-clock scopes (kernels/cpu/op_profile.h) and the CUDA
// engine's GPU-event marks (kernels/cuda/kernel_profile.h) both sum into an
// OpTable, and both name a GEMM by the projection it belongs to, its pass and
// its shape, so that their tables read the same.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

namespace kvs::profile {

struct OpStat {
  std::string name;
  double seconds = 0, flops = 0;
  long calls = 0;
  int threads = 0;  // CPU: the threads the op ran on (its share of the peak); 0: the whole device
};

// Sums per op name, in the order of each name's first call.
class OpTable {
 public:
  void add(const std::string& name, double seconds, double flops, int threads = 0) {
    auto [it, fresh] = index_.try_emplace(name, rows_.size());
    if (fresh) rows_.push_back({name, 0, 0, 0, threads});
    OpStat& s = rows_[it->second];
    s.seconds += seconds;
    s.flops += flops;
    ++s.calls;
  }
  // Every row so far; then the table is empty.
  std::vector<OpStat> take() {
    std::vector<OpStat> out;
    out.swap(rows_);
    index_.clear();
    return out;
  }

 private:
  std::vector<OpStat> rows_;
  std::unordered_map<std::string, size_t> index_;
};

// The projection the next GEMMs belong to ("qkv proj", "lm head", ...): set
// by the engines around their linear layers, per thread (the CPU engine's
// thread replicas issue theirs at once).
inline thread_local const char* g_gemm_label = nullptr;

class GemmLabel {
 public:
  explicit GemmLabel(const char* label) : prev_(g_gemm_label) { g_gemm_label = label; }
  ~GemmLabel() { g_gemm_label = prev_; }
  GemmLabel(const GemmLabel&) = delete;
  GemmLabel& operator=(const GemmLabel&) = delete;

 private:
  const char* prev_;
};

// "<label> <pass> MxNxK" of a GEMM out[M, N] (+)= A[M, K] B[K, N]; pass is
// "fwd", "bwd dinp" or "bwd dW" (bench's table finds the GEMMs by them).
inline std::string gemm_name(const char* pass, long M, long N, long K) {
  return std::string(g_gemm_label ? g_gemm_label : "gemm") + " " + pass + " " + std::to_string(M) + "x" +
         std::to_string(N) + "x" + std::to_string(K);
}

}  // namespace kvs::profile
