#include "core/deadline_guard.h"

#include <chrono>

namespace kvs {

namespace {
std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}
}  // namespace

DeadlineGuard::DeadlineGuard(double timeout_s, double grace_s, std::function<void()> on_deadline,
                             std::function<void()> on_stuck)
    : on_deadline_(std::move(on_deadline)),
      on_stuck_(std::move(on_stuck)),
      thread_([this, timeout_s, grace_s] { watch(timeout_s, grace_s); }) {}

DeadlineGuard::~DeadlineGuard() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool DeadlineGuard::fired() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

void DeadlineGuard::watch(double timeout_s, double grace_s) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto start = std::chrono::steady_clock::now();
  if (cv_.wait_until(lock, start + seconds(timeout_s), [this] { return done_; })) return;
  fired_ = true;
  lock.unlock();  // the callbacks may take a while; fired() stays answerable
  if (on_deadline_) on_deadline_();
  lock.lock();
  if (cv_.wait_until(lock, std::chrono::steady_clock::now() + seconds(grace_s), [this] { return done_; })) return;
  lock.unlock();
  if (on_stuck_) on_stuck_();
}

}  // namespace kvs
