// cuDNN fused SDPA through the cuDNN frontend's graph API: see cudnn_sdpa.h
// for the layout mapping and the plan cache. Host code only (no kernels);
// compiled into kvs_cuda. Without -DKVS_CUDNN only the refusing constructor
// is built.
#include "kernels/cuda/cudnn_sdpa.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <iterator>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/kernel_profile.h"

#ifdef KVS_CUDNN
#include <cudnn_frontend.h>
#endif

namespace kvs::cuda {

#ifndef KVS_CUDNN

struct CudnnSdpa::Impl {};
struct CudnnSdpa::Plans {};

CudnnSdpa::CudnnSdpa(int, int, int, int, int, int, int, bool) {
  fail("attention backend \"cudnn\": this build has no cuDNN (configure with cuDNN 9 and the cuDNN frontend's "
       "headers where CMake looks, see docs/CUDA.md)");
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

namespace fe = cudnn_frontend;
using GraphPtr = std::shared_ptr<fe::graph::Graph>;

namespace {

// Unique ids of the tensors bound at execution (the variant packs).
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

const char* code_name(fe::error_code_t c) {
  static const char* const names[] = {"OK",
                                      "ATTRIBUTE_NOT_SET",
                                      "SHAPE_DEDUCTION_FAILED",
                                      "INVALID_TENSOR_NAME",
                                      "INVALID_VARIANT_PACK",
                                      "GRAPH_NOT_SUPPORTED",
                                      "GRAPH_EXECUTION_PLAN_CREATION_FAILED",
                                      "GRAPH_EXECUTION_FAILED",
                                      "HEURISTIC_QUERY_FAILED",
                                      "UNSUPPORTED_GRAPH_FORMAT",
                                      "CUDA_API_FAILED",
                                      "CUDNN_BACKEND_API_FAILED",
                                      "INVALID_CUDA_DEVICE",
                                      "HANDLE_ERROR",
                                      "INVALID_VALUE",
                                      "NVRTC_COMPILATION_FAILED"};
  const auto i = static_cast<size_t>(c);
  return i < std::size(names) ? names[i] : "UNKNOWN";
}

// The frontend's messages embed cuDNN's status and last error text, which can span lines.
std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

void check(fe::error_t e, const char* graph, const char* step) {
  if (e.is_bad()) fail("cuDNN SDPA {} graph: {} failed: {}: {}", graph, step, code_name(e.code), one_line(e.err_msg));
}

void ck_cudnn(cudnnStatus_t s, const char* call) {
  if (s != CUDNN_STATUS_SUCCESS) fail("cuDNN SDPA: {} failed: {}", call, cudnnGetErrorString(s));
}

void ck_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) fail("cuDNN SDPA: {} failed: {}", call, cudaGetErrorString(e));
}

struct Shape {
  int64_t B, T, Hq, Hkv, D, ld_q, ld_kv;
};

// A tensor's dims and strides in the frontend's [b, h, s, d] order.
struct Strided {
  std::vector<int64_t> dim, stride;
};
// Our [B, T, H, D] buffer with row stride ld, in place.
Strided bthd(const Shape& s, int64_t H, int64_t ld) { return {{s.B, H, s.T, s.D}, {s.T * ld, s.D, ld, 1}}; }
// lse [B, Hq, T] fp32 as the stats tensor [B, Hq, T, 1] (packed BHSD).
Strided stats(const Shape& s) { return {{s.B, s.Hq, s.T, 1}, {s.Hq * s.T, s.T, 1, 1}}; }

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, int64_t uid,
                                                    const Strided& l, fe::DataType_t dt = fe::DataType_t::BFLOAT16) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(l.dim).set_stride(l.stride).set_data_type(dt));
}

void output(fe::graph::Tensor_attributes& t, int64_t uid, const Strided& l,
            fe::DataType_t dt = fe::DataType_t::BFLOAT16) {
  t.set_output(true).set_uid(uid).set_dim(l.dim).set_stride(l.stride).set_data_type(dt);
}

// sm_version > 0 pins the target architecture (no device query: check_graphs).
GraphPtr new_graph(const char* name, int sm_version) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_name(name)
      .set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (sm_version > 0) g->set_sm_version(sm_version);
  return g;
}

