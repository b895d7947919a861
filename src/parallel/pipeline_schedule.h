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
// host fp32 arrays, or, for an engine that keeps them in device memory
// (Engine::stage_on_device) over a communicator that takes device memory
// (NCCL), the engine's own buffers in its format. NCCL has no tags and a send
// waits for its receiver, so there each send is held back and goes out in
// one group with the pass's next receive (Megatron's send_forward_recv_backward
// and send_backward_recv_forward), or alone before the next pass without one.
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include "model/engine.h"
#include "parallel/pipeline.h"

namespace kvs {

struct PipeOp {
  enum Kind { Forward, Backward } kind;
  int micro;  // micro-batch
  int chunk;  // this rank's chunk (its virtual stage is split.stage(rank, chunk))
};

// One rank's passes over m micro-batches, in order.
std::vector<PipeOp> pipeline_schedule(const StageSplit& split, int rank, int m);
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
  // The device path: a send held back, a receive (with the held send in one
  // group when they fit), the held send alone.
  void device_send(const Engine::DeviceBuffer& buf, int to_stage);
  void device_recv(const Engine::DeviceBuffer& buf, int from_stage);
  void device_flush();
  bool on_device(const Engine& e) const;

  StageSplit split_;
  PipelineParallel pp_;
  std::vector<PipeOp> ops_;
  int slots_ = 1;
  std::vector<std::vector<float>> in_;  // [slot * v + chunk]: the activations a forward received
  std::vector<float> grad_in_;         // the gradient a backward received
  std::vector<float> out_;             // a forward's output or a backward's input gradient, before it is sent
  struct Pending {
    int request;
    std::vector<float> data;
  };
  std::deque<Pending> pending_;  // sends not yet known to be complete
  struct HeldSend {
    Engine::DeviceBuffer buf;
    int to_rank = -1;  // -1: none held
  } held_;
};

}  // namespace kvs
