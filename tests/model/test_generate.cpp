// Generation with the KV cache (model/generator.h) against the full forward of
// CpuEngine: at every step the cached logits equal the full forward's row for
// that position and the greedy token is that row's argmax, for every model
// variant. The cache bugs (mixing with an already-shifted k/v, or with zeros)
// are shown to fail the same check. Then sampling and `kvshift generate`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands/text_stream.h"
#include "core/rng.h"
#include "model/cpu_engine.h"
#include "model/generator.h"
#include "model/params.h"
#include "model/sampler.h"
#include "train/checkpoint.h"
#include "train/model_io.h"
#include "test_util.h"
#include "text_corpus_util.h"
#include "tokenizer/tokenizer.h"

using kvs::testing_util::TmpDir;

namespace {

// Logit tolerance: the cached path sums in a different order (one row at a
// time, its own attention loop) than the full forward, so fp32 rounding
// differs; |logit| is O(1-10) here.
constexpr double kAbsTol = 2e-4;
constexpr double kRelTol = 2e-5;

using Par = kvs::ShiftParametrization;
using Pe = kvs::PositionEncoding;
using Docs = kvs::DocumentBoundaries;

struct Variant {
  const char* name;
  bool shift = true;
  int window = 1;
  bool shift_k = true, shift_v = true, shift_q = false;
  Par parametrization = Par::Free;
  Pe pe = Pe::Rope;
  int kv_heads = 2;
  bool tied = false;
  Docs docs = Docs::None;  // model.document_boundaries
  int bos = -1;            // model.bos_token_id (3: position 2 of kPrompt)
  // The model's norm eps and RoPE, where a generator that took the defaults
  // instead would differ (Generate.NonDefaultNormAndRopeMatter checks they do).
  double eps = 1e-5;
  double theta = 10000.0;
  bool llama3 = false;  // at head_dim 8, θ 500000, original context 256: of the 4 frequencies
                        // 1 keeps its value, 1 is blended and 2 are divided by the factor
};

const Variant kVariants[] = {
    {"shift_w1"},
    {"shift_w2", true, 2},
    {"shift_w3_mha", true, 3, true, true, false, Par::Free, Pe::Rope, 4},
    {"shift_q", true, 1, true, true, true},
    {"shift_q_w2", true, 2, true, true, true},
    {"sigmoid_gate", true, 1, true, true, false, Par::SigmoidGate},
    {"clamp01_tied", true, 1, true, true, false, Par::Clamp01, Pe::Rope, 2, true},
    {"k_only_nope", true, 1, true, false, false, Par::Free, Pe::None},
    {"v_only_mqa", true, 1, false, true, false, Par::Free, Pe::Rope, 1},
    {"shift_nope", true, 1, true, true, false, Par::Free, Pe::None},
    {"vanilla", false},
    {"vanilla_nope_tied", false, 1, true, true, false, Par::Free, Pe::None, 2, true},
    {"docs_shift_w2", true, 2, true, true, false, Par::Free, Pe::Rope, 2, false, Docs::Shift, 3},
    {"docs_attention_shift_q", true, 1, true, true, true, Par::Free, Pe::Rope, 2, false, Docs::ShiftAndAttention, 3},
    {"docs_attention_vanilla", false, 1, true, true, false, Par::Free, Pe::Rope, 2, false, Docs::ShiftAndAttention, 3},
    {"eps_1e_2", true, 1, true, true, false, Par::Free, Pe::Rope, 2, false, Docs::None, -1, 1e-2},
    {"theta_500k", true, 1, true, true, false, Par::Free, Pe::Rope, 2, false, Docs::None, -1, 1e-5, 500000.0},
    {"llama3_scaling", true, 1, true, true, false, Par::Free, Pe::Rope, 2, false, Docs::None, -1, 1e-5, 500000.0,
     true},
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

kvs::ModelConfig model_of(const Variant& v) {
  kvs::ModelConfig m;
  m.hidden_size = 32;
  m.intermediate_size = 48;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;  // GQA 4/2 unless the variant says otherwise
  m.num_key_value_heads = v.kv_heads;
  m.vocab_size = 48;
  m.max_position_embeddings = 24;
  m.rope_theta = v.theta;
  m.rms_norm_eps = v.eps;
  if (v.llama3) {
    m.rope_scaling.rope_type = kvs::RopeType::Llama3;
    m.rope_scaling.original_max_position_embeddings = 256;
  }
  m.position_encoding = v.pe;
  m.tie_word_embeddings = v.tied;
  m.initializer_range = 0.3;  // spread-out logits, so argmaxes are not near-ties
  m.kv_shift.enabled = v.shift;
  m.kv_shift.window = v.window;
  m.kv_shift.shift_k = v.shift_k;
  m.kv_shift.shift_v = v.shift_v;
  m.kv_shift.shift_q = v.shift_q;
  m.kv_shift.parametrization = v.parametrization;
  m.document_boundaries = v.docs;
  m.bos_token_id = v.bos;
  return m;
}

// Initialised parameters, perturbed so norms and shifts are not at their init.
std::vector<float> params_of(const kvs::ModelConfig& m, uint64_t seed = 3) {
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  std::vector<float> p(layout.total);
  kvs::init_params(layout, m, seed, p.data());
  for (const auto& t : layout.tensors)
    if (t.kind != kvs::ParamKind::Matrix && t.kind != kvs::ParamKind::Embedding)
      for (size_t i = 0; i < t.numel; ++i)
        p[t.offset + i] += 0.3f * static_cast<float>(kvs::normal01(seed + 9, t.offset + i));
  return p;
}

// Logits [T, V] of one sequence from the full forward.
std::vector<float> full_logits(const kvs::ModelConfig& m, const std::vector<float>& params,
                               const std::vector<int32_t>& ids) {
  const int T = static_cast<int>(ids.size());
  kvs::CpuEngine e(m, 1, T);
  e.write_params(params.data());
  std::vector<float> logits(static_cast<size_t>(T) * m.vocab_size);
  e.forward(kvs::Batch{1, T, ids.data(), nullptr, nullptr}, nullptr, nullptr, logits.data());
  return logits;
}

struct Decoded {
  std::vector<int32_t> ids;   // prompt + generated
  std::vector<float> logits;  // [T - 1, V]: the logits after each fed token
};

// Greedy decoding with the cache: the prompt token by token, then n tokens.
Decoded greedy(const kvs::ModelConfig& m, const std::vector<float>& params, const std::vector<int32_t>& prompt, int n,
               kvs::ShiftHistory history = kvs::ShiftHistory::Raw) {
  kvs::Generator g(m, params, static_cast<int>(prompt.size()) + n, {history});
  Decoded r{prompt, {}};
  const float* logits = nullptr;
  for (size_t i = 0; i < r.ids.size(); ++i) {
    logits = g.step(r.ids[i]);
    r.logits.insert(r.logits.end(), logits, logits + m.vocab_size);
    if (i + 1 == r.ids.size() && static_cast<int>(r.ids.size()) < static_cast<int>(prompt.size()) + n)
      r.ids.push_back(kvs::argmax(logits, m.vocab_size));
  }
  return r;
}

// Largest |a - b| / (kAbsTol + kRelTol |b|) over rows [0, rows): <= 1 passes.
double worst_ratio(const std::vector<float>& a, const std::vector<float>& b, size_t n) {
  double w = 0;
  for (size_t i = 0; i < n; ++i) w = std::max(w, std::abs(double(a[i]) - b[i]) / (kAbsTol + kRelTol * std::abs(b[i])));
  return w;
}

const std::vector<int32_t> kPrompt = {5, 17, 3, 42};

}  // namespace

class GenerateVariant : public ::testing::TestWithParam<Variant> {};

TEST_P(GenerateVariant, CachedGreedyEqualsFullForwardAtEveryStep) {
  const kvs::ModelConfig m = model_of(GetParam());
  const std::vector<float> params = params_of(m);
  const int n_new = 16;  // prompt 4 + 16 = 20 of the 24 positions
  const Decoded r = greedy(m, params, kPrompt, n_new);
  ASSERT_EQ(r.ids.size(), kPrompt.size() + n_new);
  const std::vector<float> ref = full_logits(m, params, r.ids);
  const size_t V = m.vocab_size, T = r.ids.size();
  EXPECT_LE(worst_ratio(r.logits, ref, (T - 1) * V), 1.0) << "cached logits differ from the full forward";
  for (size_t t = kPrompt.size() - 1; t + 1 < T; ++t) {
    const int32_t want = kvs::argmax(ref.data() + t * V, static_cast<int>(V));
    EXPECT_EQ(r.ids[t + 1], want) << "step " << t;
  }
}

// A prompt run as blocks (chunks of 3 and one of 64: blocks shorter and longer
// than the shift window, a window crossing block boundaries), then token by
// token: the same logits as the full forward.
TEST_P(GenerateVariant, BlockPrefillEqualsFullForward) {
  const kvs::ModelConfig m = model_of(GetParam());
  const std::vector<float> params = params_of(m);
  std::vector<int32_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(static_cast<int32_t>(kvs::splitmix64(i + 100) % m.vocab_size));
  if (m.bos_token_id >= 0) {
    for (int32_t& id : ids)
      if (id == m.bos_token_id) id = m.bos_token_id + 1;
    // Documents start inside a prefill block, at a step, and twice in a row.
    for (int at : {5, 11, 12}) ids[at] = m.bos_token_id;
  }
  const std::vector<float> ref = full_logits(m, params, ids);
  const size_t V = m.vocab_size;
  if (m.document_boundaries != Docs::None) {  // the boundaries matter, so matching them means something
    kvs::ModelConfig packed = m;
    packed.document_boundaries = Docs::None;
    const std::vector<float> other = full_logits(packed, params, ids);
    EXPECT_GT(worst_ratio(other, ref, ref.size()), 100.0);
  }
  for (int chunk : {3, 64}) {
    kvs::Generator g(m, params, static_cast<int>(ids.size()), {kvs::ShiftHistory::Raw, chunk});
    const int n_prompt = 10;
    const float* l = g.prefill(std::vector<int32_t>(ids.begin(), ids.begin() + n_prompt));
    std::vector<float> got(ref.begin(), ref.begin() + (n_prompt - 1) * V);  // rows the prefill does not return
    got.insert(got.end(), l, l + V);
    for (size_t t = n_prompt; t < ids.size(); ++t) {
      l = g.step(ids[t]);
      got.insert(got.end(), l, l + V);
    }
    EXPECT_LE(worst_ratio(got, ref, ref.size()), 1.0) << "chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, GenerateVariant, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return std::string(info.param.name); });

// The controls of the eps and RoPE variants: each non-default value moves the
// full forward's logits far outside the tolerance, so a generator that fell
// back to the default (eps 1e-5, θ 10000, no scaling) would fail above.
TEST(Generate, NonDefaultNormAndRopeMatter) {
  const Variant& plain = kVariants[0];
  for (const Variant& v : kVariants) {
    if (v.eps == plain.eps && v.theta == plain.theta && v.llama3 == plain.llama3) continue;
    SCOPED_TRACE(v.name);
    Variant fallback = v;
    if (v.llama3) {
      fallback.llama3 = false;  // the same θ, unscaled
    } else {
      fallback.eps = plain.eps;
      fallback.theta = plain.theta;
    }
    const kvs::ModelConfig m = model_of(v);
    const std::vector<float> params = params_of(m);
    std::vector<int32_t> ids;
    for (int i = 0; i < 20; ++i) ids.push_back(static_cast<int32_t>(kvs::splitmix64(i + 7) % m.vocab_size));
    EXPECT_GT(worst_ratio(full_logits(model_of(fallback), params, ids), full_logits(m, params, ids),
                          ids.size() * m.vocab_size),
              100.0);
  }
}

// The negative control: the two classic cache bugs give logits far outside the
// tolerance the test above uses (from position 1 on; position 0 mixes with
// zeros in every version), so that test would catch them.
TEST(Generate, CacheBugsAreCaught) {
  for (const Variant& v : {kVariants[0], kVariants[1], kVariants[3]}) {
    const kvs::ModelConfig m = model_of(v);
    const std::vector<float> params = params_of(m);
    const std::vector<int32_t> ids = {5, 17, 3, 42, 8, 30, 11, 2};
    const std::vector<float> ref = full_logits(m, params, ids);
    const size_t V = m.vocab_size;
    for (auto history : {kvs::ShiftHistory::Mixed, kvs::ShiftHistory::Zeros}) {
      kvs::Generator g(m, params, static_cast<int>(ids.size()), {history});
      std::vector<float> got;
      for (int32_t id : ids) {
        const float* l = g.step(id);
        got.insert(got.end(), l, l + V);
      }
      EXPECT_LE(worst_ratio(got, ref, V), 1.0) << v.name << ": position 0 has nothing to mix with";
      double worst = 0;
      for (size_t t = 1; t < ids.size(); ++t)
        worst = std::max(worst, worst_ratio(std::vector<float>(got.begin() + t * V, got.begin() + (t + 1) * V),
                                            std::vector<float>(ref.begin() + t * V, ref.begin() + (t + 1) * V), V));
      EXPECT_GT(worst, 100.0) << v.name << " history " << static_cast<int>(history) << " was not caught";
    }
  }
}

// With documents too: the second prompt's BOS moved the document start to 6,
// which reset() must forget with the rest.
TEST(Generate, ResetStartsOver) {
  ASSERT_STREQ(kVariants[12].name, "docs_shift_w2");
  for (const Variant& v : {kVariants[1], kVariants[12]}) {
    const kvs::ModelConfig m = model_of(v);
    kvs::Generator g(m, params_of(m), 8);
    g.prefill(kPrompt);
    g.prefill(kPrompt);  // all 8 positions used, the shift windows full of raw values
    g.reset();
    EXPECT_EQ(g.pos(), 0);
    const float* a = g.prefill(kPrompt);
    const std::vector<float> again(a, a + m.vocab_size);
    kvs::Generator fresh(m, params_of(m), 8);
    const float* b = fresh.prefill(kPrompt);
    for (int i = 0; i < m.vocab_size; ++i) EXPECT_EQ(again[i], b[i]) << v.name << " " << i;
  }
}

TEST(Generate, LengthLimits) {
  const kvs::ModelConfig m = model_of(kVariants[0]);
  EXPECT_KVS_ERROR(kvs::Generator(m, params_of(m), m.max_position_embeddings + 1), "max_position_embeddings", "25",
                   "24");
  kvs::Generator g(m, params_of(m), 3);
  g.prefill({1, 2, 3});
  EXPECT_KVS_ERROR(g.step(4), "KV cache is full", "3 positions");
  kvs::Generator h(m, params_of(m), 3);
  EXPECT_KVS_ERROR(h.step(m.vocab_size), "token 48", "position 0", "vocabulary");
  EXPECT_KVS_ERROR(kvs::Generator(m, std::vector<float>(5), 3), "5 parameters");
}

// ---- sampling ----

namespace {
std::vector<int32_t> sample_run(const kvs::SamplingConfig& c, int n = 12) {
  const kvs::ModelConfig m = model_of(kVariants[0]);
  kvs::Generator g(m, params_of(m), static_cast<int>(kPrompt.size()) + n);
  kvs::Sampler s(c);
  const float* logits = g.prefill(kPrompt);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(s.sample(logits, m.vocab_size));
    if (i + 1 < n) logits = g.step(out.back());
  }
  return out;
}
}  // namespace

TEST(Sampling, SameSeedSameTokensOtherSeedOtherTokens) {
  kvs::SamplingConfig c;
  c.temperature = 1.5;
  c.seed = 7;
  const auto a = sample_run(c), b = sample_run(c);
  EXPECT_EQ(a, b);
  c.seed = 8;
  EXPECT_NE(sample_run(c), a);
}

TEST(Sampling, TopK1AndTinyTopPAreGreedy) {
  kvs::SamplingConfig greedy;
  greedy.temperature = 0;
  const auto want = sample_run(greedy);
  // A temperature so small that 1/T is infinite: greedy too (0 * inf made every
  // probability NaN, and the least likely token was drawn every time).
  kvs::SamplingConfig tiny;
  tiny.temperature = 1e-310;
  EXPECT_EQ(sample_run(tiny), want);
  kvs::SamplingConfig k1;
  k1.temperature = 2.0;
  k1.top_k = 1;
  EXPECT_EQ(sample_run(k1), want);
  kvs::SamplingConfig p0;
  p0.temperature = 2.0;
  p0.top_p = 1e-9;
  EXPECT_EQ(sample_run(p0), want);
}

TEST(Sampling, TopKTopPAndTemperatureShapeTheDistribution) {
  // probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1
  const float logits[4] = {std::log(0.2f), std::log(0.4f), std::log(0.1f), std::log(0.3f)};
  auto freq = [&](kvs::SamplingConfig c, int n = 20000) {
    kvs::Sampler s(c);
    std::vector<double> f(4, 0.0);
    for (int i = 0; i < n; ++i) f[s.sample(logits, 4)] += 1.0 / n;
    return f;
  };
  kvs::SamplingConfig c;
  c.seed = 1;
  auto f = freq(c);
  EXPECT_NEAR(f[1], 0.4, 0.02);
  EXPECT_NEAR(f[3], 0.3, 0.02);
  EXPECT_NEAR(f[0], 0.2, 0.02);
  EXPECT_NEAR(f[2], 0.1, 0.02);
  c.top_k = 2;  // 0.4 and 0.3, renormalised
  f = freq(c);
  EXPECT_EQ(f[0] + f[2], 0.0);
  EXPECT_NEAR(f[1], 0.4 / 0.7, 0.02);
  c.top_k = 0;
  c.top_p = 0.85;  // 0.4 + 0.3 + 0.2 reaches 0.85: the 0.1 token is out
  f = freq(c);
  EXPECT_EQ(f[2], 0.0);
  EXPECT_NEAR(f[0], 0.2 / 0.9, 0.02);
  c.top_p = 1.0;
  c.temperature = 0.5;  // squares the probabilities: 16:9:4:1
  f = freq(c);
  EXPECT_NEAR(f[1], 16.0 / 30, 0.02);
  EXPECT_NEAR(f[2], 1.0 / 30, 0.01);
}

TEST(Sampling, BadSettingsNameTheFlag) {
  kvs::SamplingConfig c;
  c.temperature = -1;
  EXPECT_KVS_ERROR(kvs::validate_sampling(c), "--temperature");
  c = {};
  c.top_k = -2;
  EXPECT_KVS_ERROR(kvs::validate_sampling(c), "--top-k");
  c = {};
  c.top_p = 0;
  EXPECT_KVS_ERROR(kvs::validate_sampling(c), "--top-p");
}

// ---- streaming text ----

TEST(TextStream, HoldsBackIncompleteCharacters) {
  using kvs::cli::TextStream;
  const std::string euro = "\xE2\x82\xAC";  // U+20AC, 3 bytes
  TextStream s("ab");
  EXPECT_EQ(s.update("abc"), "c");
  EXPECT_EQ(s.update("abc\xE2"), "");
  EXPECT_EQ(s.update("abc\xE2\x82"), "");
  EXPECT_EQ(s.update("abc" + euro), euro);
  EXPECT_EQ(s.update("abc" + euro + "\xEF\xBF\xBD"), "");  // U+FFFD may still be completed
  EXPECT_EQ(s.update("abc" + euro + "\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(s.finish("abc" + euro + "\xF0\x9F\x98\x80" + "\xC3"), "\xC3");
  TextStream split("ab\xE2\x82");  // the prompt ends inside a character
  EXPECT_EQ(split.update("ab" + euro), euro);
  EXPECT_EQ(kvs::cli::stable_utf8_length("x\xC3\xA9"), 3u);
  EXPECT_EQ(kvs::cli::stable_utf8_length("x\xC3"), 1u);
}

// ---- `kvshift generate` end to end ----

namespace {

using kvs::testing_util::run_kvshift;

// Trains a tiny model with `kvshift train` (2 steps) and returns the run dir.
std::string train_tiny(const TmpDir& tmp, int vocab) {
  nlohmann::json j = {
      {"name", "gen"},
      {"model",
       {{"hidden_size", 32},
        {"intermediate_size", 48},
        {"num_hidden_layers", 2},
        {"num_attention_heads", 4},
        {"num_key_value_heads", 2},
        {"vocab_size", vocab},
        {"max_position_embeddings", 48},
        {"kv_shift", {{"enabled", true}, {"window", 2}}}}},
      {"data", {{"type", "induction"}, {"induction", {{"token_lo", 2}, {"token_hi", vocab}, {"pool_size", 8}}}}},
      {"train",
       {{"seq_len", 32},
        {"micro_batch_size", 2},
        {"steps", 2},
        {"lr", 0.05},
        {"warmup_steps", 0},
        {"eval_every", 0},
        {"eval_sequences", 2},
        {"threads", 1}}}};
  const std::string cfg = tmp / "cfg.json", run = tmp / "run";
  kvs::testing_util::spit(cfg, j.dump());
  const auto r = run_kvshift("train --quiet --config " + cfg + " --run-dir " + run);
  EXPECT_EQ(r.code, 0) << r.out;
  return run;
}

nlohmann::json json_line(const std::string& out) {
  const size_t at = out.find('{');
  if (at == std::string::npos) return nullptr;
  return nlohmann::json::parse(out.substr(at, out.find('\n', at) - at));
}

}  // namespace

TEST(GenerateCli, GreedyIdsEqualFullForwardArgmax) {
  TmpDir tmp;
  const std::string run = train_tiny(tmp, 64);
  const auto r =
      run_kvshift("generate --checkpoint " + run + " --prompt-ids 3,9,4,7 --max-new-tokens 10 --temperature 0 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = json_line(r.out);
  const auto out = j["ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(out.size(), 10u) << r.out;
  EXPECT_EQ(j["stop"], "length");
  EXPECT_EQ(j["prompt_ids"].get<std::vector<int32_t>>(), (std::vector<int32_t>{3, 9, 4, 7}));
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;

  // The same checkpoint through the full forward: each generated id is the argmax of the row before it.
  std::vector<int32_t> ids = {3, 9, 4, 7};
  ids.insert(ids.end(), out.begin(), out.end());
  const std::string tokens = tmp / "ids.txt", npy = tmp / "logits.npy";
  std::string text;
  for (int32_t id : ids) text += std::to_string(id) + " ";
  kvs::testing_util::spit(tokens, text);
  const auto f =
      run_kvshift("forward --checkpoint " + run + "/checkpoints/step_00000002 --tokens " + tokens + " --out " + npy);
  ASSERT_EQ(f.code, 0) << f.out;
  const std::string raw = kvs::testing_util::slurp(npy);
  const size_t V = 64, T = ids.size();
  ASSERT_GE(raw.size(), T * V * 4);
  const float* logits = reinterpret_cast<const float*>(raw.data() + raw.size() - T * V * 4);  // data after the header
  for (size_t t = 3; t + 1 < T; ++t)
    EXPECT_EQ(ids[t + 1], kvs::argmax(logits + t * V, static_cast<int>(V))) << "position " << t;

  // Streaming ids (no tokenizer for a 64-token model): the same ids, space-separated.
  const auto s =
      run_kvshift("generate --checkpoint " + run + " --prompt-ids 3,9,4,7 --max-new-tokens 10 --temperature 0");
  ASSERT_EQ(s.code, 0) << s.out;
  std::string want;
  for (size_t i = 0; i < out.size(); ++i) {  // piece by piece: GCC 12 warns (-Wrestrict) about a chained +
    if (i) want += ' ';
    want += std::to_string(out[i]);
  }
  EXPECT_EQ(s.out.substr(0, want.size() + 1), want + "\n") << s.out;
}

TEST(GenerateCli, SamplingIsDeterministicBySeed) {
  TmpDir tmp;
  const std::string run = train_tiny(tmp, 64);
  auto ids = [&](int seed) {
    const auto r =
        run_kvshift("generate --checkpoint " + run + " --prompt-ids 3,9 --max-new-tokens 20 --temperature 1 " +
                    "--top-k 20 --top-p 0.95 --json --seed " + std::to_string(seed));
    EXPECT_EQ(r.code, 0) << r.out;
    return json_line(r.out)["ids"].get<std::vector<int32_t>>();
  };
  EXPECT_EQ(ids(5), ids(5));
  EXPECT_NE(ids(5), ids(6));
  // --top-k and --top-p reach the sampler: K = 1 and a tiny P leave the most
  // likely token only, so hot sampling gives the greedy ids.
  auto sampled = [&](const std::string& flags) {
    const auto r = run_kvshift("generate --checkpoint " + run + " --prompt-ids 3,9 --max-new-tokens 20 --json " + flags);
    EXPECT_EQ(r.code, 0) << r.out;
    return json_line(r.out)["ids"].get<std::vector<int32_t>>();
  };
  const auto greedy = sampled("--temperature 0");
  EXPECT_EQ(sampled("--temperature 2 --top-k 1 --seed 9"), greedy);
  EXPECT_EQ(sampled("--temperature 2 --top-p 1e-9 --seed 9"), greedy);
  EXPECT_NE(sampled("--temperature 2 --seed 9"), greedy);  // the control: hot sampling alone differs
}

TEST(GenerateCli, ErrorsAreOneLineNamingTheFlag) {
  TmpDir tmp;
  const std::string run = train_tiny(tmp, 64);
  auto one_line_error = [](const kvs::testing_util::CommandResult& r, const std::vector<std::string>& parts) {
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    for (const auto& p : parts) EXPECT_NE(r.out.find(p), std::string::npos) << "missing '" << p << "' in " << r.out;
  };
  one_line_error(run_kvshift("generate --checkpoint " + run + " --prompt-ids 1,2,3 --max-new-tokens 46"),
                 {"--max-new-tokens 46", "3 tokens", "max_position_embeddings 48"});
  one_line_error(run_kvshift("generate --checkpoint " + run + " --prompt hello"), {"--tokenizer", "--prompt-ids"});
  one_line_error(run_kvshift("generate --checkpoint " + run + " --prompt-ids 1,x"), {"--prompt-ids", "'x'"});
  one_line_error(run_kvshift("generate --checkpoint " + run + " --prompt-ids 1,99"),
                 {"--prompt-ids", "99", "vocab_size 64"});
  one_line_error(run_kvshift("generate --checkpoint " + run + " --prompt-ids 1 --top-p 0"), {"--top-p"});
  one_line_error(run_kvshift("generate --checkpoint " + run + " --prompt-ids 1 --max-new-tokens 0"),
                 {"--max-new-tokens 0"});
  one_line_error(run_kvshift("generate --checkpoint " + run), {"--prompt"});
  one_line_error(run_kvshift("generate --checkpoint " + run + " --prompt-ids ''"), {"--prompt-ids: no ids in ''"});
  one_line_error(run_kvshift("generate --checkpoint " + run + " --prompt-ids 1,,2"),
                 {"--prompt-ids: an empty item at character 2 of '1,,2'"});
  one_line_error(run_kvshift("generate --checkpoint " + run + " --prompt-ids 1,2,"),
                 {"--prompt-ids: an empty item after the last comma of '1,2,'"});
  one_line_error(run_kvshift("generate --checkpoint " + run + " --prompt-ids 1 --threads 100000"),
                 {"--threads", "100000", "4096"});
  one_line_error(run_kvshift("generate --checkpoint " + run + " --prompt-ids 1 --tokenizer " + (tmp / "nosuchdir")),
                 {"nosuchdir: no such directory"});
  // Negative values of unsigned or count options (a seed of -1 wrapped around; threads -2 ran as auto).
  for (const char* flag : {"--seed", "--threads", "--top-k"})
    one_line_error(run_kvshift("generate --checkpoint " + run + " --prompt-ids 1 " + flag + " -2"),
                   {flag, "must be a non-negative integer, got '-2'"});
  // Past 2^64 - 1 (it saturated to 2^64 - 1: the same text as that seed).
  one_line_error(run_kvshift("generate --checkpoint " + run + " --prompt-ids 1 --seed 18446744073709551616"),
                 {"--seed", "must be at most 18446744073709551615, got '18446744073709551616'"});
  const auto h = run_kvshift("generate --help");
  for (const char* flag : {"--checkpoint", "--prompt", "--prompt-ids", "--max-new-tokens", "--temperature", "--top-k",
                           "--top-p", "--seed", "--tokenizer", "--threads", "--json"})
    EXPECT_NE(h.out.find(flag), std::string::npos) << flag;
}

// The text path: a sentencepiece tokenizer (BOS first, text streamed), found
// through --tokenizer or the run config's data.tokenizer.
TEST(GenerateCli, TextWithSentencepieceTokenizer) {
  TmpDir tmp;
  const std::string tok_dir = kvs::testing_util::shared_tokenizer_dir();
  const auto tok = kvs::load_tokenizer(tok_dir);
  ASSERT_GE(tok->bos_id(), 0);
  const std::string run = train_tiny(tmp, tok->vocab_size());
  const std::string base =
      "generate --checkpoint " + run + " --prompt 'the model learns' --max-new-tokens 12 --temperature 0";
  const auto r = run_kvshift(base + " --json --tokenizer " + tok_dir);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = json_line(r.out);
  std::vector<int32_t> prompt = {tok->bos_id()};
  for (int32_t id : tok->encode("the model learns")) prompt.push_back(id);
  EXPECT_EQ(j["prompt_ids"].get<std::vector<int32_t>>(), prompt);
  std::vector<int32_t> all = prompt;
  for (int32_t id : j["ids"].get<std::vector<int32_t>>()) all.push_back(id);
  const std::string want = tok->decode(all).substr(tok->decode(prompt).size());
  EXPECT_EQ(j["text"].get<std::string>(), want);
  // Streaming prints the same text (then a newline, then the summary on stderr).
  const auto s = run_kvshift(base + " --tokenizer " + tok_dir);
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_EQ(s.out.substr(0, want.size() + 1), want + "\n") << s.out;
  // No --tokenizer: the run config's data.tokenizer.
  const std::string rc_path = run + "/checkpoints/step_00000002/run_config.json";
  nlohmann::json rc = nlohmann::json::parse(kvs::testing_util::slurp(rc_path));
  rc["data"]["tokenizer"] = tok_dir;
  kvs::testing_util::spit(rc_path, rc.dump());
  const auto c = run_kvshift(base + " --json");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_EQ(json_line(c.out)["ids"], j["ids"]);
  rc["data"]["tokenizer"] = tmp / "nowhere";
  kvs::testing_util::spit(rc_path, rc.dump());
  const auto e = run_kvshift(base);
  EXPECT_EQ(e.code, 1);
  EXPECT_NE(e.out.find("nowhere"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("--tokenizer"), std::string::npos) << e.out;
}

// Generation stops when the sampled token is the tokenizer's EOS. The
// checkpoint's LM-head row of EOS becomes the first greedy token's row scaled
// away from zero (x2 if that token's logit is positive, x0.5 if negative), so
// EOS outscores every token at the first step: nothing is generated and the stop
// is "eos". The same weights without a tokenizer (no EOS) run to the length.
TEST(GenerateCli, StopsAtTheTokenizersEos) {
  TmpDir tmp;
  const std::string tok_dir = kvs::testing_util::shared_tokenizer_dir();
  const auto tok = kvs::load_tokenizer(tok_dir);
  const int32_t eos = tok->eos_id();
  ASSERT_GE(eos, 0);
  const std::string run = train_tiny(tmp, tok->vocab_size());
  const std::string base =
      "generate --prompt 'the model learns' --max-new-tokens 6 --temperature 0 --json --tokenizer " + tok_dir +
      " --checkpoint ";
  const nlohmann::json before = json_line(run_kvshift(base + run).out);
  ASSERT_EQ(before["stop"], "length") << before;
  const auto prompt = before["prompt_ids"].get<std::vector<int32_t>>();
  const int32_t first = before["ids"][0].get<int32_t>();
  ASSERT_NE(first, eos);

  const kvs::LoadedCheckpoint ck = kvs::read_checkpoint(run + "/checkpoints/step_00000002");
  kvs::Generator g(ck.model, kvs::read_model_weights(kvs::open_model_checkpoint(ck.dir, false)),
                   static_cast<int>(prompt.size()) + 1);
  const float logit = g.prefill(prompt)[first];
  ASSERT_NE(logit, 0.0f);
  kvs::CheckpointData data = ck.data;
  const int64_t H = ck.model.hidden_size;
  for (kvs::StTensor& t : data.model) {
    if (t.name != "lm_head.weight") continue;
    std::vector<float> w = kvs::tensor_to_f32(t);
    for (int64_t i = 0; i < H; ++i) w[eos * H + i] = (logit > 0 ? 2.0f : 0.5f) * w[first * H + i];
    t = kvs::make_f32_tensor(t.name, t.shape, w.data());
  }
  const std::string edited = kvs::save_checkpoint(tmp / "edited", 2, data);
  const auto r = run_kvshift(base + edited);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = json_line(r.out);
  EXPECT_EQ(j["stop"], "eos") << j;
  EXPECT_EQ(j["ids"], nlohmann::json::array()) << j;
  std::string ids;
  for (int32_t id : prompt) {
    if (!ids.empty()) ids += ',';
    ids += std::to_string(id);
  }
  const nlohmann::json plain =
      json_line(run_kvshift("generate --checkpoint " + edited + " --prompt-ids " + ids +
                            " --max-new-tokens 6 --temperature 0 --json").out);
  EXPECT_EQ(plain["stop"], "length") << plain;
  EXPECT_EQ(plain["ids"][0], eos) << plain;
}

// A 256-token model reads and writes bytes without being told (the byte-level LM configs).
TEST(GenerateCli, ByteModelTakesText) {
  TmpDir tmp;
  const std::string run = train_tiny(tmp, 256);
  const std::string base =
      "generate --checkpoint " + run + " --prompt hi --max-new-tokens 10 --temperature 0.7 --seed 3";
  const auto r = run_kvshift(base + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = json_line(r.out);
  EXPECT_EQ(j["prompt_ids"].get<std::vector<int32_t>>(), (std::vector<int32_t>{'h', 'i'}));  // no BOS
  std::string bytes;
  for (int32_t id : j["ids"].get<std::vector<int32_t>>()) bytes += static_cast<char>(id);
  const auto s = run_kvshift(base);
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_EQ(s.out.substr(0, bytes.size() + 1), bytes + "\n") << s.out;
}

// A model whose vocabulary is padded past its tokenizer's samples only ids the
// tokenizer can decode, however flat the distribution.
TEST(GenerateCli, APaddedVocabularySamplesOnlyTheTokenizersIds) {
  TmpDir tmp;
  const std::string tok_dir = kvs::testing_util::shared_tokenizer_dir();
  const int V = kvs::load_tokenizer(tok_dir)->vocab_size();
  const std::string run = train_tiny(tmp, V + 128);
  for (int seed = 1; seed <= 3; ++seed) {
    const auto r = run_kvshift("generate --checkpoint " + run + " --tokenizer " + tok_dir +
                               " --prompt 'the model' --max-new-tokens 12 --temperature 20 --json --seed " +
                               std::to_string(seed));
    ASSERT_EQ(r.code, 0) << r.out;
    for (int32_t id : json_line(r.out)["ids"].get<std::vector<int32_t>>()) EXPECT_LT(id, V) << r.out;
  }
}

// Non-finite weights are a one-line error in generate and eval, not tokens
// (every comparison with NaN is false) or a "nan" loss with exit 0: generate
// refuses them as it reads them; finite weights whose activations overflow
// stop it at the first non-finite logit.
TEST(GenerateCli, NonFiniteWeightsAreAnErrorInGenerateAndEval) {
  TmpDir tmp;
  const std::string run = train_tiny(tmp, 64);
  auto edited_with = [&](float value, const std::string& name) {
    kvs::LoadedCheckpoint ck = kvs::read_checkpoint(run + "/checkpoints/step_00000002");
    for (kvs::StTensor& t : ck.data.model) {
      if (t.name != "model.norm.weight") continue;
      std::vector<float> w = kvs::tensor_to_f32(t);
      const size_t end = std::isnan(value) ? 4 : w.size();  // one NaN; or every gain from 3 on huge
      for (size_t i = 3; i < end; ++i) w[i] = value;
      t = kvs::make_f32_tensor(t.name, t.shape, w.data());
    }
    return kvs::save_checkpoint(tmp / name, 2, ck.data);
  };
  const std::string edited = edited_with(NAN, "edited"), overflowing = edited_with(3e38f, "overflowing");
  for (const char* temperature : {"0", "1"}) {
    const auto r = run_kvshift("generate --checkpoint " + edited + " --prompt-ids 3,9 --max-new-tokens 4 --temperature " +
                               temperature);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_NE(r.out.find("/model.safetensors: tensor 'model.norm.weight' element 3 is nan (refusing to run a broken "
                         "model)"),
              std::string::npos)
        << r.out;
    const auto o = run_kvshift("generate --checkpoint " + overflowing +
                               " --prompt-ids 3,9 --max-new-tokens 4 --temperature " + temperature);
    EXPECT_EQ(o.code, 1) << o.out;
    EXPECT_NE(o.out.find("at generated token 1: its weights or activations are not finite"), std::string::npos)
        << o.out;
  }
  const auto e = run_kvshift("eval --checkpoint " + edited);
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_NE(e.out.find("val_loss is nan"), std::string::npos) << e.out;
}

// eval runs the checkpoint's model, so --config's seq_len is checked against it,
// not against the model section of the file --config names.
TEST(EvalCli, SeqLenIsCheckedAgainstTheCheckpointsModel) {
  TmpDir tmp;
  const std::string run = train_tiny(tmp, 64);  // max_position_embeddings 48
  nlohmann::json j = nlohmann::json::parse(kvs::testing_util::slurp(tmp / "cfg.json"));
  j["model"]["max_position_embeddings"] = 128;
  j["train"]["seq_len"] = 96;
  kvs::testing_util::spit(tmp / "long.json", j.dump());
  const auto r = run_kvshift("eval --checkpoint " + run + " --config " + (tmp / "long.json"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("with the model of"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max_position_embeddings"), std::string::npos) << r.out;
  EXPECT_EQ(run_kvshift("eval --checkpoint " + run + " --config " + (tmp / "cfg.json")).code, 0);
  // The other way round: a seq_len the checkpoint holds, past the --config file's own model.
  j["model"]["max_position_embeddings"] = 16;
  j["train"]["seq_len"] = 40;
  kvs::testing_util::spit(tmp / "short_model.json", j.dump());
  const auto ok = run_kvshift("eval --checkpoint " + run + " --config " + (tmp / "short_model.json"));
  EXPECT_EQ(ok.code, 0) << ok.out;
  const auto set = run_kvshift("eval --checkpoint " + run + " --config " + (tmp / "cfg.json") +
                               " --set train.seq_len=40 --set model.max_position_embeddings=16");
  EXPECT_NE(set.out.find("only data, train and parallel keys can be overridden"), std::string::npos) << set.out;
}

// Inference reads the weights alone: generate and eval neither read nor check
// optimizer.safetensors (twice the weights' size), so a damaged one does not
// stop them; a damaged model.safetensors still does.
TEST(GenerateCli, InferenceNeedsNoOptimizerState) {
  TmpDir tmp;
  const std::string run = train_tiny(tmp, 64);
  const std::string step = run + "/checkpoints/step_00000002";
  std::filesystem::resize_file(step + "/optimizer.safetensors", 100);
  const std::string gen = "generate --prompt-ids 3,9 --max-new-tokens 2 --temperature 0 --checkpoint ";
  const auto g = run_kvshift(gen + step);
  EXPECT_EQ(g.code, 0) << g.out;
  const auto e = run_kvshift("eval --checkpoint " + step);
  EXPECT_EQ(e.code, 0) << e.out;
  std::filesystem::resize_file(step + "/model.safetensors", 100);
  const auto bad = run_kvshift(gen + step);
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("model.safetensors"), std::string::npos) << bad.out;
}
