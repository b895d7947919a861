// Streams, events and the queue of operations of the host CUDA shim
// (hostcuda.h): issue order, vector clocks, and running what a
// synchronisation needs.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hostcuda.h"

// The handles behind cudaStream_t and cudaEvent_t (incomplete in the toolkit's headers).
struct CUstream_st {
  int index;
};
struct CUevent_st {
  std::vector<uint64_t> clock;
  bool recorded = false;
  bool live = true;
};

namespace hostcuda {

Running* g_running = nullptr;

namespace {

struct StreamRec {
  CUstream_st* handle = nullptr;
  bool live = true;
  bool nonblocking = false;
  uint64_t seq = 0;
  std::vector<uint64_t> clock;  // clock[s]: the last operation of stream s this stream is ordered after
};

struct Op {
  int stream;
  uint64_t seq;
  std::vector<uint64_t> clock;
  std::string label;
  std::function<void()> body;
  std::pair<const void*, size_t> host_read;
};

std::vector<StreamRec>& streams() {
  static std::vector<StreamRec> s(1);  // [0]: the legacy default stream
  return s;
}
std::vector<uint64_t> g_host;  // what the host has seen complete
std::list<Op> g_queue;
std::set<CUevent_st*> g_events;
std::map<cudaError_t, std::string> g_messages;
cudaError_t g_last_error = cudaSuccess;
Stats g_stats;

// HOSTCUDA_PROFILE=1: the time each kind of operation took, printed at exit.
struct Profile {
  std::map<std::string, std::pair<double, long>> by_name;
  void add(const std::string& label, std::chrono::steady_clock::duration d) {
    auto& e = by_name[label.substr(0, label.find(" ("))];
    e.first += std::chrono::duration<double>(d).count();
    ++e.second;
  }
  ~Profile() {
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [name, e] : by_name) rows.push_back({e.first, name + " x" + std::to_string(e.second)});
    std::sort(rows.rbegin(), rows.rend());
    for (const auto& [t, name] : rows) std::fprintf(stderr, "hostcuda profile: %8.3f s  %s\n", t, name.c_str());
  }
};
Profile* make_profile() {
  static Profile p;
  return std::getenv("HOSTCUDA_PROFILE") ? &p : nullptr;
}
Profile* g_profile = make_profile();

void merge(std::vector<uint64_t>& into, const std::vector<uint64_t>& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

// Runs the queued operations the clock covers, in issue order.
cudaError_t run_covered(const std::vector<uint64_t>& target) {
  cudaError_t first = cudaSuccess;
  bool any = false;
  for (const Op& op : g_queue)
    if (static_cast<size_t>(op.stream) < target.size() && target[op.stream] >= op.seq) any = true;
  if (!any) return cudaSuccess;
  DeviceOpen open;
  for (auto it = g_queue.begin(); it != g_queue.end();) {
    if (static_cast<size_t>(it->stream) >= target.size() || target[it->stream] < it->seq) {
      ++it;
      continue;
    }
    Running r;
    r.stream = it->stream;
    r.seq = it->seq;
    r.clock = &it->clock;
    r.label = &it->label;
    note_label(it->stream, it->seq, it->label);
    g_running = &r;
    const auto t0 = std::chrono::steady_clock::now();
    it->body();
    if (g_profile) g_profile->add(it->label, std::chrono::steady_clock::now() - t0);
    g_running = nullptr;
    if (r.code != cudaSuccess && first == cudaSuccess) {
      std::string msg = r.error;
      if (r.more_errors) msg += " (and " + std::to_string(r.more_errors) + " more violations)";
      first = fail(r.code, msg);
    }
    it = g_queue.erase(it);
  }
  return first;
}

std::vector<uint64_t> all_clocks() {
  std::vector<uint64_t> c = g_host;
  for (const StreamRec& s : streams()) merge(c, s.clock);
  return c;
}

}  // namespace

cudaError_t fail(cudaError_t code, const std::string& msg) {
  g_messages[code] = "host CUDA shim: " + msg;
  return code;
}

const char* message_of(cudaError_t code) {
  auto it = g_messages.find(code);
  return it == g_messages.end() ? nullptr : it->second.c_str();
}

void set_last_error(cudaError_t code) { g_last_error = code; }

void op_violation(cudaError_t code, const std::string& msg) {
  Running* r = g_running;
  if (!r) return;
  if (r->code == cudaSuccess) {
    r->code = code;
    r->error = msg;
  } else {
    ++r->more_errors;
  }
}

int stream_index(cudaStream_t s, std::string* why) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return 0;
  for (size_t i = 1; i < streams().size(); ++i) {
    if (streams()[i].handle != s) continue;
    if (streams()[i].live) return static_cast<int>(i);
    if (why) *why = "stream #" + std::to_string(i) + " used after cudaStreamDestroy";
    return -1;
  }
  if (why) *why = "not a stream handle";
  return -1;
}

