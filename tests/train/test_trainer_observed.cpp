// The trainer observed from outside: the learning rate each step logs and applies, the gradient
// clipping it decides on, and the evaluation's accuracy. The other training tests compare one run
// with another of the same trainer, so a schedule ignored, a clip never applied or an accuracy
// counted against the wrong tokens passed them.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "model/config.h"
#include "model/cpu_engine.h"
#include "model/params.h"
#include "model/sampler.h"
#include "train/checkpoint.h"
#include "train/model_io.h"
#include "train/trainer.h"
#include "tiny_induction.h"

namespace fs = std::filesystem;
using kvs::Config;

namespace {

// Vanilla (no shift coefficients clamped into [0, 1]), one micro-batch per step, no weight decay,
// warmup over 4 steps then cosine to 1e-3, one thread.
Config tiny(int steps) {
  return kvs::testing_util::tiny_induction(false, {{"steps", steps},
                                                   {"grad_accum_steps", 1},
                                                   {"min_lr", 1e-3},
                                                   {"warmup_steps", 4},
                                                   {"schedule", "cosine"},
                                                   {"weight_decay", 0.0},
                                                   {"eval_every", 0},
                                                   {"threads", 1}});
}

std::string run(const Config& c, const std::string& name) {
  const std::string d = testing::TempDir() + "kvs_wiring_" + name;
  fs::remove_all(d);
  kvs::train(c, {d, false, true});
  return d;
}

// step -> that train line of metrics.jsonl
std::map<int, nlohmann::json> train_lines(const std::string& dir) {
  std::map<int, nlohmann::json> m;
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] == "train") m[j["step"].get<int>()] = j;
  }
  return m;
}

// name -> values, of the model or the optimizer tensors of the run's newest checkpoint
std::map<std::string, std::vector<float>> tensors(const std::string& dir, bool optimizer) {
  const auto ck = kvs::read_checkpoint(kvs::latest_checkpoint(dir + "/checkpoints"), /*with_optimizer=*/true);
  std::map<std::string, std::vector<float>> m;
  for (const auto& t : optimizer ? ck.data.optimizer : ck.data.model) m[t.name] = kvs::tensor_to_f32(t);
  return m;
}

}  // namespace

// Linear warmup over 4 steps to 1e-2, then cosine towards 1e-3 (reached one step past step 10),
// written out here rather than through learning_rate(): the logged lr of every step, and the first
// step's update, which for Adam is lr * g / (|g| + eps) per parameter (m-hat = g, v-hat = g^2
// after one step).
TEST(OptimizerWiring, TheScheduledLearningRateIsLoggedAndApplied) {
  const Config c = tiny(10);
  const auto lines = train_lines(run(c, "schedule"));
  ASSERT_EQ(lines.size(), 10u);
  const double pi = 3.141592653589793;
  for (int done = 1; done <= 10; ++done) {
    const double want = done <= 4 ? 1e-2 * done / 4 : 1e-3 + 0.5 * 9e-3 * (1 + std::cos(pi * (done - 5) / 6.0));
    EXPECT_NEAR(lines.at(done)["lr"].get<double>(), want, 1e-12) << "step " << done;
  }

  Config one = c;
  one.train.steps = 1;
  Config frozen = one;
  frozen.train.lr = frozen.train.min_lr = 0;  // the same initial weights, unchanged
  const auto p0 = tensors(run(frozen, "frozen"), false);
  const std::string stepped = run(one, "one_step");
  const auto p1 = tensors(stepped, false), opt = tensors(stepped, true);
  const double lr = 1e-2 / 4, b1 = c.train.beta1, b2 = c.train.beta2;
  int moved = 0;
  for (const auto& [name, after] : p1) {
    const auto& before = p0.at(name);
    const auto& m = opt.at("exp_avg." + name);
    const auto& v = opt.at("exp_avg_sq." + name);
    for (size_t i = 0; i < after.size(); ++i) {
      const double g = m[i] / (1 - b1), g2 = v[i] / (1 - b2);
      const double want = -lr * g / (std::sqrt(g2) + c.train.eps);
      ASSERT_NEAR(after[i] - before[i], want, 1e-3 * lr) << name << "[" << i << "]";
      moved += std::abs(want) > 0.5 * lr;
    }
  }
  EXPECT_GT(moved, 100) << "parameters that moved by about lr";
}

