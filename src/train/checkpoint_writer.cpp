#include "train/checkpoint_writer.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "core/error.h"

namespace kvs {

CheckpointWriter::CheckpointWriter(std::string root, int keep, bool async)
    : root_(std::move(root)), keep_(keep), async_(async) {}

CheckpointWriter::~CheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::error("checkpoint write: {}", e.what());
  }
}

bool CheckpointWriter::previous_write_failed(int64_t step) {
  try {
    wait();
    return false;
  } catch (const std::exception& e) {
    // The step's own checkpoint is tried now and waited for: a disk that was full
    // may have room again, and the run should not go on (or stop) without one.
    spdlog::error("checkpoint write failed: {}; writing step {} now and waiting for it (latest: {})", e.what(), step,
                  last_.empty() ? "none yet" : last_);
    return true;
  }
}

void CheckpointWriter::save(int64_t step, CheckpointData data) {
  const bool wait_now = previous_write_failed(step);
  if (!async_ || wait_now) {
    last_ = save_checkpoint(root_, step, data, keep_);
    return;
  }
  start(step, std::move(data));
}

std::shared_ptr<TensorStream> CheckpointWriter::save_streamed(int64_t step, CheckpointData data,
                                                             uint64_t budget_bytes) {
  wait_at_end_of_stream_ = !async_ || previous_write_failed(step);
  auto stream = std::make_shared<TensorStream>(budget_bytes);
  data.stream = stream;
  start(step, std::move(data));
  return stream;
}

void CheckpointWriter::start(int64_t step, CheckpointData data) {
  thread_ = std::thread([this, step, d = std::move(data)]() {
    try {
      last_ = save_checkpoint(root_, step, d, keep_);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void CheckpointWriter::end_stream(TensorStream& stream) {
  stream.close();
  if (wait_at_end_of_stream_) wait();
}

std::string CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return last_;
}

}  // namespace kvs
