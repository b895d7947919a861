// Engine-level tests beyond the PyTorch oracle: AdamW against torch.optim.AdamW's
// documented update computed here in double, gradient accumulation, smaller
// batches in a larger plan, the LR schedule, parameter initialisation and
// the thread replicas against one engine.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "model/cpu_engine.h"
#include "model/cpu_replicas.h"
#include "model/engine_ranges.h"
#include "model/params.h"
#include "train/schedule.h"

namespace {

kvs::ModelConfig tiny_model(bool shift = true, bool tied = false) {
  kvs::ModelConfig m;
  m.hidden_size = 16;
  m.intermediate_size = 24;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.vocab_size = 40;
  m.max_position_embeddings = 16;
  m.tie_word_embeddings = tied;
  m.kv_shift.enabled = shift;
  return m;
}

struct Data {
  int B, T;
  std::vector<int32_t> inputs, targets;
  std::vector<float> mask;
  Data(int B_, int T_, int V, uint64_t seed) : B(B_), T(T_) {
    const size_t n = static_cast<size_t>(B) * T;
    for (size_t i = 0; i < n; ++i) {
      inputs.push_back(static_cast<int32_t>(kvs::splitmix64(seed + 3 * i) % V));
      targets.push_back(static_cast<int32_t>(kvs::splitmix64(seed + 3 * i + 1) % V));
      mask.push_back(kvs::splitmix64(seed + 3 * i + 2) % 4 == 0 ? 0.0f : 1.0f);
    }
  }
  kvs::Batch batch(int first, int count) const {
    const size_t o = static_cast<size_t>(first) * T;
    return {count, T, inputs.data() + o, targets.data() + o, mask.data() + o};
  }
  double scored() const { return std::accumulate(mask.begin(), mask.end(), 0.0); }
};

std::unique_ptr<kvs::CpuEngine> engine_with_init(const kvs::ModelConfig& m, int B, int T, uint64_t seed = 5) {
  auto e = std::make_unique<kvs::CpuEngine>(m, B, T);
  std::vector<float> p(e->layout().total);
  kvs::init_params(e->layout(), m, seed, p.data());
  // Perturb norms and shifts so every parameter kind has non-trivial values.
  for (size_t i = 0; i < p.size(); ++i) p[i] += 0.05f * static_cast<float>(kvs::normal01(77, i));
  e->write_params(p.data());
  return e;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

// The shipped hyperparameters, and others (β1 0.8, β2 0.99, eps 1e-3, which
// is of the size of sqrt(v̂) here): an engine that used its defaults instead of
// the step's values fails the second.
TEST(Engine, AdamWMatchesTorchFormulaInDouble) {
  struct Hyper {
    double b1, b2, eps;
  };
  for (const Hyper hyper : {Hyper{0.9, 0.95, 1e-8}, Hyper{0.8, 0.99, 1e-3}}) {
    SCOPED_TRACE(hyper.eps);
    const auto m = tiny_model();
    auto e = engine_with_init(m, 2, 8);
    const Data d(2, 8, m.vocab_size, 1);
    const size_t n = e->layout().total;
    std::vector<double> p(n), mo(n, 0.0), v(n, 0.0);
    {
      std::vector<float> pf(n);
      e->read_params(pf.data());
      for (size_t i = 0; i < n; ++i) p[i] = pf[i];
    }
    const double lrs[] = {1e-2, 3e-3, 5e-3};
    const double b1 = hyper.b1, b2 = hyper.b2, eps = hyper.eps, wd = 0.1;
    for (int step = 1; step <= 3; ++step) {
      e->zero_grad();
      e->forward_backward(d.batch(0, 2), 1.0 / d.scored());
      std::vector<float> g(n);
      e->read_grads(g.data());
      const double clip = step == 2 ? 0.5 : 1.0;  // exercise the clip factor
      e->adamw_step({lrs[step - 1], b1, b2, eps, wd, step, clip});
      // torch.optim.AdamW: p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
      // p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). Decay only on matrices/embeddings.
      for (const auto& t : e->layout().tensors) {
        for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
          const double gi = g[i] * clip, lr = lrs[step - 1];
          if (t.decay()) p[i] *= 1 - lr * wd;
          mo[i] = b1 * mo[i] + (1 - b1) * gi;
          v[i] = b2 * v[i] + (1 - b2) * gi * gi;
          const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, step)) + eps;
          p[i] -= lr / (1 - std::pow(b1, step)) * mo[i] / denom;
        }
      }
    }
    std::vector<float> got(n);
    e->read_params(got.data());
    double worst = 0;
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(got[i] - p[i]) / std::max(1e-3, std::abs(p[i])));
    EXPECT_LT(worst, 1e-5);
  }
}

