// Which checkpoint a `--resume` continues from (docs/RELIABILITY.md): the one
// `latest` names when it loads and verifies against its manifest, else the
// newest older step directory that does, saying which one was skipped and why.
// A missing or unreadable `latest` makes every step directory a candidate.
#pragma once
#include <string>

#include "dist/comm.h"
#include "train/model_io.h"

namespace kvs {

// Throws "<root>: --resume given but there is no checkpoint to resume from",
// or, when none verifies, a line carrying the newest one's error. Every rank
// of `comm` chooses on its own (rank 0 logs the fallback) and then they
// check, with one all-reduce, that they chose the same step. The tensors
// are not read: each rank reads its slice (FullModelIO::read_local).
OpenedCheckpoint find_resume_checkpoint(const std::string& root, dist::Communicator& comm);

// Whether `root` holds a checkpoint: a `latest` file or a step directory.
bool has_checkpoints(const std::string& root);

}  // namespace kvs
