// Device and pinned memory of the host CUDA shim, and the checks of every
// device access (hostcuda.h).
//
// Device memory is one reserved address range: a 1 GiB gap (never
// allocated: a buffer base shifted back before its allocation, as the
// ZeRO-1 moments are, still reads as a device address) followed by the arena.
// Allocations are page aligned with a free page after each, addresses are never
// reused (so a stale pointer always finds its freed allocation), and new memory
// is filled with 0xFF (NaN in fp32 and bf16, -1 in integers) as a GPU gives no
// zeros. The range is PROT_NONE except, while the shim runs operations, the
// live allocations they touch, so host code that dereferences a device
// pointer faults, and the SIGSEGV handler says which allocation it touched.
// An allocation is opened by the first checked access of an operation to it
// and closed with the rest when the batch of operations ends: opening every
// live allocation at each synchronisation cost mprotect calls over all of
// device memory (a test that copied a model's parameters 7 at a time spent
// 108 of its 114 s in the kernel). An access the checks did not see (library
// code) faults and the handler opens what it touched. An operation's access
// outside every live allocation is reported by its check first; the handler
// then opens that page until the operations end, so that the faulty access
// completes harmlessly and the error reaches the synchronisation.
//
// Every access of an operation goes through check_access: the kernels'
// loads and stores through the compiler's instrumentation
// (-fsanitize=kernel-address with call hooks, the __asan_* functions below),
// the shim's copies, GEMMs and collectives through note_access. Per 2-byte
// granule a shadow keeps the last writer and the last reader (stream and
// sequence, and the block of a kernel); an access that is not ordered after
// them by the running operation's vector clock, or that another block of the
// same kernel made (one of the two writing), is a race.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "hostcuda.h"

namespace hostcuda {

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kGap = size_t{1} << 30;
constexpr size_t kArena = size_t{256} << 30;    // address space (freed memory is never reused)
constexpr size_t kCapacity = size_t{80} << 30;  // what may be allocated at once: an 80 GB GPU
constexpr size_t kGranule = 2;  // the smallest element the kernels store (bf16): neighbours are not shared
constexpr int kStreamShift = 44;
constexpr uint64_t kSeqMask = (uint64_t{1} << kStreamShift) - 1;

struct Allocation {
  uintptr_t base = 0;
  size_t bytes = 0;
  size_t pages = 0;
  bool live = false;
  bool open = false;  // host-accessible until the running batch of operations ends
};

struct Shadow {
  uint64_t w, r, r2;           // epoch (stream << 44 | seq) of the last writer / reader; 0: none
  uint32_t wblk, rblk, r2blk;  // and its block (1 + linear index) when it was a kernel, else 0
  // r2: the last reader on another stream than r's, so that a write checks
  // both (a send on a communicator's stream, then the engine's
  // read-modify-write of the same bytes: the engine's read alone would hide
  // the send).
};

// The reservation, set up on first use.
uintptr_t g_res_lo = 0, g_arena_lo = 0;
size_t g_next = 0;  // bytes of the arena handed out (allocations and their guard pages)
uint32_t* g_page_owner = nullptr;  // per arena page: allocation index, 0 = none
Shadow* g_shadow = nullptr;        // per arena granule
std::vector<Allocation> g_allocs(1);
size_t g_in_use = 0;
size_t g_peak = 0;  // the most g_in_use since reset_device_bytes_peak
// Pages opened for an operation's out-of-bounds access (closed with the rest).
constexpr int kMaxOpened = 4096;
uintptr_t g_opened[kMaxOpened];
int g_num_opened = 0;
// Allocations opened for the running operations (fixed, so the signal handler may add to it).
constexpr int kMaxOpenAllocs = 1 << 16;
uint32_t g_open_allocs[kMaxOpenAllocs];
int g_num_open_allocs = 0;
int g_open = 0;
std::map<uintptr_t, size_t> g_pinned;
std::unordered_map<uint64_t, std::string> g_labels;  // epoch -> label of operations that ran
struct sigaction g_prev_segv;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "host CUDA shim: %s\n", what);
  std::abort();
}

void* reserve(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) die("cannot reserve the device address range");
  return p;
}
void* reserve_rw(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) die("cannot reserve the shadow of the device range");
  return p;
}

void protect(uintptr_t lo, size_t bytes, int prot) {
  if (bytes && mprotect(reinterpret_cast<void*>(lo), bytes, prot) != 0) die("mprotect failed");
}