// Causal with the diagonal at the top left (query t sees keys 0..t), scale 1/sqrt(D).
GraphPtr forward_graph(const Shape& s, int sm_version) {
  GraphPtr g = new_graph("kvs_sdpa_forward", sm_version);
  auto Q = input(*g, "Q", kQ, bthd(s, s.Hq, s.ld_q));
  auto K = input(*g, "K", kK, bthd(s, s.Hkv, s.ld_kv));
  auto V = input(*g, "V", kV, bthd(s, s.Hkv, s.ld_kv));
  auto [O, Stats] = g->sdpa(Q, K, V,
                            fe::graph::SDPA_attributes()
                                .set_name("sdpa")
                                .set_generate_stats(true)
                                .set_causal_mask(true)
                                .set_attn_scale(1.0f / std::sqrt(static_cast<float>(s.D))));
  output(*O, kO, bthd(s, s.Hq, s.Hq * s.D));
  output(*Stats, kStats, stats(s), fe::DataType_t::FLOAT);
  return g;
}

GraphPtr backward_graph(const Shape& s, bool deterministic, int sm_version) {
  GraphPtr g = new_graph("kvs_sdpa_backward", sm_version);
  auto Q = input(*g, "Q", kQ, bthd(s, s.Hq, s.ld_q));
  auto K = input(*g, "K", kK, bthd(s, s.Hkv, s.ld_kv));
  auto V = input(*g, "V", kV, bthd(s, s.Hkv, s.ld_kv));
  auto O = input(*g, "O", kO, bthd(s, s.Hq, s.Hq * s.D));
  auto dO = input(*g, "dO", kDO, bthd(s, s.Hq, s.Hq * s.D));
  auto Stats = input(*g, "Stats", kStats, stats(s), fe::DataType_t::FLOAT);
  auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats,
                                       fe::graph::SDPA_backward_attributes()
                                           .set_name("sdpa_backward")
                                           .set_causal_mask(true)
                                           .set_attn_scale(1.0f / std::sqrt(static_cast<float>(s.D)))
                                           .set_deterministic_algorithm(deterministic));
  output(*dQ, kDQ, bthd(s, s.Hq, s.ld_q));
  output(*dK, kDK, bthd(s, s.Hkv, s.ld_kv));
  output(*dV, kDV, bthd(s, s.Hkv, s.ld_kv));
  return g;
}

// The frontend reports most failures as error_t, but a few as exceptions
// (no SDPA implementation for the attributes, cudnnException): one line each.
template <class F>
auto frontend_call(const char* graph, F&& f) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("cuDNN SDPA {} graph: {}", graph, one_line_error_text(e));
  }
}

// Lowers to cuDNN and picks the first engine configuration (heuristics mode
// A, then the fallback list) whose plan builds; returns its workspace bytes.
size_t build(fe::graph::Graph& g, cudnnHandle_t handle, const char* name) {
  return frontend_call(name, [&] {
    check(g.validate(), name, "validate");
    check(g.build_operation_graph(handle), name, "build_operation_graph");
    check(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), name, "create_execution_plans");
    check(g.check_support(), name, "check_support");
    check(g.build_plans(), name, "build_plans");
    int64_t ws = 0;
    check(g.get_workspace_size(ws), name, "get_workspace_size");
    return static_cast<size_t>(ws);
  });
}

void execute(const fe::graph::Graph& g, cudnnHandle_t handle, std::unordered_map<int64_t, void*>& pack,
             void* workspace, cudaStream_t stream, const char* name) {
  ck_cudnn(cudnnSetStream(handle, stream), "cudnnSetStream");
  check(g.execute(handle, pack, workspace), name, "execute");
}

}  // namespace

struct CudnnSdpa::Impl {
  cudnnHandle_t handle = nullptr;
};

struct CudnnSdpa::Plans {
  GraphPtr fwd, bwd;
  size_t need = 0;  // workspace bytes for this shape
};

