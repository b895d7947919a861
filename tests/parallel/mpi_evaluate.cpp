// Evaluation split over data-parallel replicas (train/trainer.h, evaluate with
// a dp communicator: the world here): each replica runs micro-batches d,
// d + dp, ... and every rank returns one process's numbers bit for bit (the
// loss, the accuracy, the scored tokens, blended data's per-source numbers),
// also when the micro-batches do not divide by the replicas or are fewer.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "data/dataset.h"
#include "model/cpu_engine.h"
#include "model/params.h"
#include "parallel/mpi_world.h"
#include "train/trainer.h"

namespace kvs {
namespace {

using testing_util::world;

// Counts the forwards it runs: each replica runs only its share.
class CountingEngine : public CpuEngine {
 public:
  using CpuEngine::CpuEngine;
  double forward(const Batch& b, float* token_losses, int32_t* argmax, float* logits) override {
    ++forwards;
    return CpuEngine::forward(b, token_losses, argmax, logits);
  }
  int forwards = 0;
};

// Blended data's sources, one sequence in three from the second (for the per-source numbers).
class TwoSources : public Dataset {
 public:
  explicit TwoSources(const Dataset& inner) : inner_(inner) {}
  void get(Split s, uint64_t i, int32_t* in, int32_t* tg, float* m) const override { inner_.get(s, i, in, tg, m); }
  uint64_t size(Split s) const override { return inner_.size(s); }
  std::string describe() const override { return "two sources"; }
  std::vector<std::string> source_names() const override { return {"a", "b"}; }
  size_t source_of(Split, uint64_t i) const override { return i % 3 == 2; }

 private:
  const Dataset& inner_;
};

TEST(DataParallelEvaluation, EveryReplicaReturnsOneProcessesNumbersBitForBit) {
  ModelConfig m;
  m.hidden_size = 16;
  m.intermediate_size = 32;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.vocab_size = 40;
  m.max_position_embeddings = 16;
  const int B = 2, T = 16;
  CountingEngine e(m, B, T);
  std::vector<float> p(e.layout().total);
  init_params(e.layout(), m, 42, p.data());
  e.write_params(p.data());
  DataConfig dc;
  dc.type = DatasetType::Induction;
  dc.induction.token_lo = 2;
  dc.induction.token_hi = m.vocab_size;
  dc.induction.pool_size = 8;
  const auto induction = make_dataset(dc, T, m.vocab_size, 7, "");
  const TwoSources blended(*induction);
  const int D = world().size(), d = world().rank();
  for (const Dataset* data : std::vector<const Dataset*>{induction.get(), &blended}) {
    for (int64_t sequences : {1, 5, 13}) {  // 1, 3 and 7 micro-batches of 2 (the last of 1)
      e.forwards = 0;
      const EvalResult one = evaluate(e, *data, B, T, sequences);
      const int64_t K = (sequences + B - 1) / B;
      EXPECT_EQ(e.forwards, K);
      e.forwards = 0;
      const EvalResult split = evaluate(e, *data, B, T, sequences, nullptr, nullptr, &world());
      EXPECT_EQ(e.forwards, K > d ? (K - d + D - 1) / D : 0) << sequences << " sequences, rank " << d;
      EXPECT_EQ(split.loss, one.loss) << sequences << " sequences, rank " << d;
      EXPECT_EQ(split.accuracy, one.accuracy) << sequences << " sequences, rank " << d;
      EXPECT_EQ(split.scored_tokens, one.scored_tokens) << sequences << " sequences, rank " << d;
      EXPECT_EQ(split.sequences, sequences);
      EXPECT_GT(one.scored_tokens, 0);
      ASSERT_EQ(split.sources.size(), data == &blended ? 2u : 0u);
      ASSERT_EQ(one.sources.size(), split.sources.size());
      for (size_t s = 0; s < one.sources.size(); ++s) {  // each source's numbers, bit for bit
        // A source without sequences among so few has NaN numbers (null in JSON) in both.
        auto same = [](double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); };
        EXPECT_PRED2(same, split.sources[s].loss, one.sources[s].loss) << sequences << " sequences, source " << s;
        EXPECT_PRED2(same, split.sources[s].accuracy, one.sources[s].accuracy) << sequences << " sequences, " << s;
        EXPECT_EQ(split.sources[s].scored_tokens, one.sources[s].scored_tokens) << s;
        EXPECT_EQ(split.sources[s].sequences, one.sources[s].sequences) << s;
      }
    }
  }
}

}  // namespace
}  // namespace kvs
