// cuDNN fused SDPA through the backend graph API: see cudnn_sdpa.h for the
// graphs, the layout mapping and the plan cache. Host code only (no kernels);
// compiled into kvs_cuda. Without -DKVS_CUDNN only the refusing constructor
// is built.
#include "kernels/cuda/cudnn_sdpa.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"

#ifdef KVS_CUDNN
#include <cudnn.h>
#endif

namespace kvs::cuda {

#ifndef KVS_CUDNN

struct CudnnSdpa::Impl {};
struct CudnnSdpa::Plans {};

CudnnSdpa::CudnnSdpa(int, int, int, int, int, int, int, bool) {
  fail("attention backend \"cudnn\": this build has no cuDNN (configure with cuDNN 9 installed: cudnn_graph.h and "
       "libcudnn where CMake looks, see docs/CUDA.md)");
}
CudnnSdpa::~CudnnSdpa() = default;
void CudnnSdpa::check_graphs(int, int, int, int, int, int, int, bool) {
  fail("attention backend \"cudnn\": this build has no cuDNN");
}
void CudnnSdpa::forward(bf16*, float*, const bf16*, int, const bf16*, const bf16*, int, int, int, int, int, int,
                        cudaStream_t) {
  fail("attention backend \"cudnn\": this build has no cuDNN");
}
void CudnnSdpa::backward(bf16*, bf16*, bf16*, const bf16*, const bf16*, const float*, const bf16*, int, const bf16*,
                         const bf16*, int, int, int, int, int, int, float*, cudaStream_t) {
  fail("attention backend \"cudnn\": this build has no cuDNN");
}

#else  // KVS_CUDNN

namespace {

using Desc = cudnnBackendDescriptor_t;

// One line: cuDNN's last error message can span lines.
std::string last_cudnn_message() {
  char buf[1024] = {0};
  cudnnGetLastErrorString(buf, sizeof buf);
  std::string s(buf);
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

[[noreturn]] void cudnn_fail(const std::string& call, cudnnStatus_t s) {
  const std::string last = last_cudnn_message();
  fail("cuDNN SDPA: {} failed: {}{}", call, cudnnGetErrorString(s), last.empty() ? "" : " (" + last + ")");
}

void ck(cudnnStatus_t s, const std::string& call) {
  if (s != CUDNN_STATUS_SUCCESS) cudnn_fail(call, s);
}

void ck_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) fail("cuDNN SDPA: {} failed: {}", call, cudaGetErrorString(e));
}

using Dims = std::array<int64_t, 4>;

// The descriptors of one operation graph and its plan, destroyed together.
// Every backend call is checked and names itself (and the graph) on failure.
class Graph {
 public:
  Graph(cudnnHandle_t h, const char* name) : h_(h), name_(name) {}
  ~Graph() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  Desc create(cudnnBackendDescriptorType_t type, const char* what) {
    Desc d = nullptr;
    ck(cudnnBackendCreateDescriptor(type, &d), where("cudnnBackendCreateDescriptor", what));
    owned_.push_back(d);
    return d;
  }
  void set(Desc d, cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, int64_t n, const void* v,
           const char* what) {
    ck(cudnnBackendSetAttribute(d, attr, type, n, v), where("cudnnBackendSetAttribute", what));
  }
  void finalize(Desc d, const char* what) { ck(cudnnBackendFinalize(d), where("cudnnBackendFinalize", what)); }

  // A tensor: uid < 0 takes the next virtual uid.
  Desc tensor(int64_t uid, cudnnDataType_t dt, const Dims& dims, const Dims& strides, bool is_virtual,
              bool by_value = false, bool reorder_f16x16 = false) {
    if (uid < 0) uid = next_virtual_uid_++;
    Desc t = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    const int64_t align = 16;
    const bool virt = is_virtual, byval = by_value;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dimensions");
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides");
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor is_virtual");
    if (byval) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval, "tensor is_by_value");
    if (reorder_f16x16) {
      const cudnnBackendTensorReordering_t r = CUDNN_TENSOR_REORDERING_F16x16;
      set(t, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &r, "tensor reordering");
    }
    finalize(t, "tensor");
    return t;
  }
  Desc virt(cudnnDataType_t dt, const Dims& dims, const Dims& strides) {
    return tensor(-1, dt, dims, strides, true);
  }
  // A by-value fp32 scalar [1, 1, 1, 1]; its host value is bound at execution.
  Desc scalar(int64_t uid) { return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }

  // y = mode(x[, b[, t]]): b is the second operand, t the BINARY_SELECT condition.
  void pointwise(cudnnPointwiseMode_t mode, Desc x, Desc b, Desc y, Desc t = nullptr,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Desc pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    finalize(pw, "pointwise");
    Desc op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, "pointwise op");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise x");
    if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "pointwise b");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise y");
    if (t) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pointwise t");
    finalize(op, "pointwise operation");
    ops_.push_back(op);
  }
  // c = a b over the last two dimensions, batched (and broadcast) over the first two.
  void matmul(Desc a, Desc b, Desc c) {
    Desc mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul compute type");
    finalize(mm, "matmul");
    Desc op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul a");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "matmul b");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul c");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, "matmul desc");
    finalize(op, "matmul operation");
    ops_.push_back(op);
  }
  // y = reduce(x) over the dimensions where y has extent 1 (or fewer heads: a GQA group sum).
  void reduction(cudnnReduceTensorOp_t mode, Desc x, Desc y) {
    Desc r = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction operator");
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction compute type");
    finalize(r, "reduction");
    Desc op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reduction x");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reduction y");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r, "reduction desc");
    finalize(op, "reduction operation");
    ops_.push_back(op);
  }
  // y = x seen with other dims/strides (a transpose of the last two dimensions here).
  void reshape(Desc x, Desc y) {
    Desc op = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reshape x");
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reshape y");
    finalize(op, "reshape operation");
    ops_.push_back(op);
  }

  // The operation graph, then the first engine configuration (heuristics mode
  // A, then FALLBACK) whose execution plan finalizes. Sets workspace bytes.
  Desc build_plan(int64_t* workspace) {
    Desc graph = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
        ops_.data(), "operation graph ops");
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h_, "operation graph handle");
    finalize(graph, "operation graph");
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    std::string last_msg;
    int tried = 0;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Desc heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
      set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph, "heuristics graph");
      set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
      if ((last = cudnnBackendFinalize(heur)) != CUDNN_STATUS_SUCCESS) {
        last_msg = last_cudnn_message();
        continue;
      }
      int64_t count = 0;
      ck(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                  nullptr),
         where("cudnnBackendGetAttribute", "heuristics result count"));
      if (count <= 0) continue;
      std::vector<Desc> cfgs(static_cast<size_t>(count));
      for (auto& c : cfgs) c = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
      int64_t got = 0;
      ck(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                  cfgs.data()),
         where("cudnnBackendGetAttribute", "heuristics results"));
      for (int64_t i = 0; i < got; ++i) {
        Desc plan = nullptr;
        ck(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan),
           where("cudnnBackendCreateDescriptor", "execution plan"));
        cudnnStatus_t s = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h_);
        if (s == CUDNN_STATUS_SUCCESS)
          s = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                       &cfgs[static_cast<size_t>(i)]);
        if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(plan);
        ++tried;
        if (s != CUDNN_STATUS_SUCCESS) {
          last = s;
          last_msg = last_cudnn_message();
          cudnnBackendDestroyDescriptor(plan);
          continue;
        }
        owned_.push_back(plan);
        int64_t ws = 0, n = 0;
        ck(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws),
           where("cudnnBackendGetAttribute", "plan workspace size"));
        *workspace = ws;
        return plan;
      }
    }
    fail("cuDNN SDPA: no engine for the {} graph ({} configurations tried): {}{}", name_, tried,
         cudnnGetErrorString(last), last_msg.empty() ? "" : " (" + last_msg + ")");
  }

 private:
  std::string where(const char* call, const char* what) const {
    return std::string(call) + "(" + name_ + ": " + what + ")";
  }
  cudnnHandle_t h_;
  std::string name_;
  std::vector<Desc> owned_;
  std::vector<Desc> ops_;
  int64_t next_virtual_uid_ = 1000;
};

// Unique ids of the tensors bound at execution (the variant pack).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kLowest, kDO, kDQ, kDK, kDV, kOne, kDQAcc,
};