TEST(Engine, NormsAndShiftsAreNotDecayed) {
  const auto m = tiny_model();
  kvs::CpuEngine e(m, 1, 4);
  const auto& L = e.layout();
  std::vector<float> p(L.total, 1.0f);
  e.write_params(p.data());
  e.zero_grad();  // zero gradient: only weight decay moves parameters
  e.adamw_step({0.1, 0.9, 0.95, 1e-8, 0.5, 1, 1.0});
  e.read_params(p.data());
  for (const auto& t : L.tensors) {
    const float expect = t.decay() ? 1.0f - 0.1f * 0.5f : 1.0f;
    EXPECT_FLOAT_EQ(p[t.offset], expect) << t.name;
    const bool should_decay = t.name.find("norm") == std::string::npos && t.name.find("shift") == std::string::npos;
    EXPECT_EQ(t.decay(), should_decay) << t.name;
  }
}

TEST(Engine, GradientAccumulationEqualsOneBigBatch) {
  for (bool tied : {false, true}) {
    const auto m = tiny_model(true, tied);
    const Data d(4, 8, m.vocab_size, 2);
    auto big = engine_with_init(m, 4, 8);
    auto small = engine_with_init(m, 2, 8);
    big->zero_grad();
    const double l_big = big->forward_backward(d.batch(0, 4), 1.0 / d.scored());
    small->zero_grad();
    double l_small = small->forward_backward(d.batch(0, 2), 1.0 / d.scored());
    l_small += small->forward_backward(d.batch(2, 2), 1.0 / d.scored());
    EXPECT_NEAR(l_big, l_small, 1e-5 * std::abs(l_big));
    std::vector<float> g1(big->layout().total), g2(g1.size());
    big->read_grads(g1.data());
    small->read_grads(g2.data());
    EXPECT_LT(rel_diff(g2, g1), 1e-6);
    EXPECT_NEAR(big->grad_norm(), small->grad_norm(), 1e-6 * big->grad_norm());
  }
}

TEST(Engine, RangedHostCopiesAreTheWholeOnesPieceByPiece) {
  const auto m = tiny_model(true, true);
  const Data d(2, 8, m.vocab_size, 3);
  kvs::testing_util::check_range_copies([&] { return std::make_unique<kvs::CpuEngine>(m, 2, 8); }, d.batch(0, 2));
}

TEST(Engine, SmallerBatchInLargerPlanGivesSameLogits) {
  const auto m = tiny_model();
  const Data d(1, 6, m.vocab_size, 3);
  auto exact = engine_with_init(m, 1, 6);
  auto large = engine_with_init(m, 3, 12);
  std::vector<float> a(6 * m.vocab_size), b(a.size());
  exact->forward(d.batch(0, 1), nullptr, nullptr, a.data());
  large->forward(d.batch(0, 1), nullptr, nullptr, b.data());
  EXPECT_EQ(a, b);
}

