#include "model/cpu_replicas.h"

#include <omp.h>
#include <strings.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cpu/op_profile.h"

namespace kvs {

namespace prof = cpu::profile;

CpuReplicas parse_cpu_replicas(const char* user) {
  if (!user || !*user || strcasecmp(user, "auto") == 0) return CpuReplicas::kAuto;
  if (strcasecmp(user, "off") == 0) return CpuReplicas::kOff;
  fail("KVS_CPU_REPLICAS={}: expected auto or off (or unset it for auto)", user);
}

void check_cpu_replicas_variable() { (void)parse_cpu_replicas(std::getenv("KVS_CPU_REPLICAS")); }

namespace {
std::atomic<CpuReplicas>& setting() {
  static std::atomic<CpuReplicas> s{parse_cpu_replicas(std::getenv("KVS_CPU_REPLICAS"))};
  return s;
}
}  // namespace

CpuReplicas cpu_replicas_setting() { return setting().load(); }
void set_cpu_replicas(CpuReplicas r) { setting().store(r); }

int cpu_replicas_for(CpuReplicas s, int threads, int max_batch, bool whole_model_alone, double params,
                     double activation_floats) {
  if (s == CpuReplicas::kOff || threads < 2 || threads > max_batch || !whole_model_alone) return 1;
  const double extra = (threads - 1) * 4.0 * params, one_engine = 16.0 * params + 4.0 * activation_floats;
  return extra <= one_engine / 4 ? threads : 1;
}

int cpu_replicas_for_model(const ModelConfig& m, int threads, int max_batch, int max_seq_len, bool whole_model_alone) {
  return cpu_replicas_for(
      cpu_replicas_setting(), threads, max_batch, whole_model_alone, static_cast<double>(count_params(m).total),
      static_cast<double>(ActivationPlan::build(m, LocalDims::of(m, 0, 1), max_batch, max_seq_len).total));
}

std::string replicas_note(const Engine& e) {
  const auto* r = dynamic_cast<const CpuReplicaEngine*>(&e);
  return r ? fmt::format(", as {} thread replicas", r->replicas()) : "";
}

CpuReplicaEngine::CpuReplicaEngine(const ModelConfig& m, int max_batch, int max_seq_len, int replicas)
    : max_B_(max_batch) {
  KVS_CHECK(replicas >= 2 && replicas <= max_batch, "engine: {} thread replicas for micro-batches of {} sequences",
            replicas, max_batch);
  const int per = (max_batch + replicas - 1) / replicas;
  for (int r = 0; r < replicas; ++r) {
    reps_.push_back(std::make_unique<CpuEngine>(m, per, max_seq_len));
    if (r > 0) reps_[r]->share_params_of(*reps_[0]);
  }
}

template <class Fn>
double CpuReplicaEngine::over_shares(const Batch& b, Fn fn) {
  validate_batch(b, model_config(), max_B_, max_seq_len());
  const int shares = std::min(replicas(), b.B);
  auto share = [&](int r) {
    const int s0 = b.B * r / shares, s1 = b.B * (r + 1) / shares;
    const size_t at = static_cast<size_t>(s0) * b.T;
    return Batch{s1 - s0, b.T, b.inputs + at, b.targets ? b.targets + at : nullptr, b.mask ? b.mask + at : nullptr};
  };
  if (shares == 1) return fn(0, share(0));  // every thread on one share, as one engine
  std::vector<double> result(shares, 0.0);
  std::vector<std::exception_ptr> error(shares);
#pragma omp parallel num_threads(shares)
  {
    const int r = omp_get_thread_num();
    omp_set_num_threads(1);  // this replica's ops and GEMMs run on its own thread
    try {
      result[r] = fn(r, share(r));
    } catch (...) {
      error[r] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : error)
    if (e) std::rethrow_exception(e);
  double sum = 0;
  for (double x : result) sum += x;
  return sum;
}

double CpuReplicaEngine::forward_backward(const Batch& b, double grad_scale) {
  pending_ = pending_ || std::min(replicas(), b.B) > 1;  // (first: a backward that throws may have added some)
  return over_shares(b, [&](int r, const Batch& s) { return reps_[r]->forward_backward(s, grad_scale); });
}

double CpuReplicaEngine::forward(const Batch& b, float* token_losses, int32_t* argmax, float* logits) {
  const size_t V = static_cast<size_t>(model_config().vocab_size);
  return over_shares(b, [&](int r, const Batch& s) {
    const size_t at = static_cast<size_t>(s.inputs - b.inputs);  // the share's first row
    return reps_[r]->forward(s, token_losses ? token_losses + at : nullptr, argmax ? argmax + at : nullptr,
                             logits ? logits + at * V : nullptr);
  });
}

void CpuReplicaEngine::gather_grads() {
  if (!pending_) return;
  const prof::Scope timed("replica grads sum");
  float* g0 = reps_[0]->host_grads();
  const ptrdiff_t n = static_cast<ptrdiff_t>(layout().total);
  for (size_t r = 1; r < reps_.size(); ++r) {  // replica by replica: the same bits for a fixed count
    float* g = reps_[r]->host_grads();
#pragma omp parallel for schedule(static)
    for (ptrdiff_t i = 0; i < n; ++i) {
      g0[i] += g[i];
      g[i] = 0.0f;
    }
  }
  pending_ = false;
}

void CpuReplicaEngine::zero_grad() {
  if (pending_)
    for (auto& e : reps_) e->zero_grad();
  else
    reps_[0]->zero_grad();  // the others are zero since their sum
  pending_ = false;
}

void CpuReplicaEngine::read_params_range(size_t begin, size_t n, float* host) const {
  reps_[0]->read_params_range(begin, n, host);
}
void CpuReplicaEngine::write_params_range(size_t begin, size_t n, const float* host) {
  reps_[0]->write_params_range(begin, n, host);  // the others compute with these
}
void CpuReplicaEngine::read_optimizer_range(size_t begin, size_t n, float* m, float* v) const {
  reps_[0]->read_optimizer_range(begin, n, m, v);
}
void CpuReplicaEngine::write_optimizer_range(size_t begin, size_t n, const float* m, const float* v) {
  reps_[0]->write_optimizer_range(begin, n, m, v);
}
void CpuReplicaEngine::read_grads(float* host) const {
  const_cast<CpuReplicaEngine*>(this)->gather_grads();  // a sum owed, not a change of the gradients
  reps_[0]->read_grads(host);
}
float* CpuReplicaEngine::host_grads() {
  gather_grads();
  return reps_[0]->host_grads();
}
double CpuReplicaEngine::grad_norm() {
  gather_grads();
  return reps_[0]->grad_norm();
}
double CpuReplicaEngine::grad_sq_sum_range(size_t begin, size_t end) {
  gather_grads();
  return reps_[0]->grad_sq_sum_range(begin, end);
}
void CpuReplicaEngine::adamw_step(const AdamWHyper& h) {
  gather_grads();
  reps_[0]->adamw_step(h);
}
void CpuReplicaEngine::adamw_step_range(const AdamWHyper& h, size_t begin, size_t end) {
  gather_grads();
  reps_[0]->adamw_step_range(h, begin, end);
}

}  // namespace kvs
