// Thread replicas: the CPU engine's threads as data-parallel replicas
// inside one process. Each of R threads runs the whole forward and backward
// of its share of the micro-batch's sequences on one thread, with its own
// activations and gradients, and the replicas' gradients are summed into the
// first's before anything reads them (once per optimizer step, however many
// micro-batches it accumulates). The parameters and the optimizer are the
// first replica's, shared.
//
// Why: with the threads sharing every op, each op ends at a barrier where
// the faster thread waits for the slower (two vCPUs are never equally fast
// for long), and the libraries' threaded GEMMs lose a few points of the
// peak to their partition. Two one-thread processes on half the batch each
// ran lm-small 1.04-1.15x faster than one two-thread process; the replicas
// are that without the second process, and ran lm-small's steps 1.02-1.03x
// and lm-4x's 1.03-1.04x as fast as one engine on two threads (oneDNN; 1.04x
// on OpenBLAS; AMD Zen 4, docs/PERFORMANCE.md "Thread replicas"). More
// threads than two were never measured.
//
// The result is the same model step: the sum of every sequence's gradient,
// in another order (each replica's dW over its rows, then the sum), so the
// bits differ from one engine's in the last places, as another thread count's
// do. For a fixed thread count and batch the bits are fixed.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/cpu_engine.h"

namespace kvs {

// KVS_CPU_REPLICAS: "auto" (or unset, or ""), the default below, or "off":
// one engine whose threads share each op.
enum class CpuReplicas { kAuto, kOff };

// The user's value; another throws kvs::Error naming the variable.
CpuReplicas parse_cpu_replicas(const char* user);

// Throws kvs::Error for a bad KVS_CPU_REPLICAS, for main before any work.
void check_cpu_replicas_variable();

// The setting make_engine follows: KVS_CPU_REPLICAS's, unless
// set_cpu_replicas changed it (bench --compare-replicas).
CpuReplicas cpu_replicas_setting();
void set_cpu_replicas(CpuReplicas r);

// How many replicas a CPU engine gets under `setting`. kAuto: one per
// thread where there are at least 2 threads and no more than the
// micro-batch's sequences (each replica needs one); the engine holds the
// whole model alone (no tensor, context or pipeline parallelism; data
// parallelism over processes is fine); and the replicas' extra gradients
// ((threads - 1) x 4 bytes a parameter) are at most a quarter of what one
// engine holds (16 bytes a parameter and its activations). Otherwise 1.
int cpu_replicas_for(CpuReplicas setting, int threads, int max_batch, bool whole_model_alone, double params,
                     double activation_floats);
// The same for model `m` at micro-batches of max_batch x max_seq_len on
// `threads` threads under the current setting: make_engine's choice, and
// what `kvshift info` counts.
int cpu_replicas_for_model(const ModelConfig& m, int threads, int max_batch, int max_seq_len, bool whole_model_alone);

// ", as 2 thread replicas" for an engine on thread replicas, "" otherwise (the
// tail of train's "N threads").
std::string replicas_note(const Engine& e);

class CpuReplicaEngine : public Engine {
 public:
  // `replicas` >= 2 CpuEngines of the whole model, each sized for
  // ceil(max_batch / replicas) sequences.
  CpuReplicaEngine(const ModelConfig& m, int max_batch, int max_seq_len, int replicas);

  int replicas() const { return static_cast<int>(reps_.size()); }

  const ModelConfig& model_config() const override { return first().model_config(); }
  const ParamLayout& layout() const override { return first().layout(); }
  int max_batch() const override { return max_B_; }
  int max_seq_len() const override { return first().max_seq_len(); }

  void read_params_range(size_t begin, size_t n, float* host) const override;
  void write_params_range(size_t begin, size_t n, const float* host) override;
  void read_optimizer_range(size_t begin, size_t n, float* exp_avg, float* exp_avg_sq) const override;
  void write_optimizer_range(size_t begin, size_t n, const float* exp_avg, const float* exp_avg_sq) override;
  void read_grads(float* host) const override;
  void zero_grad() override;
  // B sequences in min(R, B) shares of whole sequences, one per replica and
  // thread; a single share runs on replica 0 with every thread.
  double forward_backward(const Batch& b, double grad_scale) override;
  double forward(const Batch& b, float* token_losses, int32_t* argmax, float* logits) override;
  double grad_norm() override;
  void adamw_step(const AdamWHyper& h) override;
  bool supports_sharded_step() const override { return true; }
  float* host_params() override { return reps_[0]->host_params(); }
  float* host_grads() override;
  double grad_sq_sum_range(size_t begin, size_t end) override;
  void adamw_step_range(const AdamWHyper& h, size_t begin, size_t end) override;
  void keep_optimizer_range(size_t begin, size_t end) override { reps_[0]->keep_optimizer_range(begin, end); }
  void reserve_optimizer_state() override { reps_[0]->reserve_optimizer_state(); }

 private:
  const CpuEngine& first() const { return *reps_[0]; }
  // Runs fn(r, share) for each replica's share of b's sequences, one thread
  // each; returns the sum of fn's results. Errors on any thread are rethrown
  // here.
  template <class Fn>
  double over_shares(const Batch& b, Fn fn);
  // Adds the other replicas' gradients into the first's and zeroes theirs
  // (when a backward ran since the last time).
  void gather_grads();

  std::vector<std::unique_ptr<CpuEngine>> reps_;
  int max_B_;
  bool pending_ = false;  // replicas other than the first hold gradients not yet gathered
};

}  // namespace kvs