TEST(Engine, ShiftOffIsVanillaAndIdentityShiftEqualsIt) {
  // With a_cur = b_cur = 1 and a_prev = b_prev = 0 the shift is the identity,
  // so the logits equal those of the same weights with the shift disabled.
  auto ms = tiny_model(true), mv = tiny_model(false);
  kvs::CpuEngine es(ms, 1, 8), ev(mv, 1, 8);
  std::vector<float> ps(es.layout().total), pv(ev.layout().total);
  kvs::init_params(es.layout(), ms, 9, ps.data());
  kvs::init_params(ev.layout(), mv, 9, pv.data());
  for (const auto& t : es.layout().tensors) {
    if (t.kind == kvs::ParamKind::Shift) {
      for (int64_t h = 0; h < t.shape[0]; ++h) ps[t.offset + 2 * h] = 0.0f, ps[t.offset + 2 * h + 1] = 1.0f;
    } else {
      const auto* tv = ev.layout().find(t.name);
      ASSERT_NE(tv, nullptr) << t.name;
      // Same seed and name => same initial values in either layout.
      for (size_t i = 0; i < t.numel; ++i) ASSERT_EQ(ps[t.offset + i], pv[tv->offset + i]) << t.name;
    }
  }
  es.write_params(ps.data());
  ev.write_params(pv.data());
  const Data d(1, 8, ms.vocab_size, 4);
  std::vector<float> a(8 * ms.vocab_size), b(a.size());
  es.forward(d.batch(0, 1), nullptr, nullptr, a.data());
  ev.forward(d.batch(0, 1), nullptr, nullptr, b.data());
  EXPECT_LT(rel_diff(a, b), 1e-6);
}

namespace {

void expect_initialisation_follows_the_paper(double range) {
  auto m = tiny_model();
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 4;
  m.initializer_range = range;
  const auto L = kvs::ParamLayout::build(m);
  std::vector<float> p(L.total);
  kvs::init_params(L, m, 11, p.data());
  for (const auto& t : L.tensors) {
    const float* x = p.data() + t.offset;
    if (t.kind == kvs::ParamKind::Shift) {
      for (int64_t h = 0; h < t.shape[0]; ++h) {
        EXPECT_GT(x[2 * h], 0.0f);
        EXPECT_LT(x[2 * h], 1.0f);
        EXPECT_FLOAT_EQ(x[2 * h + 1], 1.0f - x[2 * h]) << t.name;  // cur = 1 - prev
      }
      // K and V draw their own coefficients.
    } else if (t.kind == kvs::ParamKind::Norm) {
      for (size_t i = 0; i < t.numel; ++i) EXPECT_EQ(x[i], 1.0f);
    } else {
      double s2 = 0;
      for (size_t i = 0; i < t.numel; ++i) s2 += static_cast<double>(x[i]) * x[i];
      EXPECT_NEAR(std::sqrt(s2 / t.numel), range, 0.2 * range) << t.name;
    }
  }
  const auto* k = L.find("model.layers.0.self_attn.k_shift");
  const auto* v = L.find("model.layers.0.self_attn.v_shift");
  EXPECT_NE(p[k->offset], p[v->offset]);
}

}  // namespace

// The matrices' std is model.initializer_range: the paper's 0.02, and 0.05.
TEST(Engine, InitialisationFollowsThePaper) {
  for (const double range : {0.02, 0.05}) {
    SCOPED_TRACE(range);
    expect_initialisation_follows_the_paper(range);
  }
}


