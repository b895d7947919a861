// Theorem 2 of the paper (section 3.1, proof in appendix B): ONE layer with one
// KV shifting attention head implements an induction head exactly, which a
// vanilla layer with the same weights does not.
//
// Induction: in "... A B ... A" the last position must predict B.
//
// Model: 1 layer, 1 head (num_attention_heads = num_key_value_heads = 1), vocab
// V = 16, hidden C = 32 = head_dim D, position_encoding "none" (the theorem's
// attention has no rotary embedding; appendix B sets W_q = W_k = W_v = W_o = I,
// alpha_1 = 0, alpha_2 = 1, beta_2 = 0). The residual stream has two halves:
// dims [0, V) hold the current token, dims [V, 2V) what attention copied.
//
//   embed_tokens[j]      = e_j                       one-hot in the lower half
//   input_layernorm      = 1/sqrt(C)                 RMSNorm(e_j) = sqrt(C) e_j (up to eps),
//                                                    so ln1 = e_j again
//   q_proj = kQ * I_V, k_proj = v_proj = I_V          q_t = kQ e_{x_t}, k_t = v_t = e_{x_t}
//   k_shift = [a_prev, a_cur] = [1, 0]                k^_t = k_{t-1} (k^_0 = 0): position t is
//                                                    keyed by its PREVIOUS token
//   v_shift = [b_prev, b_cur] = [0, 1]                v^_t = v_t: and carries its OWN token
//   attention scores q_L . k^_s / sqrt(D)            = kQ/sqrt(D) ~ 7.1 where x_{s-1} = A
//                                                    (only s = i+1, whose token is B), else 0,
//                                                    so softmax is ~one-hot on s = i+1
//   o_proj[V + j][j] = 1                              writes e_B into the upper half
//   mlp: gate = up = down = 0                         the MLP adds nothing
//   norm = 1, lm_head[j][V + j] = kOut                reads only the upper half: the
//                                                    residual's own token (A, lower half)
//                                                    contributes nothing to the logits
//
// So logit_B ~ kOut * 4 * p(attend to i+1) dominates and argmax = B. Without the
// shift (vanilla, or a_prev = 0, a_cur = 1) the key of position s is its own
// token, so the query A matches positions i and L (both A): the layer copies A
// and predicts A, never B. That is the test's negative control; it shows these
// weights depend on the shift. (That NO vanilla 1-layer weights can do induction
// is Sanford et al.'s result, which one weight set cannot test.)
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/cpu_engine.h"
#include "model/params.h"