const Allocation* owner_of(uintptr_t a);

// Opens allocation `id` until the running operations end; false when too many are open.
bool open_allocation(uint32_t id) {
  Allocation& al = g_allocs[id];
  if (al.open) return true;
  if (g_num_open_allocs == kMaxOpenAllocs) return false;
  protect(al.base, al.pages * kPage, PROT_READ | PROT_WRITE);
  al.open = true;
  g_open_allocs[g_num_open_allocs++] = id;
  return true;
}

// Host code touching device memory: what a GPU build would fault on (or
// silently read garbage through a stale mapping). Fatal, as on the GPU.
void on_segv(int sig, siginfo_t* info, void* ctx) {
  const auto a = reinterpret_cast<uintptr_t>(info->si_addr);
  if (g_res_lo && a - g_res_lo < kGap + kArena && g_running && g_num_opened < kMaxOpened) {
    // An access to a live allocation that no check opened (library code):
    // open all of it. One outside the live allocations: already reported
    // by check_access; let it complete.
    const Allocation* al = owner_of(a);
    if (al && al->live && !al->open && a < al->base + al->bytes &&
        open_allocation(static_cast<uint32_t>(al - g_allocs.data())))
      return;
    const uintptr_t page = a & ~(kPage - 1);
    if (mprotect(reinterpret_cast<void*>(page), kPage, PROT_READ | PROT_WRITE) == 0) {
      g_opened[g_num_opened++] = page;
      return;
    }
  }
  if (g_running && g_running->code != cudaSuccess) {
    // The access the running operation's check just reported faulted on the
    // host too (an aligned vector instruction at a misaligned address): fatal
    // here, as the fault is on a GPU.
    const std::string msg = "host CUDA shim: " + g_running->error + "\n";
    (void)!write(2, msg.data(), msg.size());
    std::abort();
  }
  if (g_res_lo && a - g_res_lo < kGap + kArena) {
    char buf[512];
    const std::string where = describe(a);
    const int n = std::snprintf(buf, sizeof buf,
                                "host CUDA shim: host code accessed device memory at 0x%" PRIxPTR
                                " (%s): device pointers are not host memory\n",
                                a, where.c_str());
    if (n > 0) (void)!write(2, buf, static_cast<size_t>(n));
    std::abort();
  }
  // Not ours: the previous handler (or the default action) takes it.
  sigaction(sig, &g_prev_segv, nullptr);
  (void)ctx;
}

void init() {
  if (g_res_lo) return;
  g_res_lo = reinterpret_cast<uintptr_t>(reserve(kGap + kArena));
  g_arena_lo = g_res_lo + kGap;
  g_page_owner = static_cast<uint32_t*>(reserve_rw(kArena / kPage * sizeof(uint32_t)));
  g_shadow = static_cast<Shadow*>(reserve_rw(kArena / kGranule * sizeof(Shadow)));
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_prev_segv);
  sigaction(SIGBUS, &sa, nullptr);
}

const Allocation* owner_of(uintptr_t a) {
  if (!g_res_lo || a < g_arena_lo || a - g_arena_lo >= g_next) return nullptr;
  const uint32_t id = g_page_owner[(a - g_arena_lo) / kPage];
  return id ? &g_allocs[id] : nullptr;
}
int index_of(const Allocation* al) { return static_cast<int>(al - g_allocs.data()); }

std::string alloc_name(const Allocation& al) {
  return "allocation #" + std::to_string(index_of(&al)) + " (" + std::to_string(al.bytes) + " bytes, " +
         (al.live ? "live" : "freed") + ")";
}

uint64_t epoch(int stream, uint64_t seq) { return static_cast<uint64_t>(stream) << kStreamShift | seq; }

std::string epoch_name(uint64_t e) {
  auto it = g_labels.find(e);
  const std::string what = it == g_labels.end() ? "an operation" : it->second;
  return what + " on stream #" + std::to_string(e >> kStreamShift);
}

// The running operation is ordered after the operation of epoch e.
bool ordered_after(const Running& r, uint64_t e) {
  if (e == 0) return true;
  const int s = static_cast<int>(e >> kStreamShift);
  if (s == r.stream) return true;
  const std::vector<uint64_t>& c = *r.clock;
  return static_cast<size_t>(s) < c.size() && c[s] >= (e & kSeqMask);
}

