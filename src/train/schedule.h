// Learning-rate schedules: linear warmup from 0 to lr over warmup_steps, then
//   constant  lr (the paper's schedule);
//   cosine    cosine decay from lr to min_lr at train.steps;
//   linear    linear decay from lr to min_lr at train.steps;
//   wsd       warmup-stable-decay: lr until the last decay_steps steps, which
//             decay to min_lr at train.steps in decay_shape (linear, cosine,
//             or 1-sqrt: min_lr + (lr - min_lr)(1 - sqrt(p)), Hägele et al. 2024).
// Every decay reaches min_lr at step index train.steps, one past the last step.
#pragma once
#include <algorithm>
#include <cmath>

#include "model/config.h"

namespace kvs {

// From lr (p = 0) to min_lr (p = 1).
inline double decayed_lr(double lr, double min_lr, LrDecayShape shape, double p) {
  switch (shape) {
    case LrDecayShape::Cosine: return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(3.141592653589793 * p));
    case LrDecayShape::OneMinusSqrt: return min_lr + (lr - min_lr) * (1.0 - std::sqrt(p));
    case LrDecayShape::Linear: break;
  }
  return lr - (lr - min_lr) * p;
}

// lr for optimizer step `step` (0-based).
inline double learning_rate(const TrainConfig& t, int64_t step) {
  if (t.warmup_steps > 0 && step < t.warmup_steps) return t.lr * static_cast<double>(step + 1) / t.warmup_steps;
  // The decay's progress from its first step (0) to train.steps (1).
  auto progress = [&](int64_t first) {
    const double span = static_cast<double>(std::max<int64_t>(1, t.steps - first));
    return std::clamp(static_cast<double>(step - first) / span, 0.0, 1.0);
  };
  switch (t.schedule) {
    case LrSchedule::Cosine: return decayed_lr(t.lr, t.min_lr, LrDecayShape::Cosine, progress(t.warmup_steps));
    case LrSchedule::Linear: return decayed_lr(t.lr, t.min_lr, LrDecayShape::Linear, progress(t.warmup_steps));
    case LrSchedule::Wsd: {
      const int64_t first = t.steps - t.decay_steps;
      return step < first ? t.lr : decayed_lr(t.lr, t.min_lr, t.decay_shape, progress(first));
    }
    case LrSchedule::Constant: break;
  }
  return t.lr;
}

}  // namespace kvs
