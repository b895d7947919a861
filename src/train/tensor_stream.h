// Checkpoint tensors handed from the thread that gathers them to the thread
// that writes them, one at a time, holding at most `budget` bytes not yet
// written (one tensor always fits). So world rank 0 need not hold a whole
// checkpoint (12 bytes per parameter: 228 GB for the paper's 19B) while it
// saves: the write starts with the first tensor gathered (docs/RELIABILITY.md).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include "core/safetensors.h"

namespace kvs {

class TensorStream {
 public:
  explicit TensorStream(uint64_t budget_bytes) : budget_(budget_bytes) {}

  // Producer: queues `t`, waiting while the queued bytes would pass the budget.
  // After the consumer gave up (abort) it drops `t` at once, so the producer's
  // collectives go on and every rank reaches the end of the save.
  void push(StTensor t);
  // Producer: no more tensors will come (`why`: the producer failed).
  void close(const std::string& why = "");
  // Consumer: the next tensor, waiting for it; kvs::Error if the producer closed first.
  StTensor pop();
  // Consumer: stop; later pushes are dropped.
  void abort();

  uint64_t peak_bytes() const;  // the most bytes queued at once

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StTensor> queue_;
  uint64_t budget_, queued_ = 0, peak_ = 0;
  bool closed_ = false, aborted_ = false;
  std::string why_;
};

}  // namespace kvs