TEST(Engine, QShiftIsOneTensorPerQueryHead) {
  auto m = tiny_model();
  m.kv_shift.shift_q = true;
  const auto L = kvs::ParamLayout::build(m);
  for (int i = 0; i < m.num_hidden_layers; ++i) {
    const auto* q = L.find("model.layers." + std::to_string(i) + ".self_attn.q_shift");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->shape, (std::vector<int64_t>{m.num_attention_heads, 2}));
    EXPECT_EQ(q->kind, kvs::ParamKind::Shift);
    EXPECT_FALSE(q->decay());
  }
  // Identity q coefficients ([0, 1]) give the same logits as no q shift.
  const Data d(2, 8, m.vocab_size, 3);
  auto with_q = engine_with_init(m, 2, 8);
  auto without = m;
  without.kv_shift.shift_q = false;
  auto e0 = std::make_unique<kvs::CpuEngine>(without, 2, 8);
  std::vector<float> pq(with_q->layout().total), p0(e0->layout().total);
  with_q->read_params(pq.data());
  for (const auto& t : with_q->layout().tensors) {
    if (t.name.find("q_shift") != std::string::npos) {
      for (int64_t h = 0; h < t.shape[0]; ++h) pq[t.offset + 2 * h] = 0.0f, pq[t.offset + 2 * h + 1] = 1.0f;
      continue;
    }
    const auto* u = e0->layout().find(t.name);
    std::copy(pq.begin() + t.offset, pq.begin() + t.offset + t.numel, p0.begin() + u->offset);
  }
  with_q->write_params(pq.data());
  e0->write_params(p0.data());
  std::vector<float> la(2 * 8 * m.vocab_size), lb(la.size());
  with_q->forward(d.batch(0, 2), nullptr, nullptr, la.data());
  e0->forward(d.batch(0, 2), nullptr, nullptr, lb.data());
  EXPECT_EQ(la, lb);
}

TEST(Engine, SigmoidGateInitialisationIsThePapersDraw) {
  auto m = tiny_model();
  auto gm = m;
  gm.kv_shift.parametrization = kvs::ShiftParametrization::SigmoidGate;
  gm.kv_shift.shift_q = true;
  m.kv_shift.shift_q = true;
  const auto L = kvs::ParamLayout::build(m);
  const auto GL = kvs::ParamLayout::build(gm);
  ASSERT_EQ(L.total, GL.total);  // same checkpoint layout
  std::vector<float> p(L.total), g(GL.total);
  kvs::init_params(L, m, 11, p.data());
  kvs::init_params(GL, gm, 11, g.data());
  for (const auto& t : GL.tensors) {
    if (t.kind != kvs::ParamKind::Shift) continue;
    for (int64_t h = 0; h < t.shape[0]; ++h) {
      EXPECT_EQ(g[t.offset + 2 * h], 0.0f) << t.name;  // unused column
      const double cur = 1.0 / (1.0 + std::exp(-static_cast<double>(g[t.offset + 2 * h + 1])));
      EXPECT_NEAR(cur, p[t.offset + 2 * h + 1], 1e-5) << t.name;       // sigmoid(g) = cur = 1 - u
      EXPECT_NEAR(1.0 - cur, p[t.offset + 2 * h], 1e-5) << t.name;     // prev = u
    }
  }
}

TEST(Engine, Clamp01KeepsShiftCoefficientsInTheUnitBox) {
  // A large lr pushes shift coefficients out of [0, 1] under "free"; "clamp01"
  // projects them back after every step while the weights keep moving.
  using P = kvs::ShiftParametrization;
  for (P par : {P::Clamp01, P::Free}) {
    SCOPED_TRACE(kvs::to_string(par));
    auto m = tiny_model();
    m.kv_shift.shift_q = true;
    m.kv_shift.parametrization = par;
    auto e = engine_with_init(m, 2, 8);
    const Data d(2, 8, m.vocab_size, 4);
    const auto& L = e->layout();
    std::vector<float> p0(L.total), p(L.total);
    e->read_params(p0.data());
    for (int step = 1; step <= 5; ++step) {
      e->zero_grad();
      e->forward_backward(d.batch(0, 2), 1.0 / d.scored());
      e->adamw_step({0.5, 0.9, 0.95, 1e-8, 0.0, step, 1.0});
    }
    e->read_params(p.data());
    int outside = 0, shift_scalars = 0;
    double moved = 0;
    for (const auto& t : L.tensors)
      for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
        if (t.kind == kvs::ParamKind::Shift) {
          ++shift_scalars;
          outside += p[i] < 0.0f || p[i] > 1.0f;
        } else if (t.kind == kvs::ParamKind::Matrix) {
          moved = std::max(moved, static_cast<double>(std::abs(p[i] - p0[i])));
        }
      }
    EXPECT_GT(moved, 0.1);
    if (par == P::Clamp01)
      EXPECT_EQ(outside, 0) << "of " << shift_scalars;
    else
      EXPECT_GT(outside, 0) << "of " << shift_scalars;
  }
}