// "wsd" through a config file's keys: warmup over 4 steps to 1e-2, the stable lr through step 6,
// then the last 4 steps (7 ... 10 done) in 1-sqrt towards 1e-3 (reached one step past step 10),
// written out here.
TEST(OptimizerWiring, TheWarmupStableDecayScheduleIsLogged) {
  Config c = tiny(10);
  c.train.schedule = kvs::LrSchedule::Wsd;
  c.train.decay_steps = 4;
  c.train.decay_shape = kvs::LrDecayShape::OneMinusSqrt;
  const auto lines = train_lines(run(kvs::config_from_json(kvs::to_json(c), "wsd"), "wsd"));
  ASSERT_EQ(lines.size(), 10u);
  for (int done = 1; done <= 10; ++done) {
    const double want = done <= 4   ? 1e-2 * done / 4
                        : done <= 6 ? 1e-2
                                    : 1e-3 + 9e-3 * (1 - std::sqrt((done - 7) / 4.0));
    EXPECT_NEAR(lines.at(done)["lr"].get<double>(), want, 1e-12) << "step " << done;
  }
}

// One step with grad_clip 0 (off), 1e6 (above the norm: no effect) and 1e-3 (below it): the
// first moment is (1 - beta1) x the gradient actually applied, so it must be the unclipped one
// x 1e-3 / (norm + 1e-6) in the clipped run and unchanged in the other; the logged grad_norm is
// the norm before clipping, the same in all three, and equals |m| / (1 - beta1) of the first.
TEST(OptimizerWiring, GradientsAboveGradClipAreScaledToIt) {
  std::map<double, std::string> dirs;
  for (double clip : {0.0, 1e6, 1e-3}) {
    Config c = tiny(1);
    c.train.grad_clip = clip;
    dirs[clip] = run(c, "clip_" + std::to_string(clip));
  }
  const double norm = train_lines(dirs[0.0]).at(1)["grad_norm"].get<double>();
  ASSERT_GT(norm, 1e-3) << "the clip below must be active";
  for (const auto& [clip, dir] : dirs) EXPECT_EQ(train_lines(dir).at(1)["grad_norm"].get<double>(), norm) << clip;

  const auto free = tensors(dirs[0.0], true), high = tensors(dirs[1e6], true), low = tensors(dirs[1e-3], true);
  const double scale = 1e-3 / (norm + 1e-6), b1 = tiny(1).train.beta1;
  double m_sq = 0;
  for (const auto& [name, m] : free) {
    if (name.rfind("exp_avg.", 0) != 0) continue;
    EXPECT_EQ(high.at(name), m) << name;
    const auto& clipped = low.at(name);
    for (size_t i = 0; i < m.size(); ++i) {
      ASSERT_NEAR(clipped[i], m[i] * scale, 1e-5 * std::abs(m[i] * scale) + 1e-12) << name << "[" << i << "]";
      m_sq += static_cast<double>(m[i]) * m[i];
    }
  }
  EXPECT_NEAR(std::sqrt(m_sq) / (1 - b1), norm, 1e-5 * norm);
}

// kvs::evaluate's accuracy is the argmax hit rate over the scored positions, over micro-batches
// of 4, 4 and 2 sequences. The targets are made from the model's own argmax: right at even
// positions, off by one at odd ones, every fifth position unscored; so the accuracy must be the
// share of even positions among the scored ones (about 1/2), where counting against the inputs
// (about 1/30), or the unscored positions, gives another number.
TEST(Evaluation, AccuracyIsTheArgmaxHitRateOverScoredPositions) {
  const Config c = tiny(1);
  const int T = c.train.seq_len, V = c.model.vocab_size, n = 10;
  kvs::CpuEngine engine(c.model, 4, T);
  const kvs::ParamLayout layout = kvs::ParamLayout::build(c.model);
  std::vector<float> params(layout.total);
  kvs::init_params(layout, c.model, 3, params.data());
  engine.write_params(params.data());

  struct Fixed : kvs::Dataset {
    std::vector<std::vector<int32_t>> in, tg;
    std::vector<std::vector<float>> mask;
    void get(kvs::Split, uint64_t i, int32_t* a, int32_t* b, float* m) const override {
      std::copy(in[i].begin(), in[i].end(), a);
      std::copy(tg[i].begin(), tg[i].end(), b);
      std::copy(mask[i].begin(), mask[i].end(), m);
    }
    uint64_t size(kvs::Split) const override { return in.size(); }
    std::string describe() const override { return "fixed"; }
  } data;
  std::mt19937 rng(5);
  int scored = 0, right = 0;
  std::vector<float> logits(static_cast<size_t>(T) * V);
  for (int s = 0; s < n; ++s) {
    std::vector<int32_t> in(T), tg(T, 0);
    std::vector<float> mask(T);
    for (int t = 0; t < T; ++t) {
      in[t] = 2 + static_cast<int32_t>(rng() % (V - 2));
      mask[t] = t % 5 == 4 ? 0.0f : 1.0f;
    }
    engine.forward({1, T, in.data(), tg.data(), mask.data()}, nullptr, nullptr, logits.data());
    for (int t = 0; t < T; ++t) {
      const int32_t best = kvs::argmax(logits.data() + static_cast<size_t>(t) * V, V);
      tg[t] = t % 2 == 0 ? best : (best + 1) % V;
      if (mask[t] != 0.0f) {
        ++scored;
        right += t % 2 == 0;
      }
    }
    data.in.push_back(in);
    data.tg.push_back(tg);
    data.mask.push_back(mask);
  }
  const kvs::EvalResult r = kvs::evaluate(engine, data, 4, T, n);
  EXPECT_EQ(r.sequences, n);
  EXPECT_EQ(r.scored_tokens, scored);
  EXPECT_DOUBLE_EQ(r.accuracy, static_cast<double>(right) / scored);
}

