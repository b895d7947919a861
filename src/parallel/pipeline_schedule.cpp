#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/profile_range.h"
#include "dist/comm.h"

namespace kvs {

namespace {
constexpr int kActivation = 0, kGradient = 1;
}

std::vector<PipeOp> pipeline_schedule(const StageSplit& split, int rank, int m) {
  const int pp = split.pp, v = split.v;
  std::vector<PipeOp> ops;
  if (v == 1) {
    const int warm = std::min(pp - rank - 1, m);
    for (int i = 0; i < warm; ++i) ops.push_back({PipeOp::Forward, i, 0});
    for (int i = 0; i < m - warm; ++i) {
      ops.push_back({PipeOp::Forward, warm + i, 0});
      ops.push_back({PipeOp::Backward, i, 0});
    }
    for (int i = m - warm; i < m; ++i) ops.push_back({PipeOp::Backward, i, 0});
    return ops;
  }
  KVS_CHECK(m % pp == 0, "interleaved pipeline: {} micro-batches are not a multiple of pp ({})", m, pp);
  const int total = m * v, group = pp * v;
  auto micro = [&](int k) { return k / group * pp + k % pp; };
  auto chunk = [&](int k) { return k % group / pp; };
  // Megatron: with as many micro-batches as stages there is no steady state.
  const int warm = m == pp ? total : std::min((pp - rank - 1) * 2 + (v - 1) * pp, total);
  auto forward = [&](int k) { ops.push_back({PipeOp::Forward, micro(k), chunk(k)}); };
  auto backward = [&](int k) { ops.push_back({PipeOp::Backward, micro(k), v - 1 - chunk(k)}); };
  for (int k = 0; k < warm; ++k) forward(k);
  for (int k = 0; k < total - warm; ++k) {
    forward(warm + k);
    backward(k);
  }
  for (int k = total - warm; k < total; ++k) backward(k);
  return ops;
}

int micro_batches_in_flight(const std::vector<PipeOp>& ops) {
  std::map<int, bool> active;
  int most = 0;
  for (const PipeOp& op : ops) {
    if (op.kind == PipeOp::Forward) active[op.micro] = true;
    most = std::max(most, static_cast<int>(active.size()));
    if (op.kind == PipeOp::Backward && op.chunk == 0) active.erase(op.micro);  // its last pass here
  }
  return std::max(most, 1);
}

PipelineRunner::PipelineRunner(const StageSplit& split, const PipelineParallel& pp, int micro_batches)
    : split_(split), pp_(pp), ops_(pipeline_schedule(split, pp.rank, micro_batches)) {
  KVS_CHECK(pp.size == split.pp && pp.comm && pp.comm->size() == pp.size,
            "pipeline: rank {} of {} needs a communicator of that size", pp.rank, pp.size);
  slots_ = micro_batches_in_flight(ops_);
  in_.resize(static_cast<size_t>(slots_) * split.v);
}

void PipelineRunner::send(const float* data, size_t n, int to_stage, int kind) {
  // The sends to one rank arrive in the order that rank receives them (both
  // follow the same schedule); the tag names the receiving chunk and the kind.
  const size_t limit = static_cast<size_t>(slots_) * split_.v + 2;
  while (pending_.size() >= limit) {  // bound the memory held by sends in flight
    pp_.comm->wait(pending_.front().request);
    pending_.pop_front();
  }
  Pending p{0, std::vector<float>(data, data + n)};
  p.request = pp_.comm->isend(p.data.data(), n, dist::DType::F32, split_.rank_of(to_stage),
                              kind + 2 * split_.chunk_of(to_stage));
  pending_.push_back(std::move(p));
}

void PipelineRunner::recv(float* data, size_t n, int from_stage, int kind, int at_stage) {
  pp_.comm->recv(data, n, dist::DType::F32, split_.rank_of(from_stage), kind + 2 * split_.chunk_of(at_stage));
}

void PipelineRunner::finish_sends() {
  for (Pending& p : pending_) pp_.comm->wait(p.request);
  pending_.clear();
  device_flush();
}

bool PipelineRunner::on_device(const Engine& e) const { return e.stage_on_device() && pp_.comm->device_memory(); }

namespace {
// Device buffers move as raw bytes: counted in fp32 words (no reduction touches them).
size_t words(const Engine::DeviceBuffer& b) {
  KVS_CHECK(b.bytes % sizeof(float) == 0, "pipeline: a stage buffer of {} bytes is not whole 4-byte words", b.bytes);
  return b.bytes / sizeof(float);
}
}  // namespace

void PipelineRunner::device_send(const Engine::DeviceBuffer& buf, int to_stage) {
  device_flush();
  held_ = {buf, split_.rank_of(to_stage)};
}

void PipelineRunner::device_recv(const Engine::DeviceBuffer& buf, int from_stage) {
  const int from = split_.rank_of(from_stage);
  const auto* h = static_cast<const char*>(held_.buf.data);
  const auto* r = static_cast<const char*>(buf.data);
  const bool apart = h + held_.buf.bytes <= r || r + buf.bytes <= h;
  if (held_.to_rank >= 0 && held_.buf.bytes == buf.bytes && apart) {
    pp_.comm->send_recv(held_.buf.data, held_.to_rank, buf.data, from, words(buf), dist::DType::F32);
    held_.to_rank = -1;
    return;
  }
  device_flush();
  pp_.comm->recv(buf.data, words(buf), dist::DType::F32, from, 0);
}

void PipelineRunner::device_flush() {
  if (held_.to_rank < 0) return;
  pp_.comm->wait(pp_.comm->isend(held_.buf.data, words(held_.buf), dist::DType::F32, held_.to_rank, 0));
  held_.to_rank = -1;
}

double PipelineRunner::train(Engine& e, const std::vector<Batch>& micro, double grad_scale) {
  KVS_CHECK(e.slots() >= slots_, "pipeline: the engine has {} activation slots, the schedule needs {}", e.slots(),
            slots_);
  const int S = split_.stages(), v = split_.v;
  const bool device = on_device(e);
  // A send held back for the next receive is not enough for the interleaved
  // order: a model of the schedule in which a send completes only once its
  // receive is posted (as a large NCCL send does; the host shim's
  // KVS_SHIM_NCCL_RENDEZVOUS) hangs for every v > 1 with more micro-batches
  // than stages. Refused on every rank at once, not a hang at the first step.
  KVS_CHECK(!device || v == 1,
            "parallel.virtual_stages {}: the interleaved schedule over NCCL device buffers can deadlock (a send waits "
            "for its receive, which the peer posts only later); use parallel.virtual_stages 1 with NCCL, or the "
            "MPI backend (docs/PARALLEL.md)",
            v);
  using T = Engine::StageTensor;
  std::map<int, int> slot_of;  // micro-batch -> activation slot
  std::vector<bool> busy(slots_, false);
  double loss = 0;
  for (const PipeOp& op : ops_) {
    const int s = split_.stage(pp_.rank, op.chunk);
    const Batch& b = micro.at(op.micro);
    const size_t n = e.stage_floats(b);
    if (out_.size() < n) out_.resize(n);
    if (op.kind == PipeOp::Forward) {
      ProfileRange range("pipeline forward", op.micro);
      if (!slot_of.count(op.micro)) {
        const int free = static_cast<int>(std::find(busy.begin(), busy.end(), false) - busy.begin());
        KVS_CHECK(free < slots_, "pipeline: no free activation slot for micro-batch {}", op.micro);
        busy[free] = true;
        slot_of[op.micro] = free;
      }
      const int slot = slot_of[op.micro];
      if (device) {
        if (s > 0)
          device_recv(e.stage_device_buffer(slot, op.chunk, T::Input, b), s - 1);
        else
          device_flush();
        loss += e.stage_forward(slot, op.chunk, b, nullptr, nullptr, grad_scale);
        if (s < S - 1) device_send(e.stage_device_buffer(slot, op.chunk, T::Output, b), s + 1);
        continue;
      }
      std::vector<float>& in = in_[static_cast<size_t>(slot) * v + op.chunk];
      if (s > 0) {
        in.resize(n);
        recv(in.data(), n, s - 1, kActivation, s);
      }
      loss += e.stage_forward(slot, op.chunk, b, s > 0 ? in.data() : nullptr, s < S - 1 ? out_.data() : nullptr,
                              grad_scale);
      if (s < S - 1) send(out_.data(), n, s + 1, kActivation);
    } else {
      ProfileRange range("pipeline backward", op.micro);
      const int slot = slot_of.at(op.micro);
      if (device) {
        if (s < S - 1)
          device_recv(e.stage_device_buffer(slot, op.chunk, T::GradOutput, b), s + 1);
        else
          device_flush();
        e.stage_backward(slot, op.chunk, nullptr, nullptr);
        if (s > 0) device_send(e.stage_device_buffer(slot, op.chunk, T::GradInput, b), s - 1);
      } else {
        if (s < S - 1) {
          grad_in_.resize(n);
          recv(grad_in_.data(), n, s + 1, kGradient, s);
        }
        e.stage_backward(slot, op.chunk, s < S - 1 ? grad_in_.data() : nullptr, s > 0 ? out_.data() : nullptr);
        if (s > 0) send(out_.data(), n, s - 1, kGradient);
      }
      if (op.chunk == 0) {  // the micro-batch's last pass on this rank
        busy[slot] = false;
        slot_of.erase(op.micro);
      }
    }
  }
  finish_sends();
  return loss;
}

double PipelineRunner::evaluate(Engine& e, const Batch& b, float* token_losses, int32_t* argmax) {
  const int S = split_.stages();
  const size_t n = e.stage_floats(b);
  if (out_.size() < n) out_.resize(n);
  double loss = 0;
  const bool device = on_device(e);
  for (int c = 0; c < split_.v; ++c) {  // the virtual stages in order: this rank's chunks come in order
    const int s = split_.stage(pp_.rank, c);
    const bool last = s == S - 1;
    if (device) {
      if (s > 0)
        device_recv(e.stage_device_buffer(0, c, Engine::StageTensor::Input, b), s - 1);
      else
        device_flush();
      loss += e.stage_forward(0, c, b, nullptr, nullptr, -1.0, last ? token_losses : nullptr, last ? argmax : nullptr);
      if (!last) device_send(e.stage_device_buffer(0, c, Engine::StageTensor::Output, b), s + 1);
      continue;
    }
    std::vector<float>& in = in_[c];
    if (s > 0) {
      in.resize(n);
      recv(in.data(), n, s - 1, kActivation, s);
    }
    loss += e.stage_forward(0, c, b, s > 0 ? in.data() : nullptr, last ? nullptr : out_.data(), -1.0,
                            last ? token_losses : nullptr, last ? argmax : nullptr);
    if (!last) send(out_.data(), n, s + 1, kActivation);
  }
  finish_sends();
  return loss;
}

}  // namespace kvs
