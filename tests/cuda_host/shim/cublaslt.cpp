// cuBLASLt on the host (hostcuda.h): the descriptors, preferences and
// heuristic the engine's Matmul (kernels/cuda/matmul.cu) uses, and a host GEMM
// queued on the stream. It implements exactly what the engine sets and refuses
// anything else by name, instead of guessing what an attribute would do:
//   - compute CUBLAS_COMPUTE_32F, scale CUDA_R_32F, alpha and beta host floats;
//   - A and B CUDA_R_16BF; C and D both CUDA_R_16BF or both CUDA_R_32F, with
//     the same layout (the engine passes D as C); column major, no batches;
//   - TRANSA / TRANSB N or T;
//   - preferences: workspace limit, reduction-scheme mask, minimum alignments.
// D = alpha op(A) op(B) + beta C, products and sums in fp32 in k order (so
// deterministic), rounded once to bf16 for a bf16 D; C is not read when beta
// is 0, as in cuBLAS. The heuristic's algorithm remembers the alignments it was
// chosen for, and cublasLtMatmul refuses pointers less aligned than that.
// Errors carry their reason in cublasLtGetStatusName's text.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hostcuda.h"

struct cublasLtContext {
  int magic;
};

namespace hostcuda {
namespace {

constexpr uint32_t kDescMagic = 0x6d6d4431, kLayoutMagic = 0x6d6d4c31, kPrefMagic = 0x6d6d5031,
                   kAlgoMagic = 0x6d6d4131, kHandleMagic = 0x6d6d4831;

struct Desc {
  uint32_t magic;
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t trans_a, trans_b;
};
struct Layout {
  uint32_t magic;
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Pref {
  uint32_t magic;
  uint64_t max_workspace;
  uint32_t align[4];  // A, B, C, D
};
struct Algo {
  uint32_t magic;
  uint32_t align[4];
  uint32_t index;  // the heuristic's order: every one computes the same product here
};
// Algorithms the heuristic offers per problem: more than one, so code that
// chooses among them (Matmul's timed algorithms, bench-gemm) runs its loop.
constexpr int kAlgorithms = 3;
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(Pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t));
static_assert(sizeof(Algo) <= sizeof(cublasLtMatmulAlgo_t));

std::string g_detail;  // why the last call failed, for cublasLtGetStatusName
int g_refused_algorithm = -1;  // refuse_gemm_algorithm()

cublasStatus_t refuse(cublasStatus_t st, const std::string& why) {
  g_detail = why;
  return st;
}

const char* desc_attr_name(int a) {
  static const char* names[] = {"COMPUTE_TYPE", "SCALE_TYPE", "POINTER_MODE", "TRANSA", "TRANSB", "TRANSC",
                                "FILL_MODE",    "EPILOGUE",   "BIAS_POINTER"};
  return a >= 0 && a < 9 ? names[a] : "(another)";
}

const char* type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_16F: return "CUDA_R_16F";
    default: return "another type";
  }
}

size_t elem_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// The checks shared by the heuristic and the matmul: what this GEMM supports.
cublasStatus_t check_problem(const Desc* op, const Layout* a, const Layout* b, const Layout* c, const Layout* d) {
  if (!op || op->magic != kDescMagic) return refuse(CUBLAS_STATUS_INVALID_VALUE, "the matmul descriptor is not initialised");
  for (const Layout* l : {a, b, c, d})
    if (!l || l->magic != kLayoutMagic) return refuse(CUBLAS_STATUS_INVALID_VALUE, "a matrix layout is not initialised");
  if (op->compute != CUBLAS_COMPUTE_32F || op->scale != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "host GEMM: only CUBLAS_COMPUTE_32F with CUDA_R_32F scale is implemented");
  if (a->type != CUDA_R_16BF || b->type != CUDA_R_16BF)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string("host GEMM: A and B must be CUDA_R_16BF, got ") +
                                                   type_name(a->type) + " and " + type_name(b->type));
  if (d->type != CUDA_R_16BF && d->type != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string("host GEMM: D must be CUDA_R_16BF or CUDA_R_32F, got ") +
                                                   type_name(d->type));
  if (c->type != d->type || c->rows != d->rows || c->cols != d->cols || c->ld != d->ld)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "host GEMM: C's layout must equal D's");
  const uint64_t m = op->trans_a ? a->cols : a->rows, ka = op->trans_a ? a->rows : a->cols;
  const uint64_t kb = op->trans_b ? b->cols : b->rows, n = op->trans_b ? b->rows : b->cols;
  if (ka != kb || m != d->rows || n != d->cols)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "host GEMM: op(A) is " + std::to_string(m) + " x " +
                                                   std::to_string(ka) + ", op(B) " + std::to_string(kb) + " x " +
                                                   std::to_string(n) + ", D " + std::to_string(d->rows) + " x " +
                                                   std::to_string(d->cols));
  for (const Layout* l : {a, b, d})
    if (l->ld < static_cast<int64_t>(std::max<uint64_t>(l->rows, 1)))
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "host GEMM: a leading dimension " + std::to_string(l->ld) +
                                                     " below its " + std::to_string(l->rows) + " rows");
  return CUBLAS_STATUS_SUCCESS;
}