void execute(cudnnHandle_t h, Desc plan, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
             void* workspace, cudaStream_t stream, const char* what) {
  ck(cudnnSetStream(h, stream), std::string("cudnnSetStream(") + what + ")");
  Desc vp = nullptr;
  ck(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp),
     std::string("cudnnBackendCreateDescriptor(") + what + ": variant pack)");
  struct Guard {
    Desc d;
    ~Guard() { cudnnBackendDestroyDescriptor(d); }
  } guard{vp};
  ck(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                              static_cast<int64_t>(uids.size()), uids.data()),
     std::string("cudnnBackendSetAttribute(") + what + ": variant pack uids)");
  ck(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                              static_cast<int64_t>(ptrs.size()), ptrs.data()),
     std::string("cudnnBackendSetAttribute(") + what + ": variant pack pointers)");
  ck(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace),
     std::string("cudnnBackendSetAttribute(") + what + ": variant pack workspace)");
  ck(cudnnBackendFinalize(vp), std::string("cudnnBackendFinalize(") + what + ": variant pack)");
  ck(cudnnBackendExecute(h, plan, vp), std::string("cudnnBackendExecute(") + what + ")");
}

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

struct CudnnSdpa::Impl {
  cudnnHandle_t handle = nullptr;
};

struct CudnnSdpa::Plans {
  std::unique_ptr<Graph> fwd_graph, bwd_graph;
  Desc fwd = nullptr, bwd = nullptr;
  int64_t fwd_ws = 0, bwd_ws = 0;
  size_t dqacc_offset = 0, dqacc_bytes = 0;  // inside the workspace, after the backward plan's own
  size_t need = 0;                           // workspace bytes for this shape
  // Host values of the by-value scalars (their addresses go into the variant pack).
  float scale = 0, lowest = std::numeric_limits<float>::lowest(), one = 1.0f;
};

CudnnSdpa::CudnnSdpa(int max_B, int max_T, int Hq, int Hkv, int D, int ld_q, int ld_kv, bool deterministic)
    : max_B_(max_B), max_T_(max_T), Hq_(Hq), Hkv_(Hkv), D_(D), deterministic_(deterministic),
      impl_(std::make_unique<Impl>()) {
  KVS_CHECK(max_B >= 1 && max_T >= 1, "cuDNN SDPA: batch and sequence length must be positive");
  KVS_CHECK(Hq >= 1 && Hkv >= 1 && Hq % Hkv == 0,
            "cuDNN SDPA: query heads ({}) must be a positive multiple of KV heads ({})", Hq, Hkv);
  KVS_CHECK(D % 8 == 0 && D >= 8 && D <= 256, "cuDNN SDPA: head_dim {} must be a multiple of 8 in [8, 256]", D);
  ck(cudnnCreate(&impl_->handle), "cudnnCreate");
  const Plans& p = plans_for(max_B, max_T, ld_q, ld_kv);
  workspace_bytes_ = std::max<size_t>(p.need, 256);
  ck_cuda(cudaMalloc(&workspace_, workspace_bytes_), "cudaMalloc(workspace)");
}

CudnnSdpa::~CudnnSdpa() {
  plans_.clear();  // descriptors before the handle
  if (impl_ && impl_->handle) cudnnDestroy(impl_->handle);
  if (workspace_) cudaFree(workspace_);
}

void CudnnSdpa::check_shape(const char* what, int Hq, int Hkv, int D) const {
  KVS_CHECK(Hq == Hq_ && Hkv == Hkv_ && D == D_,
            "cuDNN SDPA {}: heads {}/{} and head_dim {} differ from the {}/{} and {} it was built for", what, Hq, Hkv,
            D, Hq_, Hkv_, D_);
}

