// check_flash_hopper (attention_backend.h): the Hopper attention kernels
// against the mma.sync ones on one small problem, before a run uses them.
#include <cmath>
#include <cstdint>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/cuda/attention_backend.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {
namespace {

// One device allocation, freed on every path (fail throws).
struct DeviceBytes {
  void* p = nullptr;
  explicit DeviceBytes(size_t n) { check(cudaMalloc(&p, n), "flash-hopper check", "cudaMalloc"); }
  ~DeviceBytes() { cudaFree(p); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// |a - b| / |b| over n bf16 values.
double rel_l2(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace

void check_flash_hopper(int D) {
  if (!flash_hopper_available(D)) return;
  // Once per process, device and head_dim (a pipeline stage's engines, a test's many).
  static std::mutex mutex;
  static std::set<std::pair<int, int>> passed;
  int device = 0;
  check(cudaGetDevice(&device), "flash-hopper check", "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(mutex);
  if (passed.count({device, D})) return;
  // GQA (2 query heads on 1 KV head), a partial last tile (130 = 2 x 64 + 2).
  const int B = 1, T = 130, Hq = 2, Hkv = 1;
  const size_t nq = static_cast<size_t>(B) * T * Hq * D, nk = static_cast<size_t>(B) * T * Hkv * D;
  const size_t nl = static_cast<size_t>(B) * Hq * T;
  std::vector<bf16> host(2 * nq + 2 * nk);  // q, dout, k, v
  uint64_t state = 0x9E3779B97F4A7C15ULL;
  for (bf16& x : host) {  // uniform in [-1, 1), a fixed sequence
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    x = __float2bfloat16(static_cast<float>(static_cast<int32_t>(state >> 32)) / 2147483648.0f);
  }
  const size_t bytes_q = nq * sizeof(bf16), bytes_k = nk * sizeof(bf16);
  DeviceBytes q(bytes_q), dout(bytes_q), k(bytes_k), v(bytes_k), out(bytes_q), lse(nl * sizeof(float));
  DeviceBytes out_h(bytes_q), lse_h(nl * sizeof(float));
  DeviceBytes dq(bytes_q), dk(bytes_k), dv(bytes_k), dq_h(bytes_q), dk_h(bytes_k), dv_h(bytes_k);
  DeviceBytes scratch(flash_attention_backward_scratch_floats(B, T, Hq, D) * sizeof(float));
  const char* who = "attention backend \"flash\": the Hopper kernels' self-check";
  check(cudaMemcpy(q.p, host.data(), bytes_q, cudaMemcpyHostToDevice), who, "upload");
  check(cudaMemcpy(dout.p, host.data() + nq, bytes_q, cudaMemcpyHostToDevice), who, "upload");
  check(cudaMemcpy(k.p, host.data() + 2 * nq, bytes_k, cudaMemcpyHostToDevice), who, "upload");
  check(cudaMemcpy(v.p, host.data() + 2 * nq + nk, bytes_k, cudaMemcpyHostToDevice), who, "upload");
  const int ld_q = Hq * D, ld_kv = Hkv * D;
  // Document starts (model.document_boundaries): documents from rows 0, 37
  // and 90, so a tile is skipped and others are masked inside. The masked
  // kernels are other instantiations (kDocs): they are checked too, once.
  std::vector<int32_t> starts(static_cast<size_t>(B) * T);
  for (int t = 0; t < T; ++t) starts[t] = t < 37 ? 0 : t < 90 ? 37 : 90;
  DeviceBytes doc(starts.size() * sizeof(int32_t));
  check(cudaMemcpy(doc.p, starts.data(), starts.size() * sizeof(int32_t), cudaMemcpyHostToDevice), who, "upload");
  auto download = [&](const DeviceBytes& d, size_t n) {
    std::vector<bf16> x(n);
    check(cudaMemcpy(x.data(), d.p, n * sizeof(bf16), cudaMemcpyDeviceToHost), who, "download");
    return x;
  };
  for (const bool masked : {false, true}) {
    const AttentionDocs docs{masked ? doc.as<int32_t>() : nullptr, 0};
    const char* form = masked ? " with document masks" : "";
    for (const FlashLoads loads : {FlashLoads::kAsync, FlashLoads::kHopper}) {
      const bool h = loads == FlashLoads::kHopper;
      flash_attention_forward((h ? out_h : out).as<bf16>(), (h ? lse_h : lse).as<float>(), q.as<bf16>(), ld_q,
                              k.as<bf16>(), v.as<bf16>(), ld_kv, B, T, Hq, Hkv, D, true, loads, nullptr, docs);
      // Both backwards from the mma.sync forward's out and lse: a mismatch names its kernel.
      flash_attention_backward((h ? dq_h : dq).as<bf16>(), (h ? dk_h : dk).as<bf16>(), (h ? dv_h : dv).as<bf16>(),
                               dout.as<bf16>(), out.as<bf16>(), lse.as<float>(), q.as<bf16>(), ld_q, k.as<bf16>(),
                               v.as<bf16>(), ld_kv, B, T, Hq, Hkv, D, true, loads, scratch.as<float>(), nullptr, docs);
    }
    check(cudaDeviceSynchronize(), who, "kernels");
    // The two differ only in the tensor cores' accumulation order (bf16
    // outputs, ~1e-3 relative); a wrong descriptor, swizzle, ordering or mask is O(1).
    const struct {
      const char* name;
      double err;
    } results[] = {
        {"forward out", rel_l2(download(out_h, nq), download(out, nq))},
        {"backward dQ", rel_l2(download(dq_h, nq), download(dq, nq))},
        {"backward dK", rel_l2(download(dk_h, nk), download(dk, nk))},
        {"backward dV", rel_l2(download(dv_h, nk), download(dv, nk))},
    };
    std::vector<float> l(nl), l_h(nl);
    check(cudaMemcpy(l.data(), lse.p, nl * sizeof(float), cudaMemcpyDeviceToHost), who, "download");
    check(cudaMemcpy(l_h.data(), lse_h.p, nl * sizeof(float), cudaMemcpyDeviceToHost), who, "download");
    double lse_err = 0;
    for (size_t i = 0; i < nl; ++i) lse_err = std::fmax(lse_err, std::fabs(static_cast<double>(l_h[i]) - l[i]));
    if (!(lse_err < 1e-3))
      fail("{}: the Hopper forward's log-sum-exp{} is {:.3g} (max abs) from the mma.sync kernel's at head_dim {} on "
           "this GPU; train with train.attention_backend \"flash-mma\"",
           who, form, lse_err, D);
    for (const auto& r : results)
      if (!(r.err < 2e-2))
        fail("{}: the Hopper kernels' {}{} is {:.3g} (relative L2) from the mma.sync kernels' at head_dim {} on this "
             "GPU; train with train.attention_backend \"flash-mma\"",
             who, r.name, form, r.err, D);
  }
  passed.insert({device, D});
}

}  // namespace kvs::cuda
