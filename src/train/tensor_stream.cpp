#include "train/tensor_stream.h"

#include <algorithm>

#include "core/error.h"

namespace kvs {

void TensorStream::push(StTensor t) {
  std::unique_lock lock(mu_);
  const uint64_t n = t.bytes.size();
  cv_.wait(lock, [&] { return aborted_ || queue_.empty() || queued_ + n <= budget_; });
  if (aborted_) return;
  queued_ += n;
  peak_ = std::max(peak_, queued_);
  queue_.push_back(std::move(t));
  cv_.notify_all();
}

void TensorStream::close(const std::string& why) {
  std::lock_guard lock(mu_);
  closed_ = true;
  why_ = why;
  cv_.notify_all();
}

StTensor TensorStream::pop() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || closed_; });
  if (queue_.empty())
    fail("the checkpoint's tensors stopped coming before the last one{}", why_.empty() ? "" : ": " + why_);
  StTensor t = std::move(queue_.front());
  queue_.pop_front();
  queued_ -= t.bytes.size();
  cv_.notify_all();
  return t;
}

void TensorStream::abort() {
  std::lock_guard lock(mu_);
  aborted_ = true;
  queue_.clear();
  queued_ = 0;
  cv_.notify_all();
}

uint64_t TensorStream::peak_bytes() const {
  std::lock_guard lock(mu_);
  return peak_;
}

}  // namespace kvs