namespace {

// Adds the forward and the backward graph's tensors and operations (each
// finalized: cuDNN checks every descriptor here, no GPU needed) for one shape
// to fwd and bwd. Returns the bytes of the fp32 dQ accumulator the backward
// binds (0 when deterministic).
size_t build_graphs(Graph& fwd, Graph& bwd, int B, int T, int Hq, int Hkv, int D, int ld_q, int ld_kv,
                    bool deterministic) {
  const int64_t b = B, hq = Hq, hk = Hkv, s = T, d = D, lq = ld_q, lk = ld_kv;
  size_t dqacc_bytes = 0;

  // Our buffers, described in place ([b, h, s, d] dims, our strides).
  const Dims q_dims{b, hq, s, d}, q_str{s * lq, d, lq, 1};
  const Dims kv_dims{b, hk, s, d}, kv_str{s * lk, d, lk, 1};
  const Dims kt_dims{b, hk, d, s}, kt_str{s * lk, d, 1, lk};  // K^T (and V^T): the same memory
  const Dims o_str{s * hq * d, d, hq * d, 1};                  // out / dout: [B, T, Hq, D] contiguous
  const Dims r_dims{b, hq, s, 1}, r_str{hq * s, s, 1, 1};      // per-row statistics = lse [B, Hq, T]
  const Dims s_dims{b, hq, s, s}, s_str{hq * s * s, s * s, s, 1};
  const Dims st_dims{b, hq, s, s}, st_str{hq * s * s, s * s, 1, s};  // S^T seen through a reshape
  const cudnnDataType_t BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT;

  // The causal mask on scores x: row >= col ? x : lowest (cudnn-frontend's form).
  auto causal = [&](Graph& g, Desc x, Desc lowest) {
    Desc row = g.virt(CUDNN_DATA_INT32, s_dims, s_str), col = g.virt(CUDNN_DATA_INT32, s_dims, s_str);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, row, nullptr, CUDNN_DATA_INT32, 2);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, col, nullptr, CUDNN_DATA_INT32, 3);
    Desc keep = g.virt(CUDNN_DATA_BOOLEAN, s_dims, s_str);
    g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, nullptr, CUDNN_DATA_BOOLEAN);
    Desc y = g.virt(F, s_dims, s_str);
    g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, lowest, y, keep);
    return y;
  };

  {  // ---------------------------------------------------------------- forward
    Graph& g = fwd;
    Desc Q = g.tensor(kQ, BF, q_dims, q_str, false);
    Desc KT = g.tensor(kK, BF, kt_dims, kt_str, false);
    Desc V = g.tensor(kV, BF, kv_dims, kv_str, false);
    Desc O = g.tensor(kO, BF, q_dims, o_str, false);
    Desc stats = g.tensor(kStats, F, r_dims, r_str, false);
    Desc scale = g.scalar(kScale), lowest = g.scalar(kLowest);
    Desc s0 = g.virt(F, s_dims, s_str), s1 = g.virt(F, s_dims, s_str);
    g.matmul(Q, KT, s0);
    g.pointwise(CUDNN_POINTWISE_MUL, s0, scale, s1);
    Desc s2 = causal(g, s1, lowest);
    Desc m = g.virt(F, r_dims, r_str), l = g.virt(F, r_dims, r_str), logl = g.virt(F, r_dims, r_str);
    Desc s3 = g.virt(F, s_dims, s_str), e = g.virt(F, s_dims, s_str);
    g.reduction(CUDNN_REDUCE_TENSOR_MAX, s2, m);
    g.pointwise(CUDNN_POINTWISE_SUB, s2, m, s3);
    g.pointwise(CUDNN_POINTWISE_EXP, s3, nullptr, e);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, l);
    g.pointwise(CUDNN_POINTWISE_LOG, l, nullptr, logl);
    g.pointwise(CUDNN_POINTWISE_ADD, m, logl, stats);
    Desc P = g.virt(BF, s_dims, s_str);  // the second matmul takes P in the I/O type
    g.pointwise(CUDNN_POINTWISE_DIV, e, l, P);
    g.matmul(P, V, O);
  }

  {  // ---------------------------------------------------------------- backward
    Graph& g = bwd;
    Desc Q = g.tensor(kQ, BF, q_dims, q_str, false);
    Desc KT = g.tensor(kK, BF, kt_dims, kt_str, false);
    Desc VT = g.tensor(kV, BF, kt_dims, kt_str, false);
    Desc O = g.tensor(kO, BF, q_dims, o_str, false);
    Desc dO = g.tensor(kDO, BF, q_dims, o_str, false);
    Desc stats = g.tensor(kStats, F, r_dims, r_str, false);
    Desc dQ = g.tensor(kDQ, BF, q_dims, q_str, false);
    Desc dK = g.tensor(kDK, BF, kv_dims, kv_str, false);
    Desc dV = g.tensor(kDV, BF, kv_dims, kv_str, false);
    Desc scale = g.scalar(kScale), lowest = g.scalar(kLowest), one = g.scalar(kOne);
    // delta = rowsum(dO * O)
    Desc t0 = g.virt(F, q_dims, o_str), t1 = g.virt(F, r_dims, r_str), delta = g.virt(F, r_dims, r_str);
    g.pointwise(CUDNN_POINTWISE_MUL, dO, O, t0);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, t0, t1);
    g.pointwise(CUDNN_POINTWISE_MUL, t1, one, delta);
    // P = exp(mask(scale Q K^T) - stats)
    Desc s0 = g.virt(F, s_dims, s_str), s1 = g.virt(F, s_dims, s_str);
    g.matmul(Q, KT, s0);
    g.pointwise(CUDNN_POINTWISE_MUL, s0, scale, s1);
    Desc s2 = causal(g, s1, lowest);
    Desc s3 = g.virt(F, s_dims, s_str), P = g.virt(F, s_dims, s_str);
    g.pointwise(CUDNN_POINTWISE_SUB, s2, stats, s3);
    g.pointwise(CUDNN_POINTWISE_EXP, s3, nullptr, P);
    // dV = P^T dO (summed over the group for GQA)
    Desc PT = g.virt(BF, st_dims, st_str);
    g.reshape(P, PT);
    const Dims full_dims{b, hq, s, d}, full_str{hq * s * d, s * d, d, 1};  // per-query-head dK/dV, dQ accumulator
    if (hq == hk) {
      g.matmul(PT, dO, dV);
    } else {
      Desc dv_full = g.virt(BF, full_dims, full_str);
      g.matmul(PT, dO, dv_full);
      g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_full, dV);
    }
    // dS = P * (dO V^T - delta) * scale
    Desc dp0 = g.virt(F, s_dims, s_str), dp1 = g.virt(F, s_dims, s_str), dp2 = g.virt(F, s_dims, s_str);
    Desc dp3 = g.virt(F, s_dims, s_str), dS = g.virt(F, s_dims, s_str);
    g.matmul(dO, VT, dp0);
    g.pointwise(CUDNN_POINTWISE_MUL, dp0, one, dp1);
    g.pointwise(CUDNN_POINTWISE_SUB, dp1, delta, dp2);
    g.pointwise(CUDNN_POINTWISE_MUL, dp2, P, dp3);
    g.pointwise(CUDNN_POINTWISE_MUL, dp3, scale, dS);
    // dK = dS^T Q (summed over the group for GQA)
    Desc dST = g.virt(BF, st_dims, st_str);
    g.reshape(dS, dST);
    if (hq == hk) {
      g.matmul(dST, Q, dK);
    } else {
      Desc dk_full = g.virt(BF, full_dims, full_str);
      g.matmul(dST, Q, dk_full);
      g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_full, dK);
    }
    // dQ = dS K: K is K^T reshaped back (a virtual tensor: the intermediate
    // type fp32, as cudnn-frontend declares it); through an fp32 accumulator
    // unless deterministic.
    Desc K = g.virt(F, kv_dims, kv_str);
    g.reshape(KT, K);
    if (deterministic) {
      g.matmul(dS, K, dQ);
    } else {
      Desc acc = g.tensor(kDQAcc, F, full_dims, full_str, false, false, true);
      g.matmul(dS, K, acc);
      g.pointwise(CUDNN_POINTWISE_IDENTITY, acc, nullptr, dQ);
      dqacc_bytes = static_cast<size_t>(b * hq * s * d) * sizeof(float);
    }
  }
  return dqacc_bytes;
}

}  // namespace