uint64_t enqueue(cudaStream_t handle, std::string label, std::function<void()> body,
                 std::pair<const void*, size_t> host_read) {
  const int i = stream_index(handle, nullptr);
  std::vector<StreamRec>& all = streams();
  StreamRec& s = all[i];
  merge(s.clock, g_host);
  // The legacy default stream waits for the blocking streams, and they for it.
  if (i == 0) {
    for (size_t j = 1; j < all.size(); ++j)
      if (all[j].live && !all[j].nonblocking) merge(s.clock, all[j].clock);
  } else if (!s.nonblocking) {
    merge(s.clock, all[0].clock);
  }
  ++s.seq;
  if (s.clock.size() <= static_cast<size_t>(i)) s.clock.resize(i + 1, 0);
  s.clock[i] = s.seq;
  g_queue.push_back(Op{i, s.seq, s.clock, std::move(label), std::move(body), host_read});
  return s.seq;
}

size_t queued_ops(const std::string& label_part) {
  size_t n = 0;
  for (const Op& op : g_queue) n += op.label.find(label_part) != std::string::npos;
  return n;
}

cudaError_t run_readers_of(const void* p, size_t n) {
  const auto lo = reinterpret_cast<uintptr_t>(p), hi = lo + n;
  std::vector<uint64_t> target;
  for (const Op& op : g_queue) {
    const auto a = reinterpret_cast<uintptr_t>(op.host_read.first);
    if (op.host_read.second && a < hi && lo < a + op.host_read.second) merge(target, op.clock);
  }
  return target.empty() ? cudaSuccess : run_covered(target);
}

cudaError_t run_stream(cudaStream_t handle) {
  std::string why;
  const int i = stream_index(handle, &why);
  if (i < 0) return fail(cudaErrorInvalidResourceHandle, why);
  return run_covered(streams()[i].clock);
}

cudaError_t sync_stream(cudaStream_t handle) {
  ++g_stats.syncs;
  const cudaError_t e = run_stream(handle);
  const int i = stream_index(handle, nullptr);
  if (i >= 0) merge(g_host, streams()[i].clock);
  return e;
}

namespace {
std::atomic<int> g_nccl_aborts{0};
double g_stall_s = 0;  // the next sync_device's stall
bool g_stall_until_abort = false;
}  // namespace

void stall_next_device_sync(double max_s, bool until_nccl_abort) {
  g_stall_s = max_s;
  g_stall_until_abort = until_nccl_abort;
}
void note_nccl_abort() { ++g_nccl_aborts; }

