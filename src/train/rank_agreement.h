// What every rank of a run must hold alike: its config, and the checkpoint it
// resumes from or takes its weights from. A rank started otherwise (a per-node
// copy that drifted, an argument on one side of a launch) would exchange other
// shapes or silently train a mix of two models; one all-reduce of a hash, before
// any work, finds it.
#pragma once
#include <cstdint>
#include <string>

#include "dist/comm.h"
#include "model/config.h"

namespace kvs {

// Whether every rank of `comm` passed the same `h` (one all-reduce; true in one process).
bool same_on_every_rank(uint64_t h, dist::Communicator& comm);

// Throws on every rank unless every rank of `comm` was given the same config
// (its JSON as given, relative paths as written so that per-node copies
// elsewhere agree; train.threads may differ per node). train, bench and eval
// call it before any work.
void check_same_config_on_every_rank(const Config& config, dist::Communicator& comm);

// A checkpoint directory's identity for that check: the hash of its
// manifest.json (sizes and content hashes of its files, so copies of it on
// other nodes agree), or, in a checkpoint from before manifests, of its
// trainer_state.json and its files' sizes.
uint64_t checkpoint_identity(const std::string& dir);

}  // namespace kvs