void CudnnSdpa::check_graphs(int B, int T, int Hq, int Hkv, int D, int ld_q, int ld_kv, bool deterministic) {
  Graph fwd(nullptr, "forward"), bwd(nullptr, "backward");
  build_graphs(fwd, bwd, B, T, Hq, Hkv, D, ld_q, ld_kv, deterministic);
}

CudnnSdpa::Plans& CudnnSdpa::plans_for(int B, int T, int ld_q, int ld_kv) {
  const auto key = std::make_tuple(B, T, ld_q, ld_kv);
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  KVS_CHECK(ld_q >= Hq_ * D_ && ld_q % 8 == 0 && ld_kv >= Hkv_ * D_ && ld_kv % 8 == 0,
            "cuDNN SDPA: row strides ld_q={} / ld_kv={} must cover the heads ({} / {}) and be multiples of 8", ld_q,
            ld_kv, Hq_ * D_, Hkv_ * D_);
  auto p = std::make_unique<Plans>();
  p->scale = 1.0f / std::sqrt(static_cast<float>(D_));
  p->fwd_graph = std::make_unique<Graph>(impl_->handle, "forward");
  p->bwd_graph = std::make_unique<Graph>(impl_->handle, "backward");
  p->dqacc_bytes = build_graphs(*p->fwd_graph, *p->bwd_graph, B, T, Hq_, Hkv_, D_, ld_q, ld_kv, deterministic_);
  p->fwd = p->fwd_graph->build_plan(&p->fwd_ws);
  p->bwd = p->bwd_graph->build_plan(&p->bwd_ws);
  p->dqacc_offset = align256(static_cast<size_t>(p->bwd_ws));
  p->need = std::max(static_cast<size_t>(p->fwd_ws), p->dqacc_offset + p->dqacc_bytes);
  Plans& ref = *p;
  plans_.emplace(key, std::move(p));
  return ref;
}