void race(const Running& r, uintptr_t a, bool write, const char* other_did, uint64_t other) {
  op_violation(cudaErrorLaunchFailure, *r.label + " on stream #" + std::to_string(r.stream) +
                                           (write ? " writes " : " reads ") + describe(a) + ", which " +
                                           epoch_name(other) + " " + other_did +
                                           " with no event or synchronisation ordering the two (a race on a GPU)");
}

void block_race(const Running& r, uintptr_t a, bool write, const char* other_did, uint32_t other, uint32_t me);

[[noreturn]] void host_touch(uintptr_t a, bool write) {
  const std::string msg = "host code " + std::string(write ? "wrote" : "read") + " device memory at " + describe(a) +
                          ": device pointers are not host memory";
  die(msg.c_str());
}

// Shared memory of the running kernel: the emulator's window (dynamic, then
// static) and the dynamic bytes its launch asked for; its block index and grid.
uintptr_t g_dyn_lo = 0;
size_t g_smem_window = 0, g_dyn_window = 0, g_dyn_bytes = 0;
const unsigned* g_block = nullptr;  // x, y, z
const unsigned* g_grid = nullptr;

uint32_t current_block() {
  return g_block ? 1 + g_block[0] + g_grid[0] * (g_block[1] + g_grid[1] * g_block[2]) : 0;
}

// A GPU faults on an access that is not aligned to its size.
bool misaligned(uintptr_t a, size_t n) { return (n == 2 || n == 4 || n == 8 || n == 16) && (a & (n - 1)) != 0; }

std::string block_name(uint32_t blk) {
  if (blk == 0 || !g_grid) return "another block";
  const uint32_t i = blk - 1, gx = g_grid[0], gy = g_grid[1];
  return "block (" + std::to_string(i % gx) + ", " + std::to_string(i / gx % gy) + ", " +
         std::to_string(i / (gx * gy)) + ")";
}

void check_access(uintptr_t a, size_t n, bool write) {
  Running* r = g_running;
  if (!r) host_touch(a, write);
  const Allocation* al = owner_of(a);
  if (!al || !al->live || a < al->base || a + n > al->base + al->bytes) {
    op_violation(cudaErrorIllegalAddress,
                 *r->label + (write ? " writes " : " reads ") + std::to_string(n) + " bytes at " + describe(a) +
                     (al && !al->live ? " (use after free)" : " (out of bounds)"));
    return;
  }
  if (!al->open && !open_allocation(static_cast<uint32_t>(index_of(al)))) die("too many allocations open at once");
  count_accesses(1);
  if (g_block && misaligned(a, n))
    op_violation(cudaErrorMisalignedAddress, *r->label + (write ? " writes " : " reads ") + std::to_string(n) +
                                                 " bytes at " + describe(a) + ", not " + std::to_string(n) +
                                                 "-byte aligned (misaligned address)");
  const uint64_t me = epoch(r->stream, r->seq);
  const uint32_t blk = current_block();
  const size_t g0 = (a - g_arena_lo) / kGranule, g1 = (a + n - 1 - g_arena_lo) / kGranule;
  for (size_t g = g0; g <= g1; ++g) {
    Shadow& s = g_shadow[g];
    if (!ordered_after(*r, s.w)) race(*r, a, write, "wrote", s.w);
    // Blocks of one kernel run in any order, or at once.
    if (blk && s.w == me && s.wblk != blk) block_race(*r, a, write, "wrote", s.wblk, blk);
    if (write) {
      if (!ordered_after(*r, s.r)) race(*r, a, write, "read", s.r);
      if (!ordered_after(*r, s.r2)) race(*r, a, write, "read", s.r2);
      if (blk && s.r == me && s.rblk != blk) block_race(*r, a, write, "read", s.rblk, blk);
      if (blk && s.r2 == me && s.r2blk != blk) block_race(*r, a, write, "read", s.r2blk, blk);
      s.w = me;
      s.wblk = blk;
    } else if (s.r == 0 || s.r >> kStreamShift == me >> kStreamShift || ordered_after(*r, s.r)) {
      // (a reader ordered after the last one covers it: a later write ordered after this one is after both)
      s.r = me;
      s.rblk = blk;
    } else {
      s.r2 = me;
      s.r2blk = blk;
    }
  }
}

