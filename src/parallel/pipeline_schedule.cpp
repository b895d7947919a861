#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "core/profile_range.h"
#include "dist/comm.h"

namespace kvs {

namespace {
constexpr int kActivation = 0, kGradient = 1;

// Activation slots by micro-batch: taken at the micro-batch's first use on
// this rank, given back after its last pass here (its chunk 0's backward).
class Slots {
 public:
  explicit Slots(int n) : busy_(n, false) {}
  int of(int micro) {
    if (auto it = slot_of_.find(micro); it != slot_of_.end()) return it->second;
    const int free = static_cast<int>(std::find(busy_.begin(), busy_.end(), false) - busy_.begin());
    KVS_CHECK(free < static_cast<int>(busy_.size()), "pipeline: no free activation slot for micro-batch {}", micro);
    busy_[free] = true;
    return slot_of_[micro] = free;
  }
  // The slot a micro-batch already holds (its backward: the forward took one).
  int held(int micro) const {
    auto it = slot_of_.find(micro);
    KVS_CHECK(it != slot_of_.end(), "pipeline: micro-batch {} holds no activation slot (a backward before its forward)",
              micro);
    return it->second;
  }
  void release(int micro) {
    busy_[slot_of_.at(micro)] = false;
    slot_of_.erase(micro);
  }