cudaError_t sync_device() {
  if (g_stall_s > 0) {
    const int aborts = g_nccl_aborts;
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(g_stall_s);
    g_stall_s = 0;
    while (std::chrono::steady_clock::now() < end && !(g_stall_until_abort && g_nccl_aborts != aborts))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ++g_stats.syncs;
  const std::vector<uint64_t> all = all_clocks();
  const cudaError_t e = run_covered(all);
  merge(g_host, all);
  return e;
}

Stats stats() { return g_stats; }
bool g_launch_only = false;
void set_launch_only(bool on) { g_launch_only = on; }
bool launch_only() { return g_launch_only; }
void count_kernel() { ++g_stats.kernels; }
void count_gemm() { ++g_stats.gemms; }
void count_copy() { ++g_stats.copies; }
void count_collective() { ++g_stats.collectives; }
void count_accesses(uint64_t n) { g_stats.device_accesses += n; }

}  // namespace hostcuda

using hostcuda::fail;

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  if (!s) return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: null output");
  auto& all = hostcuda::streams();
  hostcuda::StreamRec r;
  r.handle = new CUstream_st{static_cast<int>(all.size())};  // never deleted: a stale handle stays recognisable
  r.nonblocking = (flags & cudaStreamNonBlocking) != 0;
  r.clock = hostcuda::g_host;
  all.push_back(r);
  *s = r.handle;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

// Priorities only order a GPU's block scheduling; the shim's order is the streams' own.
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int priority) {
  if (priority > 0 || priority < -5)
    return fail(cudaErrorInvalidValue, "cudaStreamCreateWithPriority: priority outside [-5, 0]");
  return cudaStreamCreateWithFlags(s, flags);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::string why;
  const int i = hostcuda::stream_index(s, &why);
  if (i < 0) return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: " + why);
  if (i == 0) return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of the default stream");
  // Work still queued on it completes (as on a GPU); the handle is dead.
  hostcuda::streams()[i].live = false;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::string why;
  if (hostcuda::stream_index(s, &why) < 0) return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: " + why);
  return hostcuda::sync_stream(s);
}

// Runs the stream's work and reports it finished: the shim has no work in flight.
cudaError_t cudaStreamQuery(cudaStream_t s) {
  std::string why;
  if (hostcuda::stream_index(s, &why) < 0) return fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery: " + why);
  return hostcuda::sync_stream(s);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags) {
  std::string why;
  const int i = hostcuda::stream_index(s, &why);
  if (i < 0) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: " + why);
  if (!hostcuda::g_events.count(ev) || !ev->live)
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: not a live event");
  (void)flags;
  // Later work of s is ordered after everything the event captured.
  if (ev->recorded) hostcuda::merge(hostcuda::streams()[i].clock, ev->clock);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return hostcuda::sync_device(); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* ev, unsigned int flags) {
  if (!ev) return fail(cudaErrorInvalidValue, "cudaEventCreate: null output");
  (void)flags;
  *ev = new CUevent_st;  // never deleted: a stale handle stays recognisable
  hostcuda::g_events.insert(*ev);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* ev) { return cudaEventCreateWithFlags(ev, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  if (!hostcuda::g_events.count(ev) || !ev->live)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy: not a live event");
  ev->live = false;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  std::string why;
  const int i = hostcuda::stream_index(s, &why);
  if (i < 0) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: " + why);
  if (!hostcuda::g_events.count(ev) || !ev->live)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: not a live event");
  ev->clock = hostcuda::streams()[i].clock;
  hostcuda::merge(ev->clock, hostcuda::g_host);
  ev->recorded = true;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  if (!hostcuda::g_events.count(ev) || !ev->live)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: not a live event");
  if (!ev->recorded) return cudaSuccess;
  ++hostcuda::g_stats.syncs;
  const cudaError_t e = hostcuda::run_covered(ev->clock);
  hostcuda::merge(hostcuda::g_host, ev->clock);
  return e;
}

cudaError_t cudaEventQuery(cudaEvent_t ev) { return cudaEventSynchronize(ev); }

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime: null output");
  (void)start;
  (void)end;
  *ms = 0.0f;  // no time on the host
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = hostcuda::g_last_error;
  hostcuda::g_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return hostcuda::g_last_error; }

}  // extern "C"