// Blended data: evaluate() splits the same sequences by source. Each source's val_loss must be
// the mean token loss of its own sequences (checked one sequence at a time), its accuracy and
// counts its own; the sources weighted by their scored tokens give the total.
TEST(Evaluation, BlendedDataGivesEachSourcesNumbersOverItsOwnSequences) {
  const Config c = tiny(1);
  const int T = c.train.seq_len, V = c.model.vocab_size, n = 11;
  kvs::CpuEngine engine(c.model, 4, T);
  const kvs::ParamLayout layout = kvs::ParamLayout::build(c.model);
  std::vector<float> params(layout.total);
  kvs::init_params(layout, c.model, 3, params.data());
  engine.write_params(params.data());

  // Source 1 holds sequences 1, 4, 7, 10, each one token repeated.
  struct TwoSources : kvs::Dataset {
    int T = 0, V = 0;
    void get(kvs::Split, uint64_t i, int32_t* a, int32_t* b, float* m) const override {
      std::mt19937 rng(static_cast<uint32_t>(i));
      for (int t = 0; t < T; ++t) {
        a[t] = source_of(kvs::Split::Val, i) ? 7 : 2 + static_cast<int32_t>(rng() % (V - 2));
        b[t] = source_of(kvs::Split::Val, i) ? 7 : 2 + static_cast<int32_t>(rng() % (V - 2));
        m[t] = (t + static_cast<int>(i)) % 3 == 0 ? 0.0f : 1.0f;
      }
    }
    uint64_t size(kvs::Split) const override { return 100; }
    std::string describe() const override { return "two"; }
    std::vector<std::string> source_names() const override { return {"web", "code"}; }
    size_t source_of(kvs::Split, uint64_t i) const override { return i % 3 == 1; }
  } data;
  data.T = T;
  data.V = V;
  double loss[2] = {0, 0}, scored[2] = {0, 0}, right[2] = {0, 0};
  int64_t seqs[2] = {0, 0};
  std::vector<int32_t> in(T), tg(T), am(T);
  std::vector<float> mask(T), tl(T);
  for (int i = 0; i < n; ++i) {
    data.get(kvs::Split::Val, i, in.data(), tg.data(), mask.data());
    engine.forward({1, T, in.data(), tg.data(), mask.data()}, tl.data(), am.data(), nullptr);
    const size_t s = data.source_of(kvs::Split::Val, i);
    ++seqs[s];
    for (int t = 0; t < T; ++t)
      if (mask[t] != 0.0f) loss[s] += tl[t], ++scored[s], right[s] += am[t] == tg[t];
  }
  const kvs::EvalResult r = kvs::evaluate(engine, data, 4, T, n);
  ASSERT_EQ(r.sources.size(), 2u);
  double weighted = 0;
  for (size_t s = 0; s < 2; ++s) {
    const kvs::EvalResult::Source& got = r.sources[s];
    EXPECT_EQ(got.name, s ? "code" : "web");
    EXPECT_EQ(got.sequences, seqs[s]);
    EXPECT_EQ(got.scored_tokens, scored[s]);
    EXPECT_NEAR(got.loss, loss[s] / scored[s], 1e-6 * loss[s] / scored[s]) << s;
    EXPECT_DOUBLE_EQ(got.accuracy, right[s] / scored[s]) << s;
    weighted += got.loss * got.scored_tokens;
  }
  EXPECT_EQ(seqs[1], 4);
  EXPECT_NE(r.sources[0].loss, r.sources[1].loss);  // told apart
  EXPECT_NEAR(weighted / r.scored_tokens, r.loss, 1e-9 * r.loss);
}
