#include "parallel/pipeline.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace kvs {

StageSplit StageSplit::make(const ModelConfig& m, int pp, int v, const std::vector<int>& layers_per_stage,
                            const std::string& origin) {
  const int L = m.num_hidden_layers;
  // Every stage holds a layer: more stages than layers never split (and pp x v in 64 bits, not wrapped to 0).
  if (static_cast<int64_t>(pp) * v > L)
    fail("{}: parallel.pp x parallel.virtual_stages ({} x {}) is more stages than model.num_hidden_layers ({}): "
         "every stage needs at least one layer",
         origin, pp, v, L);
  const int S = pp * v;
  StageSplit s;
  s.pp = pp;
  s.v = v;
  s.first.assign(S + 1, 0);
  if (layers_per_stage.empty()) {
    if (L % S != 0)
      fail("{}: parallel.pp x parallel.virtual_stages ({} x {}) must divide model.num_hidden_layers ({}), or "
           "parallel.layers_per_stage must list the layers of each stage",
           origin, pp, v, L);
    for (int i = 0; i <= S; ++i) s.first[i] = i * (L / S);
    return s;
  }
  if (static_cast<int>(layers_per_stage.size()) != S)
    fail("{}: parallel.layers_per_stage: {} entries for pp x virtual_stages = {} stages", origin,
         layers_per_stage.size(), S);
  for (size_t i = 0; i < layers_per_stage.size(); ++i)
    if (layers_per_stage[i] < 1)
      fail("{}: parallel.layers_per_stage[{}]: every stage needs at least one layer, got {}", origin, i,
           layers_per_stage[i]);
  const int64_t total = std::accumulate(layers_per_stage.begin(), layers_per_stage.end(), int64_t{0});
  if (total != L)
    fail("{}: parallel.layers_per_stage: the stages hold {} layers, model.num_hidden_layers is {}", origin, total, L);
  for (int i = 0; i < S; ++i) s.first[i + 1] = s.first[i] + layers_per_stage[i];
  return s;
}

ModelPart ModelPart::whole(const ModelConfig& m) {
  ModelPart p;
  p.layers.resize(m.num_hidden_layers);
  std::iota(p.layers.begin(), p.layers.end(), 0);
  return p;
}

ModelPart ModelPart::of(const StageSplit& split, int rank) {
  ModelPart p;
  for (int c = 0; c < split.v; ++c) {
    const int s = split.stage(rank, c);
    for (int l = split.begin(s); l < split.end(s); ++l) p.layers.push_back(l);
  }
  p.embedding = rank == split.rank_of(0);
  p.head = rank == split.rank_of(split.stages() - 1);
  return p;
}

bool ModelPart::holds(int layer) const { return std::binary_search(layers.begin(), layers.end(), layer); }

bool ModelPart::is_whole(const ModelConfig& m) const {
  return embedding && head && static_cast<int>(layers.size()) == m.num_hidden_layers;
}

}  // namespace kvs