// Bytes a column-major matrix spans.
size_t span(const Layout& l) {
  return l.rows == 0 || l.cols == 0 ? 0 : ((l.cols - 1) * static_cast<uint64_t>(l.ld) + l.rows) * elem_bytes(l.type);
}

void note_columns(const void* p, const Layout& l, bool write) {
  const size_t e = elem_bytes(l.type);
  for (uint64_t j = 0; j < l.cols; ++j)
    note_access(reinterpret_cast<uintptr_t>(p) + j * l.ld * e, l.rows * e, write);
}

float load(const void* p, cudaDataType_t t, size_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

}  // namespace

void refuse_gemm_algorithm(int index) { g_refused_algorithm = index; }
}  // namespace hostcuda

using namespace hostcuda;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (!h) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: null output");
  *h = new cublasLtContext{static_cast<int>(kHandleMagic)};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (!h || h->magic != static_cast<int>(kHandleMagic)) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "not a handle");
  h->magic = 0;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t st) {
  static std::string text;
  const char* name = st == CUBLAS_STATUS_SUCCESS           ? "CUBLAS_STATUS_SUCCESS"
                     : st == CUBLAS_STATUS_NOT_INITIALIZED ? "CUBLAS_STATUS_NOT_INITIALIZED"
                     : st == CUBLAS_STATUS_INVALID_VALUE   ? "CUBLAS_STATUS_INVALID_VALUE"
                     : st == CUBLAS_STATUS_NOT_SUPPORTED   ? "CUBLAS_STATUS_NOT_SUPPORTED"
                     : st == CUBLAS_STATUS_ALLOC_FAILED    ? "CUBLAS_STATUS_ALLOC_FAILED"
                                                           : "CUBLAS_STATUS_EXECUTION_FAILED";
  text = g_detail.empty() || st == CUBLAS_STATUS_SUCCESS ? name : std::string(name) + ": " + g_detail;
  return text.c_str();
}

const char* cublasLtGetStatusString(cublasStatus_t st) { return cublasLtGetStatusName(st); }

cublasStatus_t cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t desc, size_t size, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
  if (!desc || size < sizeof(Desc)) return refuse(CUBLAS_STATUS_ALLOC_FAILED, "matmul descriptor storage too small");
  Desc d{kDescMagic, compute, scale, CUBLAS_OP_N, CUBLAS_OP_N};
  std::memcpy(desc, &d, sizeof d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  auto* d = reinterpret_cast<Desc*>(desc);
  if (!d || d->magic != kDescMagic) return refuse(CUBLAS_STATUS_INVALID_VALUE, "the matmul descriptor is not initialised");
  if (attr != CUBLASLT_MATMUL_DESC_TRANSA && attr != CUBLASLT_MATMUL_DESC_TRANSB)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "host GEMM: matmul descriptor attribute CUBLASLT_MATMUL_DESC_" +
                                                   std::string(desc_attr_name(attr)) + " (" + std::to_string(attr) +
                                                   ") is not implemented");
  if (!buf || size != sizeof(int32_t))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "TRANSA/TRANSB take an int32_t, got " + std::to_string(size) + " bytes");
  int32_t v;
  std::memcpy(&v, buf, sizeof v);
  if (v != CUBLAS_OP_N && v != CUBLAS_OP_T)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "host GEMM: only CUBLAS_OP_N and CUBLAS_OP_T are implemented");
  (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->trans_a : d->trans_b) = v;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t layout, size_t size, cudaDataType type,
                                                 uint64_t rows, uint64_t cols, int64_t ld) {
  if (!layout || size < sizeof(Layout)) return refuse(CUBLAS_STATUS_ALLOC_FAILED, "layout storage too small");
  Layout l{kLayoutMagic, type, rows, cols, ld};
  std::memcpy(layout, &l, sizeof l);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t attr,
                                                const void*, size_t) {
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                "host GEMM: matrix layout attribute " + std::to_string(attr) + " is not implemented (column major, "
                "one matrix)");
}