namespace {
void check_pointers(const char* what, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    KVS_CHECK(p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 == 0,
              "cuDNN SDPA {}: every tensor must be non-null and 16-byte aligned", what);
}
}  // namespace

void CudnnSdpa::forward(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv,
                        int B, int T, int Hq, int Hkv, int D, cudaStream_t stream) {
  check_shape("forward", Hq, Hkv, D);
  check_pointers("forward", {out, lse, q, k, v});
  if (B == 0 || T == 0) return;
  Plans& p = plans_for(B, T, ld_q, ld_kv);
  KVS_CHECK(p.need <= workspace_bytes_,
            "cuDNN SDPA: shape {} x {} needs {} bytes of workspace, more than the {} allocated for {} x {}", B, T,
            p.need, workspace_bytes_, max_B_, max_T_);
  execute(impl_->handle, p.fwd, {kQ, kK, kV, kO, kStats, kScale, kLowest},
          {const_cast<bf16*>(q), const_cast<bf16*>(k), const_cast<bf16*>(v), out, lse, &p.scale, &p.lowest},
          workspace_, stream, "forward");
}

void CudnnSdpa::backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                         const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq,
                         int Hkv, int D, float* /*scratch*/, cudaStream_t stream) {
  check_shape("backward", Hq, Hkv, D);
  check_pointers("backward", {dq, dk, dv, dout, out, lse, q, k, v});
  if (B == 0 || T == 0) return;
  Plans& p = plans_for(B, T, ld_q, ld_kv);
  KVS_CHECK(p.need <= workspace_bytes_,
            "cuDNN SDPA: shape {} x {} needs {} bytes of workspace, more than the {} allocated for {} x {}", B, T,
            p.need, workspace_bytes_, max_B_, max_T_);
  std::vector<int64_t> uids{kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kLowest, kOne};
  std::vector<void*> ptrs{const_cast<bf16*>(q),   const_cast<bf16*>(k), const_cast<bf16*>(v),
                          const_cast<bf16*>(out), const_cast<bf16*>(dout), const_cast<float*>(lse),
                          dq,                     dk,                   dv,
                          &p.scale,               &p.lowest,            &p.one};
  if (p.dqacc_bytes) {
    // The accumulator must start at zero (cudnn-frontend memsets it too).
    char* acc = static_cast<char*>(workspace_) + p.dqacc_offset;
    ck_cuda(cudaMemsetAsync(acc, 0, p.dqacc_bytes, stream), "cudaMemsetAsync(dQ accumulator)");
    uids.push_back(kDQAcc);
    ptrs.push_back(acc);
  }
  execute(impl_->handle, p.bwd, uids, ptrs, workspace_, stream, "backward");
}

#endif  // KVS_CUDNN

}  // namespace kvs::cuda
