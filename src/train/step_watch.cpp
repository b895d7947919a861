#include "train/step_watch.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

#include "dist/mpi_comm.h"
#include "train/stop_signals.h"

namespace kvs {
namespace {

constexpr size_t kHistory = 50;       // steps the median is taken over
constexpr size_t kMinHistory = 5;     // no verdict before this many steps
constexpr double kMinExcessS = 0.25;  // ignore jitter on tiny steps (a busy machine's scheduling)

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

StepWatch::StepWatch(dist::Communicator& world, double straggler_factor, MetricsWriter* metrics)
    : world_(world), factor_(straggler_factor), metrics_(metrics) {
  if (factor_ > 0 && metrics_) thread_ = std::thread([this] { watchdog(); });
}

StepWatch::~StepWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

double StepWatch::median_step() const {
  return recent_.size() < kMinHistory ? 0 : median_of({recent_.begin(), recent_.end()});
}

void StepWatch::begin(int64_t step) {
  wait_at_begin_ = dist::collective_wait_seconds();
  std::lock_guard<std::mutex> lock(mu_);
  running_ = step;
  started_ = std::chrono::steady_clock::now();
  median_ = median_step();
}

void StepWatch::end(double step_s) {
  step_s_ = step_s;
  work_s_ = std::max(0.0, step_s - (dist::collective_wait_seconds() - wait_at_begin_));
  std::lock_guard<std::mutex> lock(mu_);
  running_ = 0;
}

int StepWatch::boundary(int64_t done) {
  const int n = world_.size();
  const double mine[2] = {static_cast<double>(StopSignals::received()), work_s_};
  std::vector<double> all(2 * static_cast<size_t>(n));
  world_.all_gather(mine, all.data(), 2, dist::DType::F64);
  int stop = 0;
  std::vector<double> work(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    stop = std::max(stop, static_cast<int>(all[2 * static_cast<size_t>(r)]));
    work[static_cast<size_t>(r)] = all[2 * static_cast<size_t>(r) + 1];
  }
  if (factor_ > 0 && metrics_) {
    const double med_step = median_step();
    const int slowest = static_cast<int>(std::max_element(work.begin(), work.end()) - work.begin());
    const double worst = work[static_cast<size_t>(slowest)];
    // Against the other ranks: with the slowest one in it, the median of two
    // ranks would be the slowest's own work and the rule could never fire.
    std::vector<double> others = work;
    others.erase(others.begin() + slowest);
    const double med_work = median_of(others);
    const bool slow_step = med_step > 0 && step_s_ > factor_ * med_step && step_s_ - med_step > kMinExcessS;
    const bool slow_rank = n > 1 && worst > factor_ * med_work && worst - med_work > kMinExcessS;
    if (slow_step || slow_rank) {
      nlohmann::json j = {{"type", "straggler"}, {"step", done}, {"step_time_s", step_s_},
                          {"median_step_s", med_step}};
      if (n > 1)
        j.update({{"slowest_rank", slowest},
                  {"slowest_rank_work_s", worst},
                  {"median_rank_work_s", med_work},
                  {"slow_rank", slow_rank}});
      metrics_->write(j);
      spdlog::warn("straggler: step {} took {:.3f} s (median {:.3f} s){}", done, step_s_, med_step,
                   slow_rank ? fmt::format("; rank {} worked {:.3f} s, the other ranks' median {:.3f} s", slowest,
                                           worst, med_work)
                             : "");
    }
  }
  recent_.push_back(step_s_);
  if (recent_.size() > kHistory) recent_.pop_front();
  return stop;
}

void StepWatch::watchdog() {
  std::unique_lock<std::mutex> lock(mu_);
  int64_t warned = 0;
  while (!quit_) {
    cv_.wait_for(lock, std::chrono::milliseconds(500));
    if (quit_ || running_ == 0 || running_ == warned || median_ <= 0) continue;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    if (s > factor_ * median_ && s - median_ > kMinExcessS && s > 1.0) {
      warned = running_;
      metrics_->write({{"type", "straggler"}, {"step", running_}, {"running_s", s}, {"median_step_s", median_}});
      spdlog::warn("step {} has run for {:.1f} s, more than {}x the median step ({:.3f} s): a slow or stuck rank? "
                   "(collectives give up after KVS_COLLECTIVE_TIMEOUT_S)",
                   running_, s, factor_, median_);
    }
  }
}

}  // namespace kvs
