// Pipeline schedules (docs/PARALLEL.md "Pipeline parallelism") and the runner
// that executes one on an engine holding a stage's part of the model.
//
// 1F1B (PipeDream-flush, Megatron's default): rank r of pp runs
// min(pp - r - 1, m) forwards (warm-up), then alternates one forward and one
// backward (steady state), then the remaining backwards (cool-down); at most
// pp - r micro-batches are in flight on rank r. Interleaved 1F1B (Megatron,
// virtual_stages = v > 1, m a multiple of pp): the m * v virtual micro-batches
// k visit chunk (k mod pp v) / pp of micro-batch (k / (pp v)) pp + k mod pp in
// the forward order (the chunks reversed for the backward), with
// (pp - r - 1) * 2 + (v - 1) * pp warm-up forwards, which cuts the bubble by v.
//
// The runner sends activations to the rank of the next virtual stage and
// gradients to the previous one, point to point (Communicator::isend/recv on
// the pipeline group), and receives what each pass needs just before it:
// host fp32 arrays (tagged isend / recv), or, for an engine that keeps them in
// device memory (Engine::stage_on_device) over a communicator that takes
// device memory (NCCL), the engine's own buffers in its format. NCCL has no
// tags and a large send waits for its receive, so there the transfers follow
// a plan computed from every rank's schedule (pipeline_rounds): in rounds,
// each rank runs at most one pass, then exchanges in one group exactly the
// transfers its peers post in the same round. A transfer waits until its
// receiver has room: an activation slot for a new micro-batch, or, for a
// gradient (one buffer on the receiver, which its backward works in), until
// it is for the receiver's next backward; a rank does not run a backward
// while its last input gradient (one buffer too) is unsent.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "model/engine.h"
#include "parallel/pipeline.h"

namespace kvs {

struct PipeOp {
  enum Kind { Forward, Backward } kind;
  int micro;  // micro-batch
  int chunk;  // this rank's chunk (its virtual stage is split.stage(rank, chunk))
};

inline bool operator==(const PipeOp& a, const PipeOp& b) {
  return a.kind == b.kind && a.micro == b.micro && a.chunk == b.chunk;
}

// One rank's passes over m micro-batches, in order.
std::vector<PipeOp> pipeline_schedule(const StageSplit& split, int rank, int m);
// Evaluation: one micro-batch's forward through this rank's chunks, in order.
std::vector<PipeOp> pipeline_forward_only(const StageSplit& split);

// The device path's plan (see above). A transfer on this rank: to or from
// `peer`, of the buffer of pass `op` on this rank (a send: the activations a
// forward produced, or the input gradient of a backward; a receive: the
// input of a forward, or the output gradient of a backward).
struct PipeTransfer {
  bool send;
  int peer;
  PipeOp op;
};
// One round on this rank: the pass it runs (an index into its schedule, or
// -1), then its transfers, in one group, in the order both ends post them.
struct PipeRound {
  int op = -1;
  std::vector<PipeTransfer> group;
};
// Rank `rank`'s rounds (those where it does anything), from every rank's
// schedule, each rank holding micro_batches_in_flight(its schedule) slots.
// A kvs::Error if no plan completes (none found for pp 2-8, v 1-4).
std::vector<PipeRound> pipeline_rounds(const StageSplit& split, const std::vector<std::vector<PipeOp>>& schedules,
                                       int rank);
// The most micro-batches a schedule has in flight (forwarded, not yet fully backwarded).
int micro_batches_in_flight(const std::vector<PipeOp>& ops);

class PipelineRunner {
 public:
  PipelineRunner(const StageSplit& split, const PipelineParallel& pp, int micro_batches);
  // Activation slots the engine needs for this schedule.
  int slots() const { return slots_; }
  // This rank holds the last stage: the loss and the model's outputs are here.
  bool holds_loss() const { return split_.rank_of(split_.stages() - 1) == pp_.rank; }
  // Forward and backward of every micro-batch. Returns the sum of the masked
  // token losses (on the rank of the last stage; 0 on the others).
  double train(Engine& e, const std::vector<Batch>& micro, double grad_scale);
  // Forward of one micro-batch through every stage (evaluation): the loss sum
  // and the per-token outputs on the last stage's rank (0 and untouched elsewhere).
  double evaluate(Engine& e, const Batch& b, float* token_losses, int32_t* argmax);

 private:
  void send(const float* data, size_t n, int to_stage, int kind);
  void recv(float* data, size_t n, int from_stage, int kind, int at_stage);
  void finish_sends();
  bool on_device(const Engine& e) const;
  // The device path: `rounds` of `ops` (pipeline_rounds), pass(op, slot)
  // running each pass; batch(micro) is the micro-batch's shape.
  void run_rounds(Engine& e, const std::vector<PipeOp>& ops, const std::vector<PipeRound>& rounds, int slots,
                  const std::function<const Batch&(int)>& batch, const std::function<void(const PipeOp&, int)>& pass);

  StageSplit split_;
  PipelineParallel pp_;
  std::vector<PipeOp> ops_;
  std::vector<PipeRound> rounds_, eval_rounds_;  // the device path's plans: training, evaluation
  int slots_ = 1;
  std::vector<std::vector<float>> in_;  // [slot * v + chunk]: the activations a forward received
  std::vector<float> grad_in_;         // the gradient a backward received
  std::vector<float> out_;             // a forward's output or a backward's input gradient, before it is sent
  struct Pending {
    int request;
    std::vector<float> data;
  };
  std::deque<Pending> pending_;  // sends not yet known to be complete
};

}  // namespace kvs
