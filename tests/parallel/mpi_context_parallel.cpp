// Context parallelism against one process: the world is one CP group of size
// n (1, 2 or 4 under ctest). Every rank runs the single-process engine on the
// whole micro-batch too; the CP engine's loss, per-token losses and argmax
// must equal it and its gradients, summed over the group, must equal the
// single process's.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/cpu_engine.h"
#include "parallel/mpi_world.h"

namespace kvs {
namespace {

using testing_util::rel_err;
using testing_util::world;

struct Variant {
  const char* name;
  int window;
  bool shift_q, gate, rope;
  DocumentBoundaries docs;
};

ModelConfig model_of(const Variant& v) {
  ModelConfig m;
  m.hidden_size = 32;
  m.intermediate_size = 48;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.vocab_size = 40;
  m.max_position_embeddings = 32;
  m.kv_shift.window = v.window;
  m.kv_shift.shift_q = v.shift_q;
  m.kv_shift.parametrization = v.gate ? ShiftParametrization::SigmoidGate : ShiftParametrization::Free;
  m.position_encoding = v.rope ? PositionEncoding::Rope : PositionEncoding::None;
  m.document_boundaries = v.docs;
  m.bos_token_id = 1;
  return m;
}

constexpr int kB = 2, kT = 24;  // 24 splits into 2 x cp chunks for cp = 1, 2, 4 (chunks of 3 at cp = 4)

// Sequence 0 has a BOS exactly on a chunk start of every layout (position 12)
// and documents running across the other chunk edges; sequence 1 a BOS inside
// a chunk (position 7) and one at position 0.
struct Data {
  std::vector<int32_t> in, tg;
  std::vector<float> mask;
  Batch batch() const { return {kB, kT, in.data(), tg.data(), mask.data()}; }
};
Data data_of(int V) {
  Data d;
  for (int b = 0; b < kB; ++b)
    for (int t = 0; t < kT; ++t) {
      d.in.push_back(2 + (7 * t + 11 * b + t * t) % (V - 2));
      d.tg.push_back(2 + (5 * t + 3 * b) % (V - 2));
      d.mask.push_back((t + b) % 5 == 3 ? 0.0f : 1.0f);
    }
  d.in[12] = 1;
  d.in[kT + 7] = 1;
  d.in[kT] = 1;
  return d;
}

void expect_cp_matches_one_process(const Variant& v, const Data& data, double scale) {
  SCOPED_TRACE(v.name);
  const ModelConfig m = model_of(v);
  const int cp = world().size(), r = world().rank();
  CpuEngine one(m, kB, kT), part(m, kB, kT, {}, ContextParallel{r, cp, &world()});
  std::vector<float> p(one.layout().total);
  init_params(one.layout(), m, 5, p.data());
  one.write_params(p.data());
  part.write_params(p.data());
  const Batch b = data.batch();

  one.zero_grad();
  part.zero_grad();
  const double want = one.forward_backward(b, scale);
  const double got = part.forward_backward(b, scale);
  EXPECT_NEAR(got, want, 1e-5 * std::abs(want));
  std::vector<float> g1(p.size()), g2(p.size());
  one.read_grads(g1.data());
  part.read_grads(g2.data());
  world().all_reduce(g2.data(), g2.size(), dist::DType::F32, dist::ReduceOp::Sum);  // the ranks' shares
  EXPECT_LT(rel_err(g2.data(), g1.data(), g1.size()), 2e-5);
  // The shift's gradients (the halo's way back included) tensor by tensor.
  for (const ParamTensor& t : one.layout().tensors) {
    if (t.kind != ParamKind::Shift) continue;
    EXPECT_LT(rel_err(g2.data() + t.offset, g1.data() + t.offset, t.numel), 2e-5) << t.name;
  }

  std::vector<float> l1(kB * kT), l2(kB * kT);
  std::vector<int32_t> a1(kB * kT), a2(kB * kT);
  const double f1 = one.forward(b, l1.data(), a1.data(), nullptr);
  const double f2 = part.forward(b, l2.data(), a2.data(), nullptr);
  EXPECT_NEAR(f2, f1, 1e-5 * std::abs(f1));
  EXPECT_LT(rel_err(l2.data(), l1.data(), l1.size()), 1e-5);
  EXPECT_EQ(a2, a1);
}

TEST(ContextParallelEngine, EngineMatchesOneProcess) {
  const Data data = data_of(40);
  for (const Variant& v : {Variant{"vanilla-free K/V window 1", 1, false, false, true, DocumentBoundaries::None},
                           Variant{"window 2 + Q shift", 2, true, false, true, DocumentBoundaries::None},
                           Variant{"window 3, documents (shift and attention)", 3, false, false, true,
                                   DocumentBoundaries::ShiftAndAttention},
                           Variant{"sigmoid gate, no RoPE, documents (shift)", 1, false, true, false,
                                   DocumentBoundaries::Shift}})
    expect_cp_matches_one_process(v, data, 1.0 / 40);
}

// A batch shorter than the engine's sequence length whose chunks are shorter
// than the window (an eval or a CLI forward) is a one-line error: each chunk
// but the first would read its halo from before the previous chunk.
TEST(ContextParallelEngine, ChunksShorterThanTheWindowAreAnError) {
  const int cp = world().size(), r = world().rank();
  if (cp == 1) GTEST_SKIP() << "needs context parallelism (2 or more ranks)";
  const ModelConfig m = model_of(Variant{"window 3", 3, false, false, true, DocumentBoundaries::None});
  CpuEngine part(m, kB, kT, {}, ContextParallel{r, cp, &world()});
  const Data data = data_of(40);
  const int short_T = 2 * cp * 2;  // chunks of 2 < window 3
  const Batch b{1, short_T, data.in.data(), data.tg.data(), nullptr};
  std::string msg;
  try {
    part.forward(b, nullptr, nullptr, nullptr);
  } catch (const Error& e) {
    msg = e.what();
  }
  for (const std::string& part_of : {std::string("chunks of 2"), std::string("shorter than the KV shift window 3"),
                                     "at least " + std::to_string(2 * cp * 3) + " positions"})
    EXPECT_NE(msg.find(part_of), std::string::npos) << "missing '" << part_of << "' in: '" << msg << "'";
}

// Only the first position of each chunk but the first is scored: every
// position's own signal is then the loss at a chunk start, whose K̂/V̂ mix the
// previous chunk's last raw rows. The gradient that reaches those rows
// travels back through the halo to the rank that owns them.
TEST(ContextParallelEngine, HaloGradientReachesThePreviousChunk) {
  Data data = data_of(40);
  const int cp = world().size(), Tc = kT / (2 * cp);
  std::fill(data.mask.begin(), data.mask.end(), 0.0f);
  for (int b = 0; b < kB; ++b)
    for (int c = 1; c < 2 * cp; ++c) data.mask[b * kT + c * Tc] = 1.0f;
  for (int t = 0; t < kB * kT; ++t) data.in[t] = 2 + t % 7;  // no BOS: the shift crosses every edge
  expect_cp_matches_one_process(Variant{"chunk starts only", 1, false, false, true, DocumentBoundaries::None}, data,
                                0.5);
}

}  // namespace
}  // namespace kvs