 private:
  std::map<int, int> slot_of_;
  std::vector<bool> busy_;
};
}  // namespace

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

std::vector<PipeOp> pipeline_forward_only(const StageSplit& split) {
  std::vector<PipeOp> ops;
  for (int c = 0; c < split.v; ++c) ops.push_back({PipeOp::Forward, 0, c});
  return ops;
}

std::vector<PipeRound> pipeline_rounds(const StageSplit& split, const std::vector<std::vector<PipeOp>>& schedules,
                                       int rank) {
  const int pp = split.pp, S = split.stages();
  KVS_CHECK(static_cast<int>(schedules.size()) == pp, "pipeline plan: {} schedules for {} ranks", schedules.size(), pp);
  // A transfer produced by pass `from_op` on rank `from` for pass `to_op` on rank `to`.
  struct Transfer {
    int from, to;
    PipeOp from_op, to_op;
  };
  struct Rank {
    size_t next = 0;                      // the next pass of its schedule
    int slots = 1;                        // activation slots (micro-batches held at once)
    std::set<int> held;                   // micro-batches holding a slot
    std::set<std::pair<int, int>> inputs; // (micro, chunk): forward inputs received
    bool has_grad = false;                // a received gradient waits in the backward's buffer...
    PipeOp grad{PipeOp::Backward, 0, 0};  // ...for this pass
    bool grad_unsent = false;             // its last backward's input gradient is not sent yet
  };
  std::vector<Rank> ranks(pp);
  for (int r = 0; r < pp; ++r) ranks[r].slots = micro_batches_in_flight(schedules[r]);
  auto next_backward = [&](int r) -> const PipeOp* {
    for (size_t i = ranks[r].next; i < schedules[r].size(); ++i)
      if (schedules[r][i].kind == PipeOp::Backward) return &schedules[r][i];
    return nullptr;
  };
  std::vector<Transfer> pending;  // produced, not yet sent: in the order they were produced
  std::vector<PipeRound> out;
  for (int round = 0;; ++round) {
    bool done = pending.empty(), progress = false;
    PipeRound mine;
    for (int r = 0; r < pp; ++r) {  // each rank's next pass, if what it needs is here
      Rank& k = ranks[r];
      if (k.next == schedules[r].size()) continue;
      done = false;
      const PipeOp& op = schedules[r][k.next];
      const int s = split.stage(r, op.chunk);
      if (op.kind == PipeOp::Forward) {
        if (s > 0 && !k.inputs.count({op.micro, op.chunk})) continue;
        if (!k.held.count(op.micro)) {
          if (static_cast<int>(k.held.size()) >= k.slots) continue;
          k.held.insert(op.micro);
        }
        if (s < S - 1)
          pending.push_back({r, split.rank_of(s + 1), op, {PipeOp::Forward, op.micro, split.chunk_of(s + 1)}});
      } else {
        if (s < S - 1 && !(k.has_grad && k.grad == op)) continue;
        if (s > 0 && k.grad_unsent) continue;
        k.has_grad = false;
        if (s > 0) {
          pending.push_back({r, split.rank_of(s - 1), op, {PipeOp::Backward, op.micro, split.chunk_of(s - 1)}});
          k.grad_unsent = true;
        }
        if (op.chunk == 0) k.held.erase(op.micro);  // the micro-batch's last pass here
      }
      if (r == rank) mine.op = static_cast<int>(k.next);
      ++k.next;
      progress = true;
    }
    if (done) break;
    // The transfers whose receivers have room, in one group per rank.
    std::vector<Transfer> waiting;
    bool moved = false;
    for (const Transfer& t : pending) {
      Rank& to = ranks[t.to];
      bool room = false;
      if (t.to_op.kind == PipeOp::Forward) {
        room = to.held.count(t.to_op.micro) || static_cast<int>(to.held.size()) < to.slots;
        if (room) {
          to.held.insert(t.to_op.micro);
          to.inputs.insert({t.to_op.micro, t.to_op.chunk});
        }
      } else {
        const PipeOp* b = next_backward(t.to);
        room = !to.has_grad && b && *b == t.to_op;
        if (room) {
          to.has_grad = true;
          to.grad = t.to_op;
          ranks[t.from].grad_unsent = false;
        }
      }
      if (!room) {
        waiting.push_back(t);
        continue;
      }
      moved = true;
      if (t.from == rank) mine.group.push_back({true, t.to, t.from_op});
      if (t.to == rank) mine.group.push_back({false, t.from, t.to_op});
    }
    pending.swap(waiting);
    KVS_CHECK(progress || moved,
              "pipeline: no communication plan for pp {} with {} virtual stages and these schedules (stuck at round "
              "{})",
              pp, split.v, round);
    if (mine.op >= 0 || !mine.group.empty()) out.push_back(std::move(mine));
  }
  return out;
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
}

bool PipelineRunner::on_device(const Engine& e) const { return e.stage_on_device() && pp_.comm->device_memory(); }

namespace {
// Device buffers move as raw bytes: counted in fp32 words (no reduction touches them).
size_t words(const Engine::DeviceBuffer& b) {
  KVS_CHECK(b.bytes % sizeof(float) == 0, "pipeline: a stage buffer of {} bytes is not whole 4-byte words", b.bytes);
  return b.bytes / sizeof(float);
}
}  // namespace

void PipelineRunner::run_rounds(Engine& e, const std::vector<PipeOp>& ops, const std::vector<PipeRound>& rounds,
                                int slots, const std::function<const Batch&(int)>& batch,
                                const std::function<void(const PipeOp&, int)>& pass) {
  // A micro-batch takes its slot at its first forward or the receive of its input, whichever comes first
  // (the plan keeps within `slots`).
  Slots slot(slots);
  using T = Engine::StageTensor;
  std::vector<dist::Communicator::P2P> group;
  for (const PipeRound& round : rounds) {
    if (round.op >= 0) {
      const PipeOp& op = ops.at(round.op);
      pass(op, op.kind == PipeOp::Forward ? slot.of(op.micro) : slot.held(op.micro));
      if (op.kind == PipeOp::Backward && op.chunk == 0) slot.release(op.micro);  // free for this round's receives
    }
    group.clear();
    for (const PipeTransfer& t : round.group) {
      const bool forward = t.op.kind == PipeOp::Forward;
      const T which = t.send ? (forward ? T::Output : T::GradInput) : (forward ? T::Input : T::GradOutput);
      // The gradients' buffers are the same for every slot (Engine::stage_device_buffer): a backward's input
      // gradient may go out after its micro-batch gave its slot back.
      const int s = forward ? slot.of(t.op.micro) : 0;
      const Engine::DeviceBuffer buf = e.stage_device_buffer(s, t.op.chunk, which, batch(t.op.micro));
      group.push_back({t.send, buf.data, words(buf), t.peer});
    }
    pp_.comm->exchange(group, dist::DType::F32);
  }
}

double PipelineRunner::train(Engine& e, const std::vector<Batch>& micro, double grad_scale) {
  KVS_CHECK(e.slots() >= slots_, "pipeline: the engine has {} activation slots, the schedule needs {}", e.slots(),
            slots_);
  const int S = split_.stages(), v = split_.v;
  double loss = 0;
  if (on_device(e)) {  // NCCL on the engine's buffers: the plan's rounds
    if (rounds_.empty()) {
      std::vector<std::vector<PipeOp>> all;
      for (int r = 0; r < split_.pp; ++r) all.push_back(pipeline_schedule(split_, r, static_cast<int>(micro.size())));
      KVS_CHECK(all[pp_.rank] == ops_, "pipeline: {} micro-batches, the schedule was made for another count",
                micro.size());
      rounds_ = pipeline_rounds(split_, all, pp_.rank);
    }
    run_rounds(e, ops_, rounds_, slots_, [&](int m) -> const Batch& { return micro.at(m); },
               [&](const PipeOp& op, int slot) {
                 if (op.kind == PipeOp::Forward) {
                   ProfileRange range("pipeline forward", op.micro);
                   loss += e.stage_forward(slot, op.chunk, micro.at(op.micro), nullptr, nullptr, grad_scale);
                 } else {
                   ProfileRange range("pipeline backward", op.micro);
                   e.stage_backward(slot, op.chunk, nullptr, nullptr);
                 }
               });
    return loss;
  }
  Slots slot(slots_);
  for (const PipeOp& op : ops_) {
    const int s = split_.stage(pp_.rank, op.chunk);
    const Batch& b = micro.at(op.micro);
    const size_t n = e.stage_floats(b);
    if (out_.size() < n) out_.resize(n);
    if (op.kind == PipeOp::Forward) {
      ProfileRange range("pipeline forward", op.micro);
      const int at = slot.of(op.micro);
      std::vector<float>& in = in_[static_cast<size_t>(at) * v + op.chunk];
      if (s > 0) {
        in.resize(n);
        recv(in.data(), n, s - 1, kActivation, s);
      }
      loss += e.stage_forward(at, op.chunk, b, s > 0 ? in.data() : nullptr, s < S - 1 ? out_.data() : nullptr,
                              grad_scale);
      if (s < S - 1) send(out_.data(), n, s + 1, kActivation);
    } else {
      ProfileRange range("pipeline backward", op.micro);
      const int at = slot.held(op.micro);
      if (s < S - 1) {
        grad_in_.resize(n);
        recv(grad_in_.data(), n, s + 1, kGradient, s);
      }
      e.stage_backward(at, op.chunk, s < S - 1 ? grad_in_.data() : nullptr, s > 0 ? out_.data() : nullptr);
      if (s > 0) send(out_.data(), n, s - 1, kGradient);
      if (op.chunk == 0) slot.release(op.micro);  // the micro-batch's last pass on this rank
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
  auto forward = [&](int slot, int c, const float* in, float* out) {
    const bool last = split_.stage(pp_.rank, c) == S - 1;
    loss += e.stage_forward(slot, c, b, in, out, -1.0, last ? token_losses : nullptr, last ? argmax : nullptr);
  };
  if (on_device(e)) {
    const std::vector<PipeOp> ops = pipeline_forward_only(split_);
    if (eval_rounds_.empty())
      eval_rounds_ = pipeline_rounds(split_, std::vector<std::vector<PipeOp>>(split_.pp, ops), pp_.rank);
    run_rounds(e, ops, eval_rounds_, 1, [&](int) -> const Batch& { return b; },
               [&](const PipeOp& op, int slot) { forward(slot, op.chunk, nullptr, nullptr); });
    return loss;
  }
  for (int c = 0; c < split_.v; ++c) {  // the virtual stages in order: this rank's chunks come in order
    const int s = split_.stage(pp_.rank, c);
    std::vector<float>& in = in_[c];
    if (s > 0) {
      in.resize(n);
      recv(in.data(), n, s - 1, kActivation, s);
    }
    forward(0, c, s > 0 ? in.data() : nullptr, s == S - 1 ? nullptr : out_.data());
    if (s < S - 1) send(out_.data(), n, s + 1, kActivation);
  }
  finish_sends();
  return loss;
}

}  // namespace kvs