CudnnSdpa::CudnnSdpa(int max_B, int max_T, int Hq, int Hkv, int D, int ld_q, int ld_kv, bool deterministic)
    : max_B_(max_B), max_T_(max_T), Hq_(Hq), Hkv_(Hkv), D_(D), deterministic_(deterministic),
      impl_(std::make_unique<Impl>()) {
  KVS_CHECK(max_B >= 1 && max_T >= 1, "cuDNN SDPA: batch and sequence length must be positive");
  KVS_CHECK(Hq >= 1 && Hkv >= 1 && Hq % Hkv == 0,
            "cuDNN SDPA: query heads ({}) must be a positive multiple of KV heads ({})", Hq, Hkv);
  KVS_CHECK(D % 8 == 0 && D >= 8 && D <= 256, "cuDNN SDPA: head_dim {} must be a multiple of 8 in [8, 256]", D);
  ck_cudnn(cudnnCreate(&impl_->handle), "cudnnCreate");
  const Plans& p = plans_for(max_B, max_T, ld_q, ld_kv);
  workspace_bytes_ = std::max<size_t>(p.need, 256);
  ck_cuda(cudaMalloc(&workspace_, workspace_bytes_), "cudaMalloc(workspace)");
}

CudnnSdpa::~CudnnSdpa() {
  plans_.clear();  // the plans before the handle
  if (impl_ && impl_->handle) cudnnDestroy(impl_->handle);
  if (workspace_) cudaFree(workspace_);
}

void CudnnSdpa::check_shape(const char* what, int Hq, int Hkv, int D) const {
  KVS_CHECK(Hq == Hq_ && Hkv == Hkv_ && D == D_,
            "cuDNN SDPA {}: heads {}/{} and head_dim {} differ from the {}/{} and {} it was built for", what, Hq, Hkv,
            D, Hq_, Hkv_, D_);
}

void CudnnSdpa::check_graphs(int B, int T, int Hq, int Hkv, int D, int ld_q, int ld_kv, bool deterministic) {
  const Shape s{B, T, Hq, Hkv, D, ld_q, ld_kv};
  const int kHopper = 90;
  auto lower = [](fe::graph::Graph& g, const char* name) {
    check(g.validate(), name, "validate");
    check(g.build_operation_graph(nullptr), name, "build_operation_graph");
  };
  frontend_call("forward", [&] { lower(*forward_graph(s, kHopper), "forward"); });
  frontend_call("backward", [&] { lower(*backward_graph(s, deterministic, kHopper), "backward"); });
}

CudnnSdpa::Plans& CudnnSdpa::plans_for(int B, int T, int ld_q, int ld_kv) {
  const auto key = std::make_tuple(B, T, ld_q, ld_kv);
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  KVS_CHECK(ld_q >= Hq_ * D_ && ld_q % 8 == 0 && ld_kv >= Hkv_ * D_ && ld_kv % 8 == 0,
            "cuDNN SDPA: row strides ld_q={} / ld_kv={} must cover the heads ({} / {}) and be multiples of 8", ld_q,
            ld_kv, Hq_ * D_, Hkv_ * D_);
  const Shape s{B, T, Hq_, Hkv_, D_, ld_q, ld_kv};
  auto p = std::make_unique<Plans>();
  p->fwd = frontend_call("forward", [&] { return forward_graph(s, 0); });
  p->bwd = frontend_call("backward", [&] { return backward_graph(s, deterministic_, 0); });
  p->need = std::max(build(*p->fwd, impl_->handle, "forward"), build(*p->bwd, impl_->handle, "backward"));
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
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<bf16*>(q)}, {kK, const_cast<bf16*>(k)},
                                          {kV, const_cast<bf16*>(v)}, {kO, out},
                                          {kStats, lse}};
  execute(*p.fwd, impl_->handle, pack, workspace_, stream, "forward");
  profile::mark("cudnn sdpa forward", stream);
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
  std::unordered_map<int64_t, void*> pack{
      {kQ, const_cast<bf16*>(q)},      {kK, const_cast<bf16*>(k)},        {kV, const_cast<bf16*>(v)},
      {kO, const_cast<bf16*>(out)},    {kDO, const_cast<bf16*>(dout)},    {kStats, const_cast<float*>(lse)},
      {kDQ, dq},                       {kDK, dk},                         {kDV, dv}};
  execute(*p.bwd, impl_->handle, pack, workspace_, stream, "backward");
  profile::mark("cudnn sdpa backward", stream);
}

#endif  // KVS_CUDNN

}  // namespace kvs::cuda
