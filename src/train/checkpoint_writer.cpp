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

void CheckpointWriter::save(int64_t step, CheckpointData data) {
  wait();
  if (!async_) {
    last_ = save_checkpoint(root_, step, data, keep_);
    return;
  }
  thread_ = std::thread([this, step, d = std::move(data)]() {
    try {
      last_ = save_checkpoint(root_, step, d, keep_);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

std::string CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return last_;
}

}  // namespace kvs
