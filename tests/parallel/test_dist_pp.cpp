// Pipeline parallelism through `kvshift train` under mpirun (docs/PARALLEL.md
// "Pipeline parallelism"): 1F1B at pp = 2 and 4, the interleaved schedule with
// 2 virtual stages, and pp with dp, tp and cp, each following the
// single-process loss curve with the same global batch (relative difference
// <= 1e-6 per step and evaluation), vanilla, shifted GQA and tied embeddings;
// resume across layouts; the schedules themselves; one-line errors for shapes
// that do not split.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include "dist_test_util.h"
#include "parallel/pipeline_schedule.h"

using namespace kvs::testing_util;

namespace {

constexpr double kTol = 1e-6;

// tiny_config with 4 layers (pp = 4 has one each) and a learning rate at
// which 20 steps stay far from the chaotic regime, where any two summation
// orders drift apart whatever the layout (dp = 2 alone reaches 1e-6 at 1e-2).
nlohmann::json pp_config(bool shift, bool tied) {
  nlohmann::json c = tiny_config(shift, 4);
  c["model"]["num_hidden_layers"] = 4;
  c["model"]["tie_word_embeddings"] = tied;
  c["train"]["lr"] = 3e-3;
  return c;
}

using Layout = TrainLayout;
const Layout kPp2{2, "--set parallel.pp=2", "pp2"};
const Layout kPp4{4, "--set parallel.pp=4", "pp4"};
const Layout kPp2v2{2, "--set parallel.pp=2 --set parallel.virtual_stages=2", "pp2 interleaved v2"};
const Layout kPp2Dp2{4, "--set parallel.pp=2", "dp2 x pp2"};
const Layout kPp2Tp2{4, "--set parallel.pp=2 --set parallel.tp=2", "pp2 x tp2"};
const Layout kPp2Cp2{4, "--set parallel.pp=2 --set parallel.cp=2", "pp2 x cp2"};
const Layout kUneven{2, "--set parallel.pp=2 --set 'parallel.layers_per_stage=[3,1]'", "pp2 layers 3+1"};

// Every layout in `layouts` against one process, on the config `cfg`.
void follow_single(const nlohmann::json& cfg, std::initializer_list<Layout> layouts, const std::string& what) {
  expect_layouts_follow_single_process(cfg, layouts, what, kTol);
}

std::string ops_string(const std::vector<kvs::PipeOp>& ops) {
  std::string s;
  for (const auto& o : ops) {  // appended piece by piece: GCC 12 warns (-Wrestrict) about the chained +
    s += o.kind == kvs::PipeOp::Forward ? 'F' : 'B';
    s += std::to_string(o.micro);
    if (o.chunk) s += '.' + std::to_string(o.chunk);
    s += ' ';
  }
  return s;
}

}  // namespace