cublasStatus_t cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t pref, size_t size) {
  if (!pref || size < sizeof(Pref)) return refuse(CUBLAS_STATUS_ALLOC_FAILED, "preference storage too small");
  Pref p{kPrefMagic, 0, {256, 256, 256, 256}};
  std::memcpy(pref, &p, sizeof p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  auto* p = reinterpret_cast<Pref*>(pref);
  if (!p || p->magic != kPrefMagic) return refuse(CUBLAS_STATUS_INVALID_VALUE, "the preference is not initialised");
  auto take = [&](auto& dst) {
    if (!buf || size != sizeof dst) return false;
    std::memcpy(&dst, buf, sizeof dst);
    return true;
  };
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: ok = take(p->max_workspace); break;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: {
      uint32_t mask;
      ok = take(mask);  // no split-K here: every scheme is the plain k-order sum
      break;
    }
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: ok = take(p->align[0]); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: ok = take(p->align[1]); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: ok = take(p->align[2]); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: ok = take(p->align[3]); break;
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                    "host GEMM: preference attribute " + std::to_string(attr) + " is not implemented");
  }
  if (!ok) return refuse(CUBLAS_STATUS_INVALID_VALUE, "preference attribute " + std::to_string(attr) + ": " +
                                                          std::to_string(size) + " bytes is not its size");
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* found) {
  if (!h || h->magic != static_cast<int>(kHandleMagic)) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "not a handle");
  if (requested <= 0 || !results || !found) return refuse(CUBLAS_STATUS_INVALID_VALUE, "no room for a result");
  const auto* p = reinterpret_cast<const Pref*>(pref);
  if (!p || p->magic != kPrefMagic) return refuse(CUBLAS_STATUS_INVALID_VALUE, "the preference is not initialised");
  if (const cublasStatus_t st =
          check_problem(reinterpret_cast<const Desc*>(desc), reinterpret_cast<const Layout*>(a),
                        reinterpret_cast<const Layout*>(b), reinterpret_cast<const Layout*>(c),
                        reinterpret_cast<const Layout*>(d)))
    return st;
  for (uint32_t al : p->align)
    if (al == 0 || (al & (al - 1)) != 0)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "a minimum alignment of " + std::to_string(al) + " bytes");
  const int n = std::min(requested, kAlgorithms);
  for (int i = 0; i < n; ++i) {
    std::memset(&results[i], 0, sizeof results[i]);
    Algo algo{kAlgoMagic, {p->align[0], p->align[1], p->align[2], p->align[3]}, static_cast<uint32_t>(i)};
    std::memcpy(&results[i].algo, &algo, sizeof algo);
    results[i].workspaceSize = 0;
    results[i].state = CUBLAS_STATUS_SUCCESS;
    results[i].wavesCount = 1.0f;
  }
  *found = n;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha_p, const void* A,
                              cublasLtMatrixLayout_t a_desc, const void* B, cublasLtMatrixLayout_t b_desc,
                              const void* beta_p, const void* C, cublasLtMatrixLayout_t c_desc, void* D,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo_p, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  if (!h || h->magic != static_cast<int>(kHandleMagic)) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "not a handle");
  const auto* op = reinterpret_cast<const Desc*>(desc);
  const auto* la = reinterpret_cast<const Layout*>(a_desc);
  const auto* lb = reinterpret_cast<const Layout*>(b_desc);
  const auto* lc = reinterpret_cast<const Layout*>(c_desc);
  const auto* ld = reinterpret_cast<const Layout*>(d_desc);
  if (const cublasStatus_t st = check_problem(op, la, lb, lc, ld)) return st;
  Algo algo{};
  if (algo_p) std::memcpy(&algo, algo_p, sizeof algo);
  if (algo.magic != kAlgoMagic || algo.index >= static_cast<uint32_t>(kAlgorithms))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "host GEMM: the algorithm is not one cublasLtMatmulAlgoGetHeuristic gave");
  if (static_cast<int>(algo.index) == g_refused_algorithm)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "host GEMM: algorithm " + std::to_string(algo.index) +
                                                   " refused (refuse_gemm_algorithm)");
  if (!alpha_p || !beta_p || is_device_address(alpha_p) || is_device_address(beta_p))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "host GEMM: alpha and beta must be host floats (the default pointer mode)");
  std::string why;
  if (stream_index(stream, &why) < 0) return refuse(CUBLAS_STATUS_INVALID_VALUE, "stream: " + why);
  const char* names[4] = {"A", "B", "C", "D"};
  const void* ptrs[4] = {A, B, C, D};
  const Layout* lays[4] = {la, lb, lc, ld};
  float alpha, beta;
  std::memcpy(&alpha, alpha_p, sizeof alpha);
  std::memcpy(&beta, beta_p, sizeof beta);
  for (int i = 0; i < 4; ++i) {
    if (i == 2 && beta == 0.0f) continue;  // C is not read
    const size_t bytes = span(*lays[i]);
    if (bytes && !device_range_ok(ptrs[i], bytes, &why))
      return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string("host GEMM: ") + names[i] + " (" +
                                                     std::to_string(bytes) + " bytes): " + why);
    if (alignment_of(ptrs[i]) < algo.align[i])
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    std::string("host GEMM: ") + names[i] + " is " + std::to_string(alignment_of(ptrs[i])) +
                        "-byte aligned, but the algorithm was chosen for " + std::to_string(algo.align[i]) +
                        "-byte alignment (MIN_ALIGNMENT_" + names[i] + "_BYTES)");
  }
  if (workspace_bytes && !device_range_ok(workspace, workspace_bytes, &why))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "host GEMM: workspace: " + why);
  const Desc o = *op;
  const Layout a = *la, b = *lb, c = *lc, d = *ld;
  const std::string label = std::string("cublasLtMatmul(") + (o.trans_a ? 'T' : 'N') + (o.trans_b ? 'T' : 'N') +
                            ", m=" + std::to_string(d.rows) + " n=" + std::to_string(d.cols) + " k=" +
                            std::to_string(o.trans_a ? a.rows : a.cols) + ", D " + type_name(d.type) + ")";
  if (launch_only()) {
    enqueue(stream, label, [] { count_gemm(); });
    return CUBLAS_STATUS_SUCCESS;
  }
  enqueue(stream, label, [=] {
    count_gemm();
    const uint64_t m = d.rows, n = d.cols, k = o.trans_a ? a.rows : a.cols;
    note_columns(A, a, false);
    note_columns(B, b, false);
    if (beta != 0.0f) note_columns(C, c, false);
    note_columns(D, d, true);
    // op(A) as [m][k] and op(B) as [n][k], in fp32.
    std::vector<float> opa(m * k), opb(n * k);
    for (uint64_t i = 0; i < m; ++i)
      for (uint64_t l = 0; l < k; ++l) opa[i * k + l] = load(A, a.type, o.trans_a ? l + i * a.ld : i + l * a.ld);
    for (uint64_t j = 0; j < n; ++j)
      for (uint64_t l = 0; l < k; ++l) opb[j * k + l] = load(B, b.type, o.trans_b ? j + l * b.ld : l + j * b.ld);
    for (uint64_t j = 0; j < n; ++j)
      for (uint64_t i = 0; i < m; ++i) {
        float acc = 0.0f;
        const float* x = &opa[i * k];
        const float* y = &opb[j * k];
        for (uint64_t l = 0; l < k; ++l) acc += x[l] * y[l];
        float v = alpha * acc;
        if (beta != 0.0f) v += beta * load(C, c.type, i + j * c.ld);
        const size_t at = i + j * d.ld;
        if (d.type == CUDA_R_32F)
          static_cast<float*>(D)[at] = v;
        else
          static_cast<__nv_bfloat16*>(D)[at] = __float2bfloat16_rn(v);
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
