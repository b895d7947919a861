// Pipeline parallelism (docs/PARALLEL.md): the decoder layers split into
// stages of consecutive layers over the pp ranks of a pipeline group. With
// virtual_stages = v > 1 (Megatron's interleaved 1F1B) the layers are cut into
// pp * v virtual stages and rank r holds virtual stages r, pp + r, 2 pp + r, ...
// (its "chunks"), so a micro-batch visits every rank v times. The embedding
// lives with virtual stage 0, the final norm, the LM head and the loss with
// the last one; with tied embeddings the last stage keeps its own copy of the
// embedding (as its LM head), whose gradient is summed with the first
// stage's so that both copies stay equal.
#pragma once
#include <string>
#include <vector>

#include "model/config.h"

namespace kvs {

namespace dist {
class Communicator;
}

// This process's place in its pipeline group.
struct PipelineParallel {
  int rank = 0;
  int size = 1;
  dist::Communicator* comm = nullptr;
  int virtual_stages = 1;
};

// The layers of every virtual stage.
struct StageSplit {
  int pp = 1, v = 1;
  std::vector<int> first;  // [pp * v + 1]: virtual stage s holds layers [first[s], first[s + 1])

  // An even split, or layers_per_stage (pp * v entries); a shape that does not
  // split is a kvs::Error naming the key (origin: the config file).
  static StageSplit make(const ModelConfig& m, int pp, int v, const std::vector<int>& layers_per_stage,
                         const std::string& origin);
  int stages() const { return pp * v; }
  int stage(int rank, int chunk) const { return chunk * pp + rank; }
  int rank_of(int stage) const { return stage % pp; }
  int chunk_of(int stage) const { return stage / pp; }
  int begin(int s) const { return first[s]; }
  int end(int s) const { return first[s + 1]; }
};

// What one rank holds of the model.
struct ModelPart {
  std::vector<int> layers;  // ascending
  bool embedding = true;    // virtual stage 0
  bool head = true;         // the last virtual stage: final norm, LM head, loss
  static ModelPart whole(const ModelConfig& m);
  static ModelPart of(const StageSplit& split, int rank);
  bool holds(int layer) const;
  bool is_whole(const ModelConfig& m) const;
};

}  // namespace kvs
