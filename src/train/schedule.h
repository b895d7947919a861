// Learning-rate schedules: linear warmup from 0, then constant (the paper's
// schedule) or cosine decay to min_lr at the last step.
#pragma once
#include <cmath>

#include "model/config.h"

namespace kvs {

// lr for optimizer step `step` (0-based).
inline double learning_rate(const TrainConfig& t, int64_t step) {
  if (t.warmup_steps > 0 && step < t.warmup_steps) return t.lr * static_cast<double>(step + 1) / t.warmup_steps;
  if (t.schedule == LrSchedule::Cosine) {
    const double span = std::max<int64_t>(1, t.steps - t.warmup_steps);
    const double progress = std::min(1.0, static_cast<double>(step - t.warmup_steps) / span);
    return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(3.141592653589793 * progress));
  }
  return t.lr;
}

}  // namespace kvs