TEST(Engine, LongerWindowInitialisationFollowsFootnote14) {
  // Footnote 14 of the paper: the W older columns ~ U(0,1) independently, the
  // current column = 1 - their sum (so each row sums to 1, as for window 1).
  for (int W : {2, 3}) {
    SCOPED_TRACE(testing::Message() << "window " << W);
    auto m = tiny_model();
    m.kv_shift.window = W;
    const auto L = kvs::ParamLayout::build(m);
    std::vector<float> p(L.total), again(L.total);
    kvs::init_params(L, m, 11, p.data());
    kvs::init_params(L, m, 11, again.data());
    EXPECT_EQ(p, again);  // a pure function of (seed, name, index)
    int shift_tensors = 0;
    for (const auto& t : L.tensors) {
      if (t.kind != kvs::ParamKind::Shift) continue;
      ++shift_tensors;
      ASSERT_EQ(t.shape[1], W + 1) << t.name;
      const float* x = p.data() + t.offset;
      for (int64_t h = 0; h < t.shape[0]; ++h) {
        const float* row = x + h * (W + 1);
        float older = 0.0f;
        for (int w = 0; w < W; ++w) {
          EXPECT_GT(row[w], 0.0f) << t.name;
          EXPECT_LT(row[w], 1.0f) << t.name;
          older += row[w];
        }
        EXPECT_FLOAT_EQ(row[W], 1.0f - older) << t.name;
        EXPECT_NEAR(older + row[W], 1.0, 1e-6) << t.name;
        for (int w = 1; w < W; ++w) EXPECT_NE(row[w], row[0]) << t.name;  // independent draws
      }
    }
    EXPECT_EQ(shift_tensors, 2 * m.num_hidden_layers);
  }
}

TEST(Schedule, WarmupThenConstantOrCosine) {
  kvs::TrainConfig t;
  t.lr = 1e-3;
  t.warmup_steps = 10;
  t.steps = 110;
  EXPECT_DOUBLE_EQ(kvs::learning_rate(t, 0), 1e-4);
  EXPECT_DOUBLE_EQ(kvs::learning_rate(t, 4), 5e-4);
  EXPECT_DOUBLE_EQ(kvs::learning_rate(t, 9), 1e-3);
  EXPECT_DOUBLE_EQ(kvs::learning_rate(t, 50), 1e-3);
  t.schedule = kvs::LrSchedule::Cosine;
  t.min_lr = 1e-4;
  EXPECT_DOUBLE_EQ(kvs::learning_rate(t, 10), 1e-3);
  EXPECT_NEAR(kvs::learning_rate(t, 60), 0.5 * (1e-3 + 1e-4), 1e-12);
  // A quarter of the way: cosine, not linear (7.75e-4), which agrees with it at 0, 1/2 and 1.
  EXPECT_NEAR(kvs::learning_rate(t, 35), 1e-4 + 0.45e-3 * (1 + std::sqrt(0.5)), 1e-12);
  EXPECT_NEAR(kvs::learning_rate(t, 110), 1e-4, 1e-12);
}