// The schedules themselves: 1F1B's warm-up, steady state and cool-down, and
// Megatron's interleaved order (checked against the order its formulas give
// for pp = 2, v = 2, m = 4), every pass once, and the micro-batches in flight.
TEST(PipelineSchedule, OneFOneBAndInterleavedOrders) {
  kvs::StageSplit one{4, 1, {0, 1, 2, 3, 4}};
  EXPECT_EQ(ops_string(kvs::pipeline_schedule(one, 0, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  EXPECT_EQ(ops_string(kvs::pipeline_schedule(one, 3, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 ");
  EXPECT_EQ(kvs::micro_batches_in_flight(kvs::pipeline_schedule(one, 0, 6)), 4);  // pp - rank
  EXPECT_EQ(kvs::micro_batches_in_flight(kvs::pipeline_schedule(one, 3, 6)), 1);
  EXPECT_EQ(ops_string(kvs::pipeline_schedule(one, 1, 2)), "F0 F1 B0 B1 ");  // fewer micro-batches than stages

  kvs::StageSplit two{2, 2, {0, 1, 2, 3, 4}};
  // rank 0: warm-up (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 forwards, then 1F1B, then the rest.
  EXPECT_EQ(ops_string(kvs::pipeline_schedule(two, 0, 4)), "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3 ");
  EXPECT_EQ(ops_string(kvs::pipeline_schedule(two, 1, 4)), "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3 ");
  for (int rank : {0, 1}) {
    int f = 0, b = 0;
    for (const auto& o : kvs::pipeline_schedule(two, rank, 4)) (o.kind == kvs::PipeOp::Forward ? f : b)++;
    EXPECT_EQ(f, 8);
    EXPECT_EQ(b, 8);
  }
}

// The device path's plan (pipeline_rounds), run by a model of NCCL: a rank
// runs its round's pass once what it needs has arrived, then posts its
// round's group; a group completes when every transfer in it has its
// counterpart posted (a send waits for its receive: rendezvous, the worst
// case), the k-th message from rank a to rank b matching b's k-th from a. For
// pp 2-8, v 1-4 and several micro-batch counts, and evaluation: no deadlock,
// every pass once and in order, each receive matched to the send of the pass
// that feeds it, nothing used before it arrived, and the buffers' rules: at
// most the schedule's slots held, a received gradient consumed by the next
// backward before another arrives, an input gradient sent before the next
// backward.
namespace {
std::string check_plan(const kvs::StageSplit& split, const std::vector<std::vector<kvs::PipeOp>>& ops) {
  using kvs::PipeOp;
  const int pp = split.pp, S = split.stages();
  std::vector<std::vector<kvs::PipeRound>> plan;
  for (int r = 0; r < pp; ++r) plan.push_back(kvs::pipeline_rounds(split, ops, r));
  struct Msg {
    PipeOp from_op;
  };
  std::vector<std::vector<std::vector<Msg>>> sent(pp, std::vector<std::vector<Msg>>(pp));  // [from][to]: posted sends
  std::vector<std::vector<size_t>> recvs_posted(pp, std::vector<size_t>(pp, 0));           // [to][from]
  struct State {
    size_t round = 0, next_op = 0;
    bool ran = false, posted = false;
    std::vector<size_t> send_at, recv_at;  // per transfer of the posted group: its index in its pair's sequence
    std::set<std::pair<int, int>> inputs;  // forward inputs arrived (micro, chunk)
    bool grad_in = false, grad_out_unsent = false;
    PipeOp grad{};
    std::set<int> held;  // micro-batches holding a slot
  };
  std::vector<State> st(pp);
  auto fail = [&](int r, const std::string& why) {
    return "rank " + std::to_string(r) + " round " + std::to_string(st[r].round) + ": " + why;
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < pp; ++r) {
      State& k = st[r];
      if (k.round == plan[r].size()) continue;
      const kvs::PipeRound& round = plan[r][k.round];
      if (!k.ran) {
        if (round.op >= 0) {
          if (static_cast<size_t>(round.op) != k.next_op) return fail(r, "a pass out of order");
          const PipeOp& op = ops[r][round.op];
          const int s = split.stage(r, op.chunk);
          if (op.kind == PipeOp::Forward) {
            if (s > 0 && !k.inputs.count({op.micro, op.chunk})) return fail(r, "a forward before its input");
            k.held.insert(op.micro);
          } else {
            if (s < S - 1 && !(k.grad_in && k.grad == op)) return fail(r, "a backward without its gradient");
            if (s == S - 1 && k.grad_in) return fail(r, "the head's backward over a gradient not yet used");
            if (k.grad_out_unsent) return fail(r, "a backward while the last input gradient is unsent");
            k.grad_in = false;
            k.grad_out_unsent = s > 0;
          }
          if (static_cast<int>(k.held.size()) > kvs::micro_batches_in_flight(ops[r])) return fail(r, "too many slots");
          if (op.kind == PipeOp::Backward && op.chunk == 0)
            k.held.erase(op.micro);  // its last pass here: the slot is free for the round's receives
          ++k.next_op;
        }
        k.ran = true;
      }
      if (!k.posted) {
        k.send_at.clear();
        k.recv_at.clear();
        for (const kvs::PipeTransfer& t : round.group) {
          if (t.send) {
            k.send_at.push_back(sent[r][t.peer].size());
            sent[r][t.peer].push_back({t.op});
          } else {
            k.recv_at.push_back(recvs_posted[r][t.peer]++);
          }
        }
        k.posted = true;
        moved = true;
      }
      // Complete once every counterpart is posted.
      bool complete = true;
      size_t si = 0, ri = 0;
      for (const kvs::PipeTransfer& t : round.group)
        complete = complete && (t.send ? recvs_posted[t.peer][r] > k.send_at[si++]
                                       : sent[t.peer][r].size() > k.recv_at[ri++]);
      if (!complete) continue;
      ri = 0;
      for (const kvs::PipeTransfer& t : round.group) {
        if (t.send) {
          if (t.op.kind == PipeOp::Backward) k.grad_out_unsent = false;
          continue;
        }
        const PipeOp from = sent[t.peer][r][k.recv_at[ri++]].from_op;
        const int s_from = split.stage(t.peer, from.chunk), s_to = split.stage(r, t.op.chunk);
        if (from.kind != t.op.kind || from.micro != t.op.micro ||
            s_to != (t.op.kind == PipeOp::Forward ? s_from + 1 : s_from - 1))
          return fail(r, "a receive matched to another pass's send");
        if (t.op.kind == PipeOp::Forward) {
          k.inputs.insert({t.op.micro, t.op.chunk});
          k.held.insert(t.op.micro);
          if (static_cast<int>(k.held.size()) > kvs::micro_batches_in_flight(ops[r])) return fail(r, "too many slots");
        } else {
          if (k.grad_in) return fail(r, "a gradient over one not yet used");
          const PipeOp* next = nullptr;
          for (size_t i = k.next_op; i < ops[r].size() && !next; ++i)
            if (ops[r][i].kind == PipeOp::Backward) next = &ops[r][i];
          if (!next || !(*next == t.op)) return fail(r, "a gradient for a backward other than the next");
          k.grad_in = true;
          k.grad = t.op;
        }
      }
      ++k.round;
      k.ran = k.posted = false;
      moved = true;
    }
  }
  for (int r = 0; r < pp; ++r) {
    if (st[r].round != plan[r].size()) return fail(r, "deadlock");
    if (st[r].next_op != ops[r].size()) return fail(r, "passes left out");
  }
  return "";
}
}  // namespace

TEST(PipelineSchedule, TheDevicePlanCompletesUnderRendezvousAndKeepsTheBuffersRules) {
  for (int pp = 2; pp <= 8; ++pp)
    for (int v = 1; v <= 4; ++v) {
      std::vector<int> layers(pp * v + 1);
      for (int i = 0; i <= pp * v; ++i) layers[i] = i;
      const kvs::StageSplit split{pp, v, layers};
      std::vector<int> counts = {pp, 2 * pp, 3 * pp};
      if (v == 1) counts.insert(counts.end(), {1, pp - 1, pp + 1, 2 * pp + 3});
      for (int m : counts) {
        if (m < 1) continue;
        std::vector<std::vector<kvs::PipeOp>> ops;
        for (int r = 0; r < pp; ++r) ops.push_back(kvs::pipeline_schedule(split, r, m));
        EXPECT_EQ(check_plan(split, ops), "") << "pp " << pp << " v " << v << " m " << m;
      }
      const std::vector<std::vector<kvs::PipeOp>> eval(pp, kvs::pipeline_forward_only(split));
      EXPECT_EQ(check_plan(split, eval), "") << "evaluation, pp " << pp << " v " << v;
    }
  // The bubble: rounds of the busiest rank against its passes, 2 (pp - 1) more (Megatron's count, in chunk passes).
  const kvs::StageSplit split{4, 2, {0, 1, 2, 3, 4, 5, 6, 7, 8}};
  std::vector<std::vector<kvs::PipeOp>> ops;
  for (int r = 0; r < 4; ++r) ops.push_back(kvs::pipeline_schedule(split, r, 8));
  EXPECT_LE(kvs::pipeline_rounds(split, ops, 0).size(), ops[0].size() + 2 * 3);
}

TEST(PipelineParallel, FollowsSingleProcess) {
  follow_single(pp_config(false, false), {kPp2, kPp4}, "vanilla");
  follow_single(pp_config(true, false), {kPp2, kPp4, kPp2v2, kPp2Dp2, kPp2Tp2, kPp2Cp2, kUneven}, "shifted GQA");
  follow_single(pp_config(true, true), {kPp2, kPp4, kPp2v2, kPp2Dp2, kPp2Tp2, kPp2Cp2}, "shifted GQA, tied");
}

TEST(PipelineParallel, ResumeAcrossLayouts) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, pp_config(true, true).dump());
  train(0, cfg, tmp / "full");
  const Curve full = read_metrics(tmp / "full");
  const std::string a = tmp / "pp_to_one", b = tmp / "one_to_pp";
  train(kPp2.np, cfg, a, kPp2.flags + " --set train.steps=10");
  train(0, cfg, a, "--resume");
  expect_close(read_metrics(a), full, 11, "resume pp2 -> one process", kTol);
  train(0, cfg, b, "--set train.steps=10");
  train(kPp2v2.np, cfg, b, kPp2v2.flags + " --resume");
  expect_close(read_metrics(b), full, 11, "resume one process -> pp2 interleaved", kTol);
  // Saved at pp2 x tp2: each stage's tensor-parallel slices are assembled
  // before they travel to rank 0, tensor by tensor.
  const std::string c = tmp / "pp_tp_to_pp";
  train(kPp2Tp2.np, cfg, c, kPp2Tp2.flags + " --set train.steps=10");
  train(kPp2.np, cfg, c, kPp2.flags + " --resume");
  expect_close(read_metrics(c), full, 11, "resume pp2 x tp2 -> pp2", kTol);
}

TEST(PipelineParallel, ShapesThatDoNotSplitAreOneLineErrors) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, pp_config(true, false).dump());
  auto error_of_run = [&](int np, const std::string& flags) {
    const auto r = run_kvshift("train --quiet --config " + cfg + " --run-dir " + (tmp / "bad") + " " + flags,
                               np ? mpirun(np) : "");
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_FALSE(std::filesystem::exists(tmp / "bad/metrics.jsonl"));
    return r.out;
  };
  EXPECT_NE(error_of_run(0, "--set parallel.pp=3").find("parallel.pp x parallel.virtual_stages (3 x 1) must divide "
                                                        "model.num_hidden_layers (4)"),
            std::string::npos);
  EXPECT_NE(error_of_run(0, "--set parallel.pp=2 --set 'parallel.layers_per_stage=[2,1]'")
                .find("parallel.layers_per_stage: the stages hold 3 layers, model.num_hidden_layers is 4"),
            std::string::npos);
  EXPECT_NE(error_of_run(0, "--set parallel.virtual_stages=2")
                .find("parallel.virtual_stages (2): interleaving needs pipeline parallelism (parallel.pp > 1) (without it: "
                      "--set parallel.virtual_stages=1)"),
            std::string::npos);
  EXPECT_NE(error_of_run(2, "--set parallel.pp=2 --set parallel.virtual_stages=2 --set train.grad_accum_steps=3")
                .find("the interleaved schedule needs each rank's micro-batches (train.grad_accum_steps / dp = 3) to "
                      "be a multiple of parallel.pp (2)"),
            std::string::npos);
}
