#include "train/step_watch.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>
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

StepWatch::StepWatch(dist::Communicator& world, double straggler_factor, MetricsWriter* metrics,
                     std::vector<int> peers_of_rank)
    : world_(world), factor_(straggler_factor), metrics_(metrics), peers_of_rank_(std::move(peers_of_rank)) {
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
    // Each group's slowest rank against the group's other ranks (a pipeline
    // stage's ranks do the same work; stages do not: the last one holds the LM
    // head). Against the others only: with the slowest one in it, the median of
    // two ranks would be the slowest's own work and the rule could never fire.
    // (Within a group no other rank can be further above its peers' median.)
    std::map<int, std::vector<int>> groups;
    for (int r = 0; r < n; ++r)
      groups[peers_of_rank_.empty() ? 0 : peers_of_rank_[static_cast<size_t>(r)]].push_back(r);
    int slowest = -1;
    double worst = 0, med_work = 0, worst_ratio = 0;
    for (const auto& [group, ranks] : groups) {
      if (ranks.size() < 2) continue;  // a stage of one rank: no peers
      const int r = *std::max_element(ranks.begin(), ranks.end(), [&](int a, int b) {
        return work[static_cast<size_t>(a)] < work[static_cast<size_t>(b)];
      });
      std::vector<double> others;
      for (int q : ranks)
        if (q != r) others.push_back(work[static_cast<size_t>(q)]);
      const double med = median_of(others), w = work[static_cast<size_t>(r)];
      const double ratio = med > 0 ? w / med : (w > 0 ? HUGE_VAL : 0);
      if (slowest < 0 || ratio > worst_ratio) slowest = r, worst = w, med_work = med, worst_ratio = ratio;
    }
    const bool slow_step = med_step > 0 && step_s_ > factor_ * med_step && step_s_ - med_step > kMinExcessS;
    const bool slow_rank = slowest >= 0 && worst > factor_ * med_work && worst - med_work > kMinExcessS;
    if (slow_step || slow_rank) {
      nlohmann::json j = {{"type", "straggler"}, {"step", done}, {"step_time_s", step_s_},
                          {"median_step_s", med_step}};
      if (slowest >= 0)
        j.update({{"slowest_rank", slowest},
                  {"slowest_rank_work_s", worst},
                  {"median_rank_work_s", med_work},
                  {"slow_rank", slow_rank}});
      metrics_->write(j);
      spdlog::warn("straggler: step {} took {:.3f} s{}{}", done, step_s_,
                   med_step > 0 ? fmt::format(" (median {:.3f} s)", med_step) : "",
                   slow_rank ? fmt::format("; rank {} worked {:.3f} s, its peers' median {:.3f} s", slowest,
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
