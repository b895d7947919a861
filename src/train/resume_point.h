// Which checkpoint a `--resume` continues from (docs/RELIABILITY.md): the one
// `latest` names when it loads and verifies against its manifest, else the
// newest older step directory that does, saying which one was skipped and why.
// A missing or unreadable `latest` makes every step directory a candidate.
#pragma once
#include <string>

#include "train/model_io.h"

namespace kvs {

// Throws "<root>: --resume given but there is no checkpoint to resume from",
// or, when none verifies, a line carrying the newest one's error. `report`:
// log the fallback (rank 0 only, so a multi-process run says it once).
LoadedCheckpoint find_resume_checkpoint(const std::string& root, bool report);

// Whether `root` holds a checkpoint: a `latest` file or a step directory.
bool has_checkpoints(const std::string& root);

}  // namespace kvs