void block_race(const Running& r, uintptr_t a, bool write, const char* other_did, uint32_t other, uint32_t me) {
  op_violation(cudaErrorLaunchFailure, *r.label + ": " + block_name(me) + (write ? " writes " : " reads ") +
                                           describe(a) + ", which " + block_name(other) + " of the same launch " +
                                           other_did + " (blocks are not ordered: a race on a GPU)");
}

void check_smem(uintptr_t a, size_t n, bool write) {
  if (!g_running) return;
  if (misaligned(a, n))
    op_violation(cudaErrorMisalignedAddress, *g_running->label + (write ? " writes " : " reads ") +
                                                 std::to_string(n) + " bytes of shared memory at byte " +
                                                 std::to_string(a - g_dyn_lo) + ", not " + std::to_string(n) +
                                                 "-byte aligned (misaligned address)");
  if (a - g_dyn_lo < g_dyn_window && a + n > g_dyn_lo + g_dyn_bytes)
    op_violation(cudaErrorIllegalAddress,
                 *g_running->label + (write ? " writes" : " reads") + " dynamic shared memory bytes [" +
                     std::to_string(a - g_dyn_lo) + ", " + std::to_string(a - g_dyn_lo + n) + ") beyond the " +
                     std::to_string(g_dyn_bytes) + " bytes of its launch");
}

inline void access(uintptr_t a, size_t n, bool write) {
  if (a - g_res_lo < kGap + kArena) {
    check_access(a, n, write);
  } else if (a - g_dyn_lo < g_smem_window) {
    check_smem(a, n, write);
  }
}

}  // namespace

void set_running_kernel(uintptr_t smem_base, size_t dyn_window, size_t smem_window, size_t launch_bytes,
                        const unsigned* block, const unsigned* grid) {
  g_dyn_lo = smem_base;
  g_dyn_window = dyn_window;
  g_smem_window = smem_window;
  g_dyn_bytes = launch_bytes;
  g_block = block;
  g_grid = grid;
}

void note_access(uintptr_t a, size_t n, bool write) {
  if (n) check_access(a, n, write);
}

void note_label(int stream, uint64_t seq, const std::string& label) { g_labels[epoch(stream, seq)] = label; }

std::string describe(uintptr_t a) {
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%" PRIxPTR, a);
  if (!g_res_lo || a - g_res_lo >= kGap + kArena) return std::string(hex) + ", host memory";
  if (a < g_arena_lo) return std::string(hex) + ", below every allocation";
  if (const Allocation* al = owner_of(a)) {
    if (a < al->base + al->bytes) return "byte " + std::to_string(a - al->base) + " of " + alloc_name(*al);
    return std::to_string(a - al->base - al->bytes) + " bytes past the end of " + alloc_name(*al);
  }
  // A guard page or beyond: name the allocation before it.
  for (size_t i = g_allocs.size() - 1; i > 0; --i) {
    const Allocation& al = g_allocs[i];
    if (al.base <= a)
      return std::to_string(a - al.base - al.bytes) + " bytes past the end of " + alloc_name(al);
  }
  return std::string(hex) + ", outside every allocation";
}

void* device_malloc(size_t bytes) {
  init();
  if (bytes == 0 || bytes > kCapacity - g_in_use) return nullptr;
  const size_t pages = (bytes + kPage - 1) / kPage;
  if (g_next + (pages + 1) * kPage > kArena) return nullptr;
  Allocation al;
  al.base = g_arena_lo + g_next;
  al.bytes = bytes;
  al.pages = pages;
  al.live = true;
  g_allocs.push_back(al);
  const auto id = static_cast<uint32_t>(g_allocs.size() - 1);
  for (size_t p = 0; p < pages; ++p) g_page_owner[g_next / kPage + p] = id;
  g_next += (pages + 1) * kPage;  // and a guard page
  if (!launch_only()) {  // (opened again by the first access of an operation)
    protect(al.base, pages * kPage, PROT_READ | PROT_WRITE);
    std::memset(reinterpret_cast<void*>(al.base), 0xFF, std::min(bytes, kCapacity));  // (min: for -Wstringop-overflow)
    protect(al.base, pages * kPage, PROT_NONE);
  }
  g_in_use += bytes;
  g_peak = std::max(g_peak, g_in_use);
  return reinterpret_cast<void*>(al.base);
}