TEST(Schedule, LinearAndWarmupStableDecay) {
  kvs::TrainConfig t;
  t.lr = 1e-3;
  t.min_lr = 1e-4;
  t.warmup_steps = 10;
  t.steps = 110;
  t.schedule = kvs::LrSchedule::Linear;
  EXPECT_DOUBLE_EQ(kvs::learning_rate(t, 4), 5e-4);  // the same warmup
  EXPECT_DOUBLE_EQ(kvs::learning_rate(t, 10), 1e-3);
  EXPECT_NEAR(kvs::learning_rate(t, 35), 1e-3 - 0.25 * 0.9e-3, 1e-12);
  EXPECT_NEAR(kvs::learning_rate(t, 109), 1e-4 + 0.01 * 0.9e-3, 1e-12);
  EXPECT_NEAR(kvs::learning_rate(t, 110), 1e-4, 1e-12);
  // wsd: warmup, lr until the last 40 steps (70 ... 109), then the decay's shape.
  t.schedule = kvs::LrSchedule::Wsd;
  t.decay_steps = 40;
  EXPECT_DOUBLE_EQ(kvs::learning_rate(t, 4), 5e-4);
  EXPECT_DOUBLE_EQ(kvs::learning_rate(t, 10), 1e-3);
  EXPECT_DOUBLE_EQ(kvs::learning_rate(t, 69), 1e-3);
  EXPECT_DOUBLE_EQ(kvs::learning_rate(t, 70), 1e-3);  // the decay's first step: progress 0
  struct Shape {
    kvs::LrDecayShape shape;
    double quarter;  // at step 80: progress 1/4
  };
  for (const Shape& s : {Shape{kvs::LrDecayShape::Linear, 1e-3 - 0.25 * 0.9e-3},
                         Shape{kvs::LrDecayShape::Cosine, 1e-4 + 0.45e-3 * (1 + std::sqrt(0.5))},
                         Shape{kvs::LrDecayShape::OneMinusSqrt, 1e-4 + 0.9e-3 * 0.5}}) {
    t.decay_shape = s.shape;
    SCOPED_TRACE(static_cast<int>(s.shape));
    EXPECT_NEAR(kvs::learning_rate(t, 80), s.quarter, 1e-12);
    EXPECT_NEAR(kvs::learning_rate(t, 90), 0.5 * (1e-3 + 1e-4) + (s.shape == kvs::LrDecayShape::OneMinusSqrt
                                                                      ? 0.9e-3 * (0.5 - std::sqrt(0.5))
                                                                      : 0.0),
                1e-12);
    EXPECT_GT(kvs::learning_rate(t, 109), 1e-4);
    EXPECT_NEAR(kvs::learning_rate(t, 110), 1e-4, 1e-12);
    for (int64_t step = 70; step < 110; ++step)
      EXPECT_LE(kvs::learning_rate(t, step + 1), kvs::learning_rate(t, step)) << "step " << step;
  }
}

// Document boundaries: with "shift_and_attention" a document packed after
// another gives the same logits as the same document alone (nothing leaks
// through K_{t-1}/V_{t-1} or attention; RoPE is relative, so the offset only
// costs float rounding). With "none" the first document leaks into the second
// (the control), and with "shift" alone it still leaks through attention.
TEST(Engine, PackedDocumentsDoNotLeakWithDocumentMasks) {
  constexpr int kBos = 1, T = 12, first = 5;  // document 2 = positions [5, 12)
  std::vector<int32_t> packed = {kBos, 7, 9, 3, 22, kBos, 14, 5, 30, 8, 17, 2};
  std::vector<int32_t> alone(packed.begin() + first, packed.end());
  auto logits = [](const kvs::ModelConfig& m, const std::vector<int32_t>& ids) {
    auto e = engine_with_init(m, 1, T);
    std::vector<float> out(ids.size() * m.vocab_size);
    e->forward({1, static_cast<int>(ids.size()), ids.data(), nullptr, nullptr}, nullptr, nullptr, out.data());
    return out;
  };
  auto second_doc_gap = [&](kvs::DocumentBoundaries mode) {
    kvs::ModelConfig m = tiny_model(true);
    m.document_boundaries = mode;
    m.bos_token_id = kBos;
    const auto p = logits(m, packed), a = logits(m, alone);
    const std::vector<float> tail(p.begin() + first * m.vocab_size, p.end());
    return rel_diff(tail, a);
  };
  using B = kvs::DocumentBoundaries;
  EXPECT_LT(second_doc_gap(B::ShiftAndAttention), 1e-5);
  EXPECT_GT(second_doc_gap(B::Shift), 1e-3);
  EXPECT_GT(second_doc_gap(B::None), 1e-3);
}

