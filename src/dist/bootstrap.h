// The small TCP rendezvous that hands one blob (NCCL's 128-byte unique id)
// from rank 0 to every rank and checks that all ranks joined (docs/LAUNCH.md).
// Rank 0 listens on MASTER_PORT+1 (torchrun's agent owns MASTER_PORT); the
// others connect to MASTER_ADDR with retries. A missing rank, a mismatched
// world size or a silent rank 0 ends in a one-line kvs::Error after the
// timeout on every rank that is still running, never in a hang.
#pragma once
#include <string>

#include "dist/launch.h"

namespace kvs::dist {

struct BootstrapOptions {
  std::string addr;        // rank 0's host (MASTER_ADDR)
  int port = 0;            // KVS_BOOTSTRAP_PORT, default MASTER_PORT+1
  double timeout_s = 120;  // KVS_BOOTSTRAP_TIMEOUT_S: the rendezvous and NCCL init
  // KVS_COLLECTIVE_TIMEOUT_S (default 1800, never below timeout_s): how long a
  // collective may wait for the other ranks once training runs. Long, because
  // rank 0 alone writes checkpoints (minutes for a large model) and replica 0
  // alone evaluates while the others already wait in the next collective.
  double collective_timeout_s = 1800;
};

// The options for this launch, from the environment; errors name the variable.
BootstrapOptions bootstrap_options(const LaunchInfo& info);

// Every rank calls it; returns rank 0's `blob` (ignored on other ranks) once
// every rank has received it. World size 1 returns `blob` at once.
std::string bootstrap_exchange(const LaunchInfo& info, const BootstrapOptions& opt, const std::string& blob);

}  // namespace kvs::dist
