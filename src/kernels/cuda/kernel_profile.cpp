#include "kernels/cuda/kernel_profile.h"

#include <algorithm>

#include "core/error.h"

namespace kvs::cuda::profile {

namespace {
bool g_on = false;

// Events are kept and reused: a step marks a few hundred ops.
struct State {
  std::vector<cudaEvent_t> events;  // events[id]
  size_t used = 0;                  // events[0..used) hold this round's marks and the carried starts
  std::vector<Mark> marks;
  std::vector<std::pair<const void*, int>> start;  // stream -> its clock's start mark id
};
State& state() {
  static State s;
  return s;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("per-kernel profile: {}: {}", what, cudaGetErrorString(e));
}

int record(cudaStream_t stream) {
  State& s = state();
  if (s.used == s.events.size()) {
    cudaEvent_t ev = nullptr;
    check(cudaEventCreate(&ev), "cudaEventCreate");
    s.events.push_back(ev);
  }
  check(cudaEventRecord(s.events[s.used], stream), "cudaEventRecord");
  return static_cast<int>(s.used++);
}

// Puts the carried start events first (their ids renumbered) so that the
// others can be recorded again.
void compact() {
  State& s = state();
  std::vector<cudaEvent_t> order;
  std::vector<char> is_start(s.events.size(), 0);
  for (auto& [stream, id] : s.start) {
    if (id < 0) continue;
    is_start[static_cast<size_t>(id)] = 1;
    order.push_back(s.events[static_cast<size_t>(id)]);
    id = static_cast<int>(order.size()) - 1;
  }
  s.used = order.size();
  for (size_t i = 0; i < s.events.size(); ++i)
    if (!is_start[i]) order.push_back(s.events[i]);
  s.events.swap(order);
  s.marks.clear();
}
}  // namespace

void set_enabled(bool on) {
  if (on && !g_on) {  // a new session: streams of an earlier one may be gone, their handles reused
    state().start.clear();
    compact();
  }
  g_on = on;
}
bool enabled() { return g_on; }

void mark(const char* name, cudaStream_t stream, double flops) {
  if (g_on) mark(std::string(name), stream, flops);
}

void mark(const std::string& name, cudaStream_t stream, double flops) {
  if (!g_on) return;
  State& s = state();
  s.marks.push_back({name, stream, flops, record(stream)});
}

void start(cudaStream_t stream) {
  if (g_on) state().marks.push_back({std::string(), stream, 0.0, record(stream)});
}

std::vector<OpStat> sum_marks(const std::vector<Mark>& marks, std::vector<std::pair<const void*, int>>& start,
                              const std::function<double(int, int)>& elapsed_ms) {
  kvs::profile::OpTable table;
  for (const Mark& m : marks) {
    auto it = std::find_if(start.begin(), start.end(), [&](const auto& p) { return p.first == m.stream; });
    if (it == start.end()) it = start.insert(start.end(), {m.stream, -1});
    if (it->second >= 0 && !m.name.empty()) table.add(m.name, elapsed_ms(it->second, m.id) / 1000.0, m.flops);
    it->second = m.id;
  }
  return table.take();
}

void restart() {
  State& s = state();
  // The chaining alone: each stream's last mark becomes its start, the sums are dropped (no wait).
  sum_marks(s.marks, s.start, [](int, int) { return 0.0; });
  compact();
}

std::vector<OpStat> take() {
  State& s = state();
  for (size_t i = 0; i < s.used; ++i) check(cudaEventSynchronize(s.events[i]), "cudaEventSynchronize");
  auto rows = sum_marks(s.marks, s.start, [&](int from, int to) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, s.events[static_cast<size_t>(from)], s.events[static_cast<size_t>(to)]),
          "cudaEventElapsedTime");
    return static_cast<double>(ms);
  });
  compact();
  return rows;
}

}  // namespace kvs::cuda::profile