// Thread replicas (model/cpu_replicas.h) are one engine's step: loss,
// gradients over accumulated micro-batches, the AdamW update and forward's
// per-token outputs agree with a CpuEngine's to fp32 rounding (the sum over
// the replicas' rows is another order), for even shares, uneven ones and a
// batch too small to share (which runs on the first replica alone, bit for
// bit one engine's). Packed documents cover the document starts per share.
TEST(CpuReplicas, AStepOnReplicasIsOneEnginesStep) {
  constexpr int kMaxB = 4, T = 8, kReplicas = 2;
  for (bool tied : {false, true})
    for (int B : {4, 3, 1}) {
      SCOPED_TRACE(::testing::Message() << "tied " << tied << ", B " << B);
      kvs::ModelConfig m = tiny_model(true, tied);
      m.document_boundaries = kvs::DocumentBoundaries::ShiftAndAttention;
      m.bos_token_id = 1;
      Data d(2 * B, T, m.vocab_size, 11);
      for (size_t i = 0; i < d.inputs.size(); i += 5) d.inputs[i] = 1;  // documents inside the sequences
      auto one = engine_with_init(m, kMaxB, T);
      kvs::CpuReplicaEngine rep(m, kMaxB, T, kReplicas);
      std::vector<float> p(one->layout().total), q(p.size());
      one->read_params(p.data());
      rep.write_params(p.data());
      std::vector<double> loss(2, 0.0);
      kvs::Engine* engines[2] = {one.get(), &rep};
      for (int e = 0; e < 2; ++e) {
        engines[e]->zero_grad();
        for (int mb = 0; mb < 2; ++mb) loss[e] += engines[e]->forward_backward(d.batch(mb * B, B), 1.0 / d.scored());
      }
      std::vector<float> g1(p.size()), g2(p.size());
      one->read_grads(g1.data());
      rep.read_grads(g2.data());
      if (B == 1) {
        EXPECT_EQ(loss[0], loss[1]);
        EXPECT_EQ(g1, g2);
      } else {
        EXPECT_NEAR(loss[0], loss[1], 1e-6 * std::abs(loss[0]));
        EXPECT_LT(rel_diff(g2, g1), 1e-6);
      }
      EXPECT_NEAR(one->grad_norm(), rep.grad_norm(), 1e-6 * one->grad_norm());
      const kvs::AdamWHyper h{1e-2, 0.9, 0.95, 1e-8, 0.1, 1, 0.5};
      one->adamw_step(h);
      rep.adamw_step(h);
      one->read_params(p.data());
      rep.read_params(q.data());
      EXPECT_LT(rel_diff(q, p), 1e-6);
      // The updated weights reach every replica: forward's outputs of the new model.
      rep.write_params(p.data());
      const size_t N = static_cast<size_t>(B) * T;
      std::vector<float> tl1(N), tl2(N), lg1(N * m.vocab_size), lg2(lg1.size());
      std::vector<int32_t> am1(N), am2(N);
      const double f1 = one->forward(d.batch(B, B), tl1.data(), am1.data(), lg1.data());
      const double f2 = rep.forward(d.batch(B, B), tl2.data(), am2.data(), lg2.data());
      EXPECT_NEAR(f1, f2, 1e-6 * std::abs(f1));
      EXPECT_LT(rel_diff(tl2, tl1), 1e-6);
      EXPECT_LT(rel_diff(lg2, lg1), 1e-6);
      EXPECT_EQ(am1, am2);
      // The next step after a sum (whose zero_grad clears the first replica
      // alone: the sum zeroed the others) is again one engine's.
      for (kvs::Engine* e : engines) {
        e->zero_grad();
        e->forward_backward(d.batch(B, B), 1.0 / d.scored());
      }
      one->read_grads(g1.data());
      rep.read_grads(g2.data());
      if (B == 1) EXPECT_EQ(g1, g2);
      else EXPECT_LT(rel_diff(g2, g1), 1e-6);
      // A zero_grad with gradients not yet summed clears every replica's.
      rep.forward_backward(d.batch(0, B), 1.0);
      rep.zero_grad();
      rep.read_grads(g2.data());
      EXPECT_EQ(*std::max_element(g2.begin(), g2.end()), 0.0f);
      EXPECT_EQ(*std::min_element(g2.begin(), g2.end()), 0.0f);
    }
}

