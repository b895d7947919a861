// Helpers shared by the subcommands that read a checkpoint.
#pragma once
#include <memory>
#include <string>

#include "model/engine.h"
#include "train/model_io.h"

namespace kvs::cli {

// An engine holding the checkpoint's weights, sized for B x T micro-batches.
inline std::unique_ptr<Engine> engine_for(const LoadedCheckpoint& ck, int B, int T, const std::string& device) {
  auto e = make_engine(ck.model, B, T, device);
  load_model_tensors(*e, ck.data.model, ck.dir + "/model.safetensors");
  return e;
}

}  // namespace kvs::cli