namespace {

constexpr int kV = 16, kC = 32, kF = 8, kMaxT = 16;
constexpr float kQ = 40.0f;   // attention sharpness (the engine's 1/sqrt(D) scale is fixed)
constexpr float kOut = 2.0f;  // readout scale: P(B) ~ e^8 / (e^8 + 15) > 0.99

kvs::ModelConfig one_layer_model(bool shift) {
  kvs::ModelConfig m;
  m.hidden_size = kC;
  m.intermediate_size = kF;
  m.num_hidden_layers = 1;
  m.num_attention_heads = 1;
  m.num_key_value_heads = 1;
  m.vocab_size = kV;
  m.max_position_embeddings = kMaxT;
  m.position_encoding = kvs::PositionEncoding::None;
  m.kv_shift.enabled = shift;
  m.kv_shift.window = 1;
  return m;
}

// The construction above, for any layout of the model: tensors the layout lacks
// (the shifts of a vanilla model) are simply not written.
std::vector<float> theorem2_weights(const kvs::ParamLayout& L, float a_prev, float a_cur) {
  std::vector<float> p(L.total, 0.0f);
  auto at = [&](const std::string& name) -> float* {
    const auto* t = L.find(name);
    return t ? p.data() + t->offset : nullptr;
  };
  auto fill = [](float* x, size_t n, float v) { std::fill(x, x + n, v); };
  float* embed = at("model.embed_tokens.weight");
  for (int j = 0; j < kV; ++j) embed[j * kC + j] = 1.0f;
  fill(at("model.layers.0.input_layernorm.weight"), kC, 1.0f / std::sqrt(static_cast<float>(kC)));
  float *wq = at("model.layers.0.self_attn.q_proj.weight"), *wk = at("model.layers.0.self_attn.k_proj.weight");
  float *wv = at("model.layers.0.self_attn.v_proj.weight"), *wo = at("model.layers.0.self_attn.o_proj.weight");
  for (int j = 0; j < kV; ++j) {  // [out, in] (Hugging Face layout)
    wq[j * kC + j] = kQ;
    wk[j * kC + j] = 1.0f;
    wv[j * kC + j] = 1.0f;
    wo[(kV + j) * kC + j] = 1.0f;
  }
  if (float* ks = at("model.layers.0.self_attn.k_shift")) ks[0] = a_prev, ks[1] = a_cur;
  if (float* vs = at("model.layers.0.self_attn.v_shift")) vs[0] = 0.0f, vs[1] = 1.0f;
  fill(at("model.layers.0.post_attention_layernorm.weight"), kC, 1.0f);
  // gate_proj, up_proj, down_proj stay 0.
  fill(at("model.norm.weight"), kC, 1.0f);
  float* lm = at("lm_head.weight");
  for (int j = 0; j < kV; ++j) lm[j * kC + kV + j] = kOut;
  return p;
}

// "x_0 ... x_i=A x_{i+1}=B ... x_{T-2}  A": T-1 distinct tokens, then A again.
struct Sequence {
  std::vector<int32_t> tokens;
  int32_t a, b;
};

std::vector<Sequence> induction_sequences(int count) {
  std::vector<Sequence> out;
  for (int n = 0; n < count; ++n) {
    const uint64_t seed = 1000 + 97 * n;
    std::vector<int32_t> perm(kV);
    std::iota(perm.begin(), perm.end(), 0);
    for (int j = kV - 1; j > 0; --j) std::swap(perm[j], perm[kvs::splitmix64(seed + j) % (j + 1)]);
    const int T = 3 + n % (kMaxT - 2);                           // 3 .. 16 tokens
    const int i = static_cast<int>(kvs::splitmix64(seed) % (T - 2));  // A at i, B at i+1 <= T-2
    Sequence s;
    s.tokens.assign(perm.begin(), perm.begin() + (T - 1));
    s.tokens.push_back(s.tokens[i]);
    s.a = s.tokens[i];
    s.b = s.tokens[i + 1];
    out.push_back(std::move(s));
  }
  return out;
}

struct Score {
  int predicted_b = 0, predicted_a = 0, total = 0;
  double max_loss_b = 0;  // the worst -log P(B) at the last position
  double accuracy() const { return static_cast<double>(predicted_b) / total; }
};

// Runs every sequence and scores the prediction at its last position.
Score run(const kvs::ModelConfig& m, const std::vector<float>& params, const std::vector<Sequence>& seqs) {
  kvs::CpuEngine e(m, 1, kMaxT);
  e.write_params(params.data());
  Score s;
  for (const auto& q : seqs) {
    const int T = static_cast<int>(q.tokens.size());
    std::vector<int32_t> targets(T, 0), argmax(T, -1);
    std::vector<float> mask(T, 0.0f), losses(T, 0.0f);
    targets[T - 1] = q.b;
    mask[T - 1] = 1.0f;
    const kvs::Batch batch{1, T, q.tokens.data(), targets.data(), mask.data()};
    e.forward(batch, losses.data(), argmax.data(), nullptr);
    s.predicted_b += argmax[T - 1] == q.b;
    s.predicted_a += argmax[T - 1] == q.a;
    s.max_loss_b = std::max(s.max_loss_b, static_cast<double>(losses[T - 1]));
    ++s.total;
  }
  return s;
}

}  // namespace

TEST(Theorem2, OneKvShiftingLayerPerformsInduction) {
  const auto m = one_layer_model(true);
  const auto seqs = induction_sequences(60);
  const Score s = run(m, theorem2_weights(kvs::ParamLayout::build(m), 1.0f, 0.0f), seqs);
  EXPECT_EQ(s.predicted_b, s.total);
  EXPECT_LT(s.max_loss_b, 0.05) << "P(B) should be near 1, not just the argmax";
}

TEST(Theorem2, SameWeightsWithoutTheShiftDoNotInduce) {
  const auto seqs = induction_sequences(60);
  // Vanilla attention: the same tensors, the shift tensors dropped.
  const auto mv = one_layer_model(false);
  const auto lv = kvs::ParamLayout::build(mv);
  ASSERT_EQ(lv.find("model.layers.0.self_attn.k_shift"), nullptr);
  const Score vanilla = run(mv, theorem2_weights(lv, 1.0f, 0.0f), seqs);
  EXPECT_LT(vanilla.accuracy(), 0.5);
  EXPECT_GT(vanilla.predicted_a, 0.9 * vanilla.total) << "it copies the current token A instead";

  // The check can fail: the shift enabled with identity coefficients
  // (a_prev = 0, a_cur = 1) is vanilla attention and misses B too.
  const auto ms = one_layer_model(true);
  const Score identity = run(ms, theorem2_weights(kvs::ParamLayout::build(ms), 0.0f, 1.0f), seqs);
  EXPECT_LT(identity.accuracy(), 0.5);
  EXPECT_EQ(identity.predicted_a, vanilla.predicted_a);
}