TEST(CpuReplicas, OnePerThreadWhereEachHasASequenceAndTheMemoryIsSmall) {
  using kvs::CpuReplicas;
  EXPECT_EQ(kvs::parse_cpu_replicas(nullptr), CpuReplicas::kAuto);
  EXPECT_EQ(kvs::parse_cpu_replicas(""), CpuReplicas::kAuto);
  EXPECT_EQ(kvs::parse_cpu_replicas("AUTO"), CpuReplicas::kAuto);
  EXPECT_EQ(kvs::parse_cpu_replicas("off"), CpuReplicas::kOff);
  try {
    kvs::parse_cpu_replicas("2");
    ADD_FAILURE() << "no error";
  } catch (const kvs::Error& e) {
    EXPECT_STREQ(e.what(), "KVS_CPU_REPLICAS=2: expected auto or off (or unset it for auto)");
  }
  const auto A = CpuReplicas::kAuto;
  EXPECT_EQ(kvs::cpu_replicas_for(A, 2, 8, true, 3e6, 1e8), 2);
  EXPECT_EQ(kvs::cpu_replicas_for(A, 4, 4, true, 3e6, 1e8), 4);
  EXPECT_EQ(kvs::cpu_replicas_for(CpuReplicas::kOff, 2, 8, true, 3e6, 1e8), 1);
  EXPECT_EQ(kvs::cpu_replicas_for(A, 1, 8, true, 3e6, 1e8), 1);   // one thread
  EXPECT_EQ(kvs::cpu_replicas_for(A, 4, 2, true, 3e6, 1e8), 1);   // fewer sequences than threads
  EXPECT_EQ(kvs::cpu_replicas_for(A, 2, 8, false, 3e6, 1e8), 1);  // tensor, context or pipeline parallel
  // Extra gradients up to a quarter of 16 bytes a parameter plus the activations.
  EXPECT_EQ(kvs::cpu_replicas_for(A, 2, 8, true, 1e9, 0), 2);
  EXPECT_EQ(kvs::cpu_replicas_for(A, 3, 8, true, 1e9, 0), 1);
  EXPECT_EQ(kvs::cpu_replicas_for(A, 3, 8, true, 1e9, 4e9), 3);

  // make_engine follows the setting and the thread count (whatever
  // KVS_CPU_REPLICAS the test runs under).
  const int threads = omp_get_max_threads();
  const CpuReplicas before = kvs::cpu_replicas_setting();
  omp_set_num_threads(2);
  kvs::set_cpu_replicas(A);
  const auto m = tiny_model();
  {
    auto e = kvs::make_engine(m, 4, 8, kvs::Device::Cpu);
    const auto* rep = dynamic_cast<const kvs::CpuReplicaEngine*>(e.get());
    EXPECT_TRUE(rep && rep->replicas() == 2);
    EXPECT_EQ(e->max_batch(), 4);
  }
  EXPECT_NE(dynamic_cast<const kvs::CpuEngine*>(kvs::make_engine(m, 1, 8, kvs::Device::Cpu).get()), nullptr);
  kvs::set_cpu_replicas(CpuReplicas::kOff);
  EXPECT_NE(dynamic_cast<const kvs::CpuEngine*>(kvs::make_engine(m, 4, 8, kvs::Device::Cpu).get()), nullptr);
  kvs::set_cpu_replicas(before);
  omp_set_num_threads(threads);
}