cudaError_t device_free(void* p) {
  if (!p) return cudaSuccess;
  const auto a = reinterpret_cast<uintptr_t>(p);
  const Allocation* found = owner_of(a);
  if (!found || found->base != a)
    return fail(cudaErrorInvalidValue, "cudaFree of " + describe(a) + ": not the start of an allocation");
  Allocation& al = g_allocs[index_of(found)];
  if (!al.live) return fail(cudaErrorInvalidValue, "cudaFree of " + describe(a) + ": freed twice");
  al.live = false;
  if (al.open) protect(al.base, al.pages * kPage, PROT_NONE);  // (closed again with the others: harmless)
  g_in_use -= al.bytes;
  // Give the memory back; the pages stay reserved (and owned) for the checks.
  madvise(p, al.pages * kPage, MADV_DONTNEED);
  const size_t g0 = (al.base - g_arena_lo) / kGranule;
  madvise(g_shadow + g0, al.pages * kPage / kGranule * sizeof(Shadow), MADV_DONTNEED);
  return cudaSuccess;
}

bool is_device_address(const void* p) {
  init();
  return reinterpret_cast<uintptr_t>(p) - g_res_lo < kGap + kArena;
}

bool device_range_ok(const void* p, size_t n, std::string* why) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  const Allocation* al = owner_of(a);
  if (al && al->live && a >= al->base && a + n <= al->base + al->bytes) return true;
  if (why) {
    if (!is_device_address(p))
      *why = describe(a) + " is not device memory";
    else if (al && !al->live)
      *why = describe(a) + " (use after free)";
    else if (al && a >= al->base)
      *why = std::to_string(n) + " bytes from " + describe(a) + " run " +
             std::to_string(a + n - al->base - al->bytes) + " bytes past its end";
    else
      *why = describe(a) + " is outside every live allocation";
  }
  return false;
}

DeviceOpen::DeviceOpen() {
  init();
  ++g_open;
}
DeviceOpen::~DeviceOpen() {
  if (--g_open > 0) return;
  for (int i = 0; i < g_num_open_allocs; ++i) {
    Allocation& al = g_allocs[g_open_allocs[i]];
    protect(al.base, al.pages * kPage, PROT_NONE);
    al.open = false;
  }
  g_num_open_allocs = 0;
  for (int i = 0; i < g_num_opened; ++i) protect(g_opened[i], kPage, PROT_NONE);
  g_num_opened = 0;
}

void* pinned_malloc(size_t bytes) {
  if (bytes > kArena) return nullptr;
  const size_t len = (bytes / kPage + 1) * kPage;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, 0xFF, len);
  g_pinned[reinterpret_cast<uintptr_t>(p)] = len;
  return p;
}

bool pinned_free(void* p) {
  auto it = g_pinned.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_pinned.end()) return false;
  munmap(p, it->second);
  g_pinned.erase(it);
  return true;
}

bool is_pinned(const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = g_pinned.upper_bound(a);
  if (it == g_pinned.begin()) return false;
  --it;
  return a >= it->first && a + n <= it->first + it->second;
}

size_t device_bytes_in_use() { return g_in_use; }
size_t device_bytes_peak() { return g_peak; }
void reset_device_bytes_peak() { g_peak = g_in_use; }
size_t device_bytes_total() { return kCapacity; }

}  // namespace hostcuda

// The hooks of -fsanitize=kernel-address (with
// --param asan-instrumentation-with-call-threshold=0), called before every
// load and store of the kernels' translated source.
extern "C" {
#define HOSTCUDA_HOOKS(n)                                                                                    \
  void __asan_load##n##_noabort(void* p) { hostcuda::access(reinterpret_cast<uintptr_t>(p), n, false); }  \
  void __asan_store##n##_noabort(void* p) { hostcuda::access(reinterpret_cast<uintptr_t>(p), n, true); }
HOSTCUDA_HOOKS(1)
HOSTCUDA_HOOKS(2)
HOSTCUDA_HOOKS(4)
HOSTCUDA_HOOKS(8)
HOSTCUDA_HOOKS(16)
#undef HOSTCUDA_HOOKS
void __asan_loadN_noabort(void* p, size_t n) { hostcuda::access(reinterpret_cast<uintptr_t>(p), n, false); }
void __asan_storeN_noabort(void* p, size_t n) { hostcuda::access(reinterpret_cast<uintptr_t>(p), n, true); }
void __asan_handle_no_return() {}
void __asan_before_dynamic_init(const char*) {}
void __asan_after_dynamic_init() {}
}
