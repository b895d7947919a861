// Writes the trainer's checkpoints: now (train.async_checkpoint false) or on a
// background thread while training goes on, with at most one write in flight,
// and keeps the newest train.keep_checkpoints step directories (pruning never
// removes the one `latest` names, and runs only after a save has completed).
// The data handed over are host copies taken at a step boundary, and the
// thread runs the same save_checkpoint, so an asynchronous checkpoint is the
// same bytes as a synchronous one; a crash during the write leaves its temp
// directory and the previous `latest` (docs/FORMATS.md "Atomicity guarantees").
#pragma once
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "train/checkpoint.h"

namespace kvs {

class CheckpointWriter {
 public:
  CheckpointWriter(std::string root, int keep, bool async);
  // Finishes a write still in flight; its error, if any, is logged.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Synchronous: writes before returning. Asynchronous: waits for the previous
  // write, then starts this one and returns. A previous write that failed is
  // logged, and this one is then written before returning, its error thrown:
  // one failed write does not cost the next checkpoint, two in a row stop the run.
  void save(int64_t step, CheckpointData data);
  // A streamed save (train/tensor_stream.h): `data` holds the tensors' headers,
  // and the caller pushes their bytes into the returned stream, in file order
  // (model, then optimizer), while the write runs on the thread, holding at
  // most `budget_bytes` not yet written; then end_stream. Synchronous writers
  // wait there for the write; asynchronous ones return once the last tensor
  // is queued (or, after a failed write, wait there as synchronous ones do).
  std::shared_ptr<TensorStream> save_streamed(int64_t step, CheckpointData data, uint64_t budget_bytes);
  void end_stream(TensorStream& stream);
  // Waits for the write in flight and rethrows its error; returns the newest
  // checkpoint written ("" if none yet).
  std::string wait();

 private:
  void start(int64_t step, CheckpointData data);  // the write, on the thread
  // Waits for the previous write; false if it succeeded, true (and logged) if it failed.
  bool previous_write_failed(int64_t step);
  bool wait_at_end_of_stream_ = false;
  std::string root_;
  int keep_;
  bool async_;
  std::thread thread_;
  std::exception_ptr error_;
  std::string last_;
};

}  // namespace kvs
