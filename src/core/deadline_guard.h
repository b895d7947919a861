// A time limit for a blocking call that has none of its own (e.g.
// cudaDeviceSynchronize before an NCCL collective, docs/RELIABILITY.md).
// While a DeadlineGuard lives, a helper thread waits. If the guard is still
// alive `timeout_s` after it was made, the thread runs `on_deadline`, which
// should unblock the call (abort the NCCL communicators whose kernels hold
// the device); if it is still alive `grace_s` after that, `on_stuck`, which
// should end the process (nothing else can unblock such a call). Destroying
// the guard stops the thread; `fired()` then says whether `on_deadline` ran.
// One thread per guard: meant for calls that take milliseconds or more.
#pragma once
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace kvs {

class DeadlineGuard {
 public:
  DeadlineGuard(double timeout_s, double grace_s, std::function<void()> on_deadline, std::function<void()> on_stuck);
  ~DeadlineGuard();
  DeadlineGuard(const DeadlineGuard&) = delete;
  DeadlineGuard& operator=(const DeadlineGuard&) = delete;

  bool fired() const;

 private:
  void watch(double timeout_s, double grace_s);

  std::function<void()> on_deadline_, on_stuck_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false, fired_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace kvs
