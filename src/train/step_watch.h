// Step boundaries across ranks, and a watchdog for slow steps
// (docs/RELIABILITY.md "Signals" and "Dead and slow ranks").
//   - boundary(): one small all-gather over every rank per step, of this
//     rank's stop signal (stop_signals.h) and its own work time (the step's
//     time minus its waits in collectives), so all ranks stop after the same
//     step, and a rank much slower than the others is named;
//   - a step much slower than the median of recent steps, or a rank whose work
//     took more than straggler_factor x the other ranks' median, gets a
//     {"type": "straggler"} line in metrics.jsonl (rank 0);
//   - a watchdog thread warns while a step runs past straggler_factor x the
//     median (a heartbeat: the run is alive but stuck or slow), once per step.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/comm.h"
#include "train/metrics.h"

namespace kvs {

class StepWatch {
 public:
  // `metrics`: rank 0's writer (null elsewhere). factor 0: no straggler report.
  // `peers_of_rank[r]`: the group whose ranks do the same work as rank r (a
  // pipeline stage's ranks; empty: all ranks), the only ones a rank's work is
  // compared with.
  StepWatch(dist::Communicator& world, double straggler_factor, MetricsWriter* metrics,
            std::vector<int> peers_of_rank = {});
  ~StepWatch();
  StepWatch(const StepWatch&) = delete;
  StepWatch& operator=(const StepWatch&) = delete;

  // Step `step` (1-based) starts / its compute is done (step_s: its duration,
  // before evaluation and checkpoints).
  void begin(int64_t step);
  void end(double step_s);
  // Collective over `world`, after step `done` (and its evaluation and checkpoint):
  // the stop signal some rank received (the largest number), or 0.
  int boundary(int64_t done);

 private:
  double median_step() const;  // of the recent steps; 0 while there are too few
  void watchdog();

  dist::Communicator& world_;
  double factor_;
  MetricsWriter* metrics_;
  std::vector<int> peers_of_rank_;
  double step_s_ = 0, work_s_ = 0, wait_at_begin_ = 0;
  std::deque<double> recent_;  // step times, newest last

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false;
  int64_t running_ = 0;  // the step in progress (0: between steps)
  std::chrono::steady_clock::time_point started_;
  double median_ = 0;
  std::thread thread_;
};

}  // namespace kvs
