// Tiny SIMT emulator (tests/simt/README.md): runs CUDA kernel source on the
// host, one block at a time, one cooperative fiber (ucontext) per thread, with
// warp collectives (__shfl_xor_sync, mma.sync m16n8k16 bf16, ldmatrix) and
// __syncthreads as barriers, and cp.async copies that land either at once or
// only at the wait that covers them. The fiber order is forward, reversed or greedy (one warp runs as
// far ahead as the barriers allow), so a missing barrier shows up as a read of
// NaN-poisoned shared memory or of another thread's not-yet-written values.
// Blocks of up to 1024 threads, 1-D or 2-D (threadIdx.y), fixed at launch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#undef __device__
#undef __global__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#undef __align__
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __align__(x) __attribute__((aligned(x)))

using std::max;
using std::min;

// The emulator's own functions are not the kernels' code: when a build
// instruments the kernels' memory accesses (tests/cuda_host), they are left out.
#define EMU_INTERNAL __attribute__((no_sanitize("kernel-address")))

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// The IEEE round-to-nearest intrinsics (adamw.cu). Build with -ffp-contract=off
// so that the host compiler does not fuse them into FMAs either.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
namespace emu {

// Fiber switches. On x86-64 a few instructions that save the callee-saved
// registers and swap stacks (glibc's swapcontext also saves the signal mask,
// two system calls per switch, which took ~90% of the run time); elsewhere
// ucontext. A fiber's first switch-to "returns" into fiber_start.
#if defined(__x86_64__)
extern "C" void emu_ctx_switch(void** save_sp, void* load_sp);
asm(".text\n.weak emu_ctx_switch\n.type emu_ctx_switch,@function\nemu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
    ".size emu_ctx_switch, .-emu_ctx_switch\n");
struct Ctx {
  void* sp = nullptr;
};
EMU_INTERNAL inline void ctx_switch(Ctx& from, Ctx& to) { emu_ctx_switch(&from.sp, to.sp); }
EMU_INTERNAL inline void ctx_make(Ctx& c, char* stack, size_t bytes, void (*fn)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                         // fn is entered with rsp = 8 mod 16, as after a call
  *--sp = reinterpret_cast<void*>(fn);     // emu_ctx_switch's ret
  for (int k = 0; k < 6; ++k) *--sp = nullptr;  // r15 r14 r13 r12 rbx rbp
  c.sp = sp;
}
#else
struct Ctx {
  ucontext_t uc;
};
inline void ctx_switch(Ctx& from, Ctx& to) { swapcontext(&from.uc, &to.uc); }
inline void ctx_make(Ctx& c, char* stack, size_t bytes, void (*fn)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, fn, 0);
}
#endif

struct Dim {
  unsigned x = 1, y = 1, z = 1;
};
struct Group {
  int live = 0, arrived = 0;
  long gen = 0;
  int lo = 0, hi = 0;  // its threads' range [lo, hi]
};
struct Fiber {
  Ctx ctx;
  int tid = 0;
  Dim idx;  // threadIdx
  bool done = false;
  const struct Group* waiting = nullptr;  // blocked on this group until its gen moves past wait_gen
  long wait_gen = 0;
};
// Fiber stacks, kept from block to block (allocating 1024 x 256 KiB per block
// would dominate the run time). Plain arrays, here and for the fibers: the
// emulator's functions touch them on every switch, and std::vector's accessors
// would be the instrumented kernels' out-of-line copies (tests/cuda_host).
constexpr size_t kStackBytes = 256 * 1024;
inline char* g_stacks[1024];

inline Dim g_block_idx, g_grid_dim, g_block_dim;
inline Fiber g_fibers[1024];
inline int g_cur = -1;
inline Ctx g_sched;
inline Group g_block_grp;
inline Group g_warp_grp[32];
inline std::function<void()> g_body;
// Shared memory of the running block: [0, kDynBytes) is the dynamic (extern
// __shared__) array, static __shared__ variables follow, one slot per
// declaration (site), allocated on first use in the block.
constexpr size_t kDynBytes = 256 * 1024, kStaticBytes = 64 * 1024;
inline std::vector<unsigned char> g_smem(kDynBytes + kStaticBytes);
inline std::vector<std::pair<const void*, size_t>> g_sites;
inline size_t g_static_off = 0;
inline bool g_reverse = false;
// Greedy orders: the lowest scan position (thread index, or nthreads-1-index
// reversed) that a barrier completed since the last pick may have unblocked.
inline int g_woke = 0;
inline bool g_greedy = false;
inline int g_nthreads = 128;
// cp.async (sm_80): a copy may land in shared memory any time between its
// issue and the cp.async.wait_group that covers it. The emulator takes one of
// the two extremes: at once (g_cp_async_eager, which exposes a copy issued
// over a tile other threads still read) or only at that wait (which exposes a
// read without the wait, or without the __syncthreads after other threads'
// waits). A kernel must be right under both.
struct CpAsync {
  unsigned char* dst;
  const unsigned char* src;
  int src_bytes;  // copied from src; the rest of the 16 bytes is zero-filled
  long group;     // its commit group (the thread's count of commits when issued)
  bool landed;
};
constexpr int kMaxCpAsync = 256;  // copies a thread may have in flight
inline CpAsync g_cp[1024][kMaxCpAsync];
inline int g_cp_n[1024];
inline long g_cp_commits[1024];
inline bool g_cp_async_eager = false;
// The proxies (sm_90): cp.async writes shared memory through the generic
// proxy, wgmma reads it through the async proxy, and the writing thread must
// execute fence.proxy.async between the two. Each 16-byte chunk a cp.async
// lands in is marked with its thread until that thread fences; a wgmma that
// reads a marked chunk aborts.
constexpr size_t kSmemChunks = (kDynBytes + kStaticBytes) / 16;
inline int g_unfenced_by[kSmemChunks];                 // thread + 1, or 0
inline std::vector<int> g_unfenced_list[1024];         // the chunks each thread marked

// wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16: the warpgroup (4
// warps) computes D[64][N] (+)= A[64][16] B[16][N]; warp w % 4 of it holds
// rows 16 (w % 4) .. + 15 in the mma.m16n8k16 C layout repeated over the N/8
// column blocks: d[4 i + e] = D[g + 8 (e / 2)][8 i + 2 c + e % 2]. A comes
// from shared memory (K-major, descriptor) or from registers (the warp's 16
// rows in the mma.m16n8k16 A layout); B from shared memory, K-major or, with
// trans_b, MN-major. The operation is asynchronous: the emulator reads the
// operands and writes D at the wgmma.wait_group that covers it (or at once in
// the eager orders, g_cp_async_eager), so a read of D before that wait sees
// the old values, and shared memory overwritten before it is what the
// product reads; D or register A changed while in flight aborts, and so
// does a read of a chunk a cp.async wrote without its thread's
// fence.proxy.async since (g_unfenced_by).

struct Wgmma {
  float* d;
  int n;                 // N
  bool scale_d, trans_b, reg_a, chained;
  uint64_t desc_a, desc_b;
  uint32_t a[32][4];     // register A: the warp's 32 lanes' fragments
  uint32_t own_a[4];     // this thread's, to check they stay put
  const uint32_t* a_regs;
  float d_in[128];       // D at issue (unless chained after an earlier in-flight wgmma on it)
  long group;
};
constexpr int kMaxWgmma = 16;
inline Wgmma g_wg[1024][kMaxWgmma];
inline int g_wg_n[1024];
inline long g_wg_commits[1024];

EMU_INTERNAL inline Dim cur_tid() { return g_fibers[g_cur].idx; }

EMU_INTERNAL inline void yield() { ctx_switch(g_fibers[g_cur].ctx, g_sched); }

// Round-robin orders: the fiber that runs after g_cur, the next runnable one
// in scan order (wrapping into the next round), or -1 when none can run. The
// running fiber switches to it directly: the same sequence as a scheduler
// visiting every fiber in turn, at half the context switches.
EMU_INTERNAL inline int next_runnable() {
  const int n = g_nthreads, k0 = g_reverse ? n - 1 - g_cur : g_cur;
  for (int s = 1; s <= n; ++s) {
    const int k = (k0 + s) % n, i = g_reverse ? n - 1 - k : k;
    const Fiber& f = g_fibers[i];
    if (!f.done && !(f.waiting && f.waiting->gen == f.wait_gen)) return i;
  }
  return -1;
}

// The running fiber blocked or ended: run the next one (the greedy orders and
// the end of the block go through the scheduler).
EMU_INTERNAL inline void switch_away() {
  const int me = g_cur, next = g_greedy ? -1 : next_runnable();
  if (next < 0 || next == me) {
    ctx_switch(g_fibers[me].ctx, g_sched);
    return;
  }
  g_cur = next;
  ctx_switch(g_fibers[me].ctx, g_fibers[next].ctx);
}

// A barrier of grp (the block or one warp): the last thread to arrive goes on
// at once; the others are not resumed before the barrier completes.
EMU_INTERNAL inline void wait(Group& grp) {
  grp.arrived++;
  if (grp.arrived == grp.live) {
    grp.arrived = 0;
    grp.gen++;
    g_woke = std::min(g_woke, g_reverse ? g_nthreads - 1 - grp.hi : grp.lo);
    return;
  }
  Fiber& f = g_fibers[g_cur];
  f.waiting = &grp;
  f.wait_gen = grp.gen;
  switch_away();
  f.waiting = nullptr;
}

EMU_INTERNAL inline void leave(Group& grp) {
  grp.live--;
  if (grp.arrived > 0 && grp.arrived == grp.live) {
    grp.arrived = 0;
    grp.gen++;
    g_woke = std::min(g_woke, g_reverse ? g_nthreads - 1 - grp.hi : grp.lo);
  }
}

EMU_INTERNAL inline void fiber_entry() {
  g_body();
  Fiber& f = g_fibers[g_cur];
  if (g_cp_n[f.tid] > 0) {
    fprintf(stderr, "emu: thread %d ended with %d cp.async copies it never waited for\n", f.tid, g_cp_n[f.tid]);
    abort();
  }
  if (g_wg_n[f.tid] > 0) {
    fprintf(stderr, "emu: thread %d ended with %d wgmma it never waited for\n", f.tid, g_wg_n[f.tid]);
    abort();
  }
  f.done = true;
  leave(g_warp_grp[f.tid / 32]);
  leave(g_block_grp);
  switch_away();  // never resumed
}

EMU_INTERNAL inline void run_block(int nthreads) {
  if (nthreads <= 0 || nthreads > 1024 || nthreads % 32 != 0) {
    fprintf(stderr, "emu: block of %d threads (need a multiple of 32, at most 1024)\n", nthreads);
    abort();
  }
  g_nthreads = nthreads;
  for (int i = 0; i < nthreads; ++i) g_fibers[i] = Fiber{};
  std::fill(g_cp_n, g_cp_n + nthreads, 0);
  std::fill(g_cp_commits, g_cp_commits + nthreads, 0L);
  std::fill(g_wg_n, g_wg_n + nthreads, 0);
  std::fill(g_wg_commits, g_wg_commits + nthreads, 0L);
  g_block_grp = Group{nthreads, 0, 0, 0, nthreads - 1};
  for (int w = 0; w < nthreads / 32; ++w) g_warp_grp[w] = Group{32, 0, 0, 32 * w, 32 * w + 31};
  std::memset(g_smem.data(), 0xFF, g_smem.size());  // NaN poison
  std::fill(g_unfenced_by, g_unfenced_by + kSmemChunks, 0);
  for (int i = 0; i < nthreads; ++i) g_unfenced_list[i].clear();
  g_sites.clear();
  g_static_off = kDynBytes;
  for (int i = 0; i < nthreads; ++i) {
    Fiber& f = g_fibers[i];
    f.tid = i;
    const unsigned t = (unsigned)i;
    f.idx = Dim{t % g_block_dim.x, t / g_block_dim.x % g_block_dim.y, t / (g_block_dim.x * g_block_dim.y)};
    if (!g_stacks[i]) g_stacks[i] = new char[kStackBytes];
    ctx_make(f.ctx, g_stacks[i], kStackBytes, fiber_entry);
  }
  auto blocked = [](const Fiber& f) { return f.waiting && f.waiting->gen == f.wait_gen; };
  auto deadlock = [] {
    fprintf(stderr, "emu: deadlock: every live thread waits at a barrier that cannot complete "
                    "(__syncthreads or a warp collective in divergent code?)\n");
    abort();
  };
  if (!g_greedy) {
    // Round robin: each runnable fiber in turn runs until it blocks or ends,
    // then switches to the next (switch_away); back here when none can run.
    g_cur = g_reverse ? nthreads - 1 : 0;
    ctx_switch(g_sched, g_fibers[g_cur].ctx);
    for (int i = 0; i < nthreads; ++i)
      if (!g_fibers[i].done) deadlock();
  } else {
    // Greedy: always resume the first runnable fiber (the last, reversed), so
    // warp 0 (or the last warp) runs as far ahead as the barriers allow. The
    // scan starts where the last pick was found (every fiber before it was
    // done or blocked then, and a picked fiber comes back done or blocked)
    // unless a barrier completed earlier in the scan order since.
    int live = nthreads, from = 0;
    while (live > 0) {
      int k = from, pick = -1;
      for (; k < nthreads; ++k) {
        const int i = g_reverse ? nthreads - 1 - k : k;
        if (!g_fibers[i].done && !blocked(g_fibers[i])) {
          pick = i;
          break;
        }
      }
      if (pick < 0) deadlock();
      g_woke = nthreads;
      g_cur = pick;
      ctx_switch(g_sched, g_fibers[pick].ctx);
      if (g_fibers[pick].done) --live;
      from = std::min(k, g_woke);
    }
  }
  g_cur = -1;
}

// Runs body() for every block of grid (x fastest), block threads per block.
EMU_INTERNAL inline void launch(Dim grid, Dim block, const std::function<void()>& body) {
  g_grid_dim = grid;
  g_block_dim = block;
  const int nthreads = (int)(block.x * block.y * block.z);
  g_body = body;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        g_block_idx = Dim{x, y, z};
        run_block(nthreads);
      }
}
EMU_INTERNAL inline void launch(Dim grid, int nthreads, const std::function<void()>& body) {
  launch(grid, Dim{(unsigned)nthreads, 1, 1}, body);
}

// A static `__shared__ T name[n]` declaration: `site` is the address of a
// static local next to it (one per declaration and template instance), so
// every call of the function in a block gets the same array, as on the GPU.
template <class T>
EMU_INTERNAL T* shared(const void* site, size_t n) {
  for (const auto& s : g_sites)
    if (s.first == site) return reinterpret_cast<T*>(g_smem.data() + s.second);
  g_static_off = (g_static_off + 15) / 16 * 16;
  const size_t off = g_static_off;
  g_static_off += n * sizeof(T);
  if (g_static_off > g_smem.size()) {
    fprintf(stderr, "emu: static shared memory overflow\n");
    abort();
  }
  g_sites.push_back({site, off});
  return reinterpret_cast<T*>(g_smem.data() + off);
}
// `extern __shared__` (dynamic shared memory, up to kDynBytes).
EMU_INTERNAL inline unsigned char* dyn_smem() { return g_smem.data(); }

// Warp collectives exchange through a buffer per warp, one barrier each. Two
// buffers, chosen by the parity of the warp's barrier count on entry: a lane
// that runs ahead into the next collective writes the other buffer, and it
// cannot reach a third one before every lane has passed the next barrier,
// i.e. has read this one.
template <class T>
EMU_INTERNAL T shfl_xor(unsigned mask, T v, int o) {
  const int lane = g_fibers[g_cur].tid % 32, w = g_fibers[g_cur].tid / 32;
  static double buf[2][32][32];
  double(&b)[32][32] = buf[g_warp_grp[w].gen & 1];
  b[w][lane] = (double)v;
  wait(g_warp_grp[w]);
  return (T)b[w][lane ^ o];
}

EMU_INTERNAL inline float bf(uint32_t half) {
  const uint32_t u = half << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// mma.m16n8k16 row.col bf16 -> f32 per the PTX fragment layout.
EMU_INTERNAL inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const int lane = g_fibers[g_cur].tid % 32, w = g_fibers[g_cur].tid / 32;
  static uint32_t Abuf[2][32][32][4], Bbuf[2][32][32][2];  // two buffers, as in shfl_xor
  const int parity = g_warp_grp[w].gen & 1;
  uint32_t(&A)[32][32][4] = Abuf[parity];
  uint32_t(&Bf)[32][32][2] = Bbuf[parity];
  for (int i = 0; i < 4; ++i) A[w][lane][i] = a[i];
  Bf[w][lane][0] = b0;
  Bf[w][lane][1] = b1;
  wait(g_warp_grp[w]);
  // This lane's rows g and g + 8 of A and columns 2t and 2t + 1 of B, unpacked
  // once (plain loops: lambdas would be instrumented out-of-line calls).
  const int g = lane / 4, t = lane % 4;
  float arow[2][16], bcol[2][16];
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 16; ++k) {
      const uint32_t v = A[w][g * 4 + (k % 8) / 2][r + (k >= 8 ? 2 : 0)];
      arow[r][k] = bf((k & 1) ? v >> 16 : v & 0xFFFF);
    }
  for (int cc = 0; cc < 2; ++cc)
    for (int k = 0; k < 16; ++k) {
      const uint32_t v = Bf[w][(2 * t + cc) * 4 + (k % 8) / 2][k >= 8 ? 1 : 0];
      bcol[cc][k] = bf((k & 1) ? v >> 16 : v & 0xFFFF);
    }
  float out[4];
  for (int e = 0; e < 4; ++e) {
    double s = 0;
    for (int kk = 0; kk < 16; ++kk) s += (double)arow[e >> 1][kk] * bcol[e & 1][kk];
    out[e] = (float)((double)c[e] + s);
  }
  for (int e = 0; e < 4; ++e) c[e] = out[e];
}

// A pointer into the running block's shared memory, aligned to `align`, or abort.
EMU_INTERNAL inline void check_smem(const void* p, size_t bytes, size_t align, const char* who) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < g_smem.data() || c + bytes > g_smem.data() + g_smem.size() || reinterpret_cast<uintptr_t>(p) % align != 0) {
    fprintf(stderr, "emu: %s: address %p is not %zu-byte aligned shared memory\n", who, p, align);
    abort();
  }
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives the address
// of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned); r[i] receives
// matrix i's elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1), low half
// first, or with .trans (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4).
// Shared-memory bank conflicts of ldmatrix (a performance property the
// emulator can see): each 8x8 matrix is read in one pass over 32 banks of 4
// bytes when its 8 rows of 16 bytes fall on distinct banks; a matrix whose
// rows share a bank is counted (by lane 0 of the warp) in g_ldmatrix_conflicts.
inline long g_ldmatrix_matrices = 0, g_ldmatrix_conflicts = 0;

EMU_INTERNAL inline void ldmatrix_x4(uint32_t (&r)[4], const void* p, bool trans) {
  const int lane = g_fibers[g_cur].tid % 32, w = g_fibers[g_cur].tid / 32;
  check_smem(p, 16, 16, "ldmatrix");
  static const unsigned char* buf[2][32][32];  // two buffers, as in shfl_xor
  const unsigned char*(&rows)[32][32] = buf[g_warp_grp[w].gen & 1];
  rows[w][lane] = static_cast<const unsigned char*>(p);
  wait(g_warp_grp[w]);
  if (lane == 0)
    for (int i = 0; i < 4; ++i) {
      uint32_t used = 0;  // bank mask
      bool conflict = false;
      for (int j = 0; j < 8; ++j) {
        const size_t bank = (size_t)(rows[w][8 * i + j] - g_smem.data()) / 4 % 32;
        const uint32_t mask = 0xFu << bank;  // 4 consecutive banks (16 bytes, 16-byte aligned: no wrap)
        conflict |= (used & mask) != 0;
        used |= mask;
      }
      ++g_ldmatrix_matrices;
      g_ldmatrix_conflicts += conflict;
    }
  const int g = lane / 4, c = lane % 4;
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (!trans) {
      std::memcpy(&lo, rows[w][8 * i + g] + 4 * c, 2);
      std::memcpy(&hi, rows[w][8 * i + g] + 4 * c + 2, 2);
    } else {
      std::memcpy(&lo, rows[w][8 * i + 2 * c] + 2 * g, 2);
      std::memcpy(&hi, rows[w][8 * i + 2 * c + 1] + 2 * g, 2);
    }
    r[i] = lo | (uint32_t)hi << 16;
  }
}

// The source bytes of a cp.async, read as the kernel's own loads (so not
// EMU_INTERNAL, and always inlined into the kernel): a build that checks the
// kernels' accesses (tests/cuda_host) checks these against the allocations too.
__attribute__((always_inline)) inline void cp_async_source_read(const void* src, int n) {
  const volatile unsigned char* p = static_cast<const volatile unsigned char*>(src);
  for (int i = 0; i < n; ++i) (void)p[i];
}
EMU_INTERNAL inline void cp_async_land(CpAsync& cp, int tid) {
  std::memset(cp.dst, 0, 16);
  std::memcpy(cp.dst, cp.src, (size_t)cp.src_bytes);
  cp.landed = true;
  const size_t chunk = (size_t)(cp.dst - g_smem.data()) / 16;
  g_unfenced_by[chunk] = tid + 1;
  g_unfenced_list[tid].push_back((int)chunk);
}
// cp.async.cg.shared.global [dst], [src], 16, src_bytes.
EMU_INTERNAL inline void cp_async(void* dst, const void* src, int src_bytes) {
  const int tid = g_fibers[g_cur].tid;
  check_smem(dst, 16, 16, "cp.async destination");
  if (src_bytes < 0 || src_bytes > 16 || reinterpret_cast<uintptr_t>(src) % 16 != 0) {
    fprintf(stderr, "emu: cp.async: source %p (need 16-byte alignment) or size %d (0..16)\n", src, src_bytes);
    abort();
  }
  if (g_cp_n[tid] == kMaxCpAsync) {
    fprintf(stderr, "emu: thread %d has more than %d cp.async copies in flight\n", tid, kMaxCpAsync);
    abort();
  }
  CpAsync& cp = g_cp[tid][g_cp_n[tid]++];
  cp = CpAsync{static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), src_bytes,
               g_cp_commits[tid], false};
  if (g_cp_async_eager) cp_async_land(cp, tid);
}
// cp.async.commit_group: the copies issued since the last commit form a group.
EMU_INTERNAL inline void cp_async_commit() { ++g_cp_commits[g_fibers[g_cur].tid]; }
// cp.async.wait_group n: every committed group but the n most recent has landed.
EMU_INTERNAL inline void cp_async_wait(int n) {
  const int tid = g_fibers[g_cur].tid;
  int kept = 0;
  for (int i = 0; i < g_cp_n[tid]; ++i) {
    CpAsync& cp = g_cp[tid][i];
    if (cp.group < g_cp_commits[tid] - n) {
      if (!cp.landed) cp_async_land(cp, tid);
    } else {
      g_cp[tid][kept++] = cp;
    }
  }
  g_cp_n[tid] = kept;
}

// --- wgmma (sm_90a warpgroup MMA) -------------------------------------------
// A shared-memory "address" is the byte offset in the block's shared memory
// (the GPU's shared window starts at 0 too), so a kernel's alignment of its
// tiles is checked as it is on the device.
EMU_INTERNAL inline uint32_t smem_addr(const void* p) {
  check_smem(p, 1, 1, "__cvta_generic_to_shared");
  return (uint32_t)(static_cast<const unsigned char*>(p) - g_smem.data());
}

// The byte offset of element (mn, k) of a wgmma operand whose 64-bit shared
// memory descriptor is `desc` (start address, leading and stride byte
// offsets in 16-byte units at bits 0, 16 and 32; the base offset at bit 49;
// the layout at bits 62-63: 0 no swizzle, 1 128-byte swizzle), k < 16, in
// CUTLASS's canonical GMMA layouts (cute/atom/mma_traits_sm90_gmma.hpp),
// T = 8 bf16 per 16 bytes:
//   K-major,  no swizzle: ((8,m),(T,2)) : ((T, SBO), (1, LBO))
//   K-major,  128B:       ((8,m),(T,2)) : ((8T, SBO), (1, T))
//   MN-major, no swizzle: ((T,m),(8,2)) : ((1, SBO), (T, LBO))
//   MN-major, 128B:       ((T,8,m),(8,2)) : ((1, T, LBO), (8T, SBO))
// The 128-byte swizzle then XORs address bits 4-6 (the 16-byte chunk) with
// bits 7-9 (the row of 128 bytes inside an aligned 1024-byte atom).
EMU_INTERNAL inline size_t gmma_offset(uint64_t desc, int mn, int k, bool mn_major) {
  const size_t start = (desc & 0x3FFF) << 4, lbo = ((desc >> 16) & 0x3FFF) << 4, sbo = ((desc >> 32) & 0x3FFF) << 4;
  const int layout = (int)(desc >> 62), base = (int)((desc >> 49) & 7);
  if (base != 0 || (layout != 0 && layout != 1)) {
    fprintf(stderr, "emu: wgmma descriptor %016llx: base offset %d, layout %d (the emulator knows 0 and 128B)\n",
            (unsigned long long)desc, base, layout);
    abort();
  }
  size_t off;
  if (layout == 1) {
    off = !mn_major ? start + (mn % 8) * 128 + (mn / 8) * sbo + (k % 8) * 2 + (k / 8) * 16
                    : start + (mn % 64) * 2 + (mn / 64) * lbo + (k % 8) * 128 + (k / 8) * sbo;
    off ^= ((off >> 7) & 7) << 4;
  } else {
    off = !mn_major ? start + (mn % 8) * 16 + (mn / 8) * sbo + (k % 8) * 2 + (k / 8) * lbo
                    : start + (mn % 8) * 2 + (mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo;
  }
  if (off + 2 > kDynBytes + kStaticBytes) {
    fprintf(stderr, "emu: wgmma operand element at shared offset %zu, outside shared memory\n", off);
    abort();
  }
  return off;
}
EMU_INTERNAL inline float smem_bf16(size_t off) {
  if (const int by = g_unfenced_by[off / 16]) {
    fprintf(stderr,
            "emu: wgmma reads shared offset %zu, which thread %d wrote by cp.async without fence.proxy.async since\n",
            off, by - 1);
    abort();
  }
  uint16_t h;
  std::memcpy(&h, g_smem.data() + off, 2);
  return bf(h);
}

EMU_INTERNAL inline void wgmma_compute(Wgmma& op) {
  const int tid = g_fibers[g_cur].tid, lane = tid % 32, wrow = 16 * ((tid / 32) % 4);
  const int g = lane / 4, c = lane % 4;
  if (!op.chained)
    for (int i = 0; i < op.n / 2; ++i)
      if (std::memcmp(&op.d[i], &op.d_in[i], 4) != 0) {
        fprintf(stderr, "emu: thread %d changed a wgmma accumulator while the wgmma was in flight\n", tid);
        abort();
      }
  if (op.reg_a && std::memcmp(op.a_regs, op.own_a, 16) != 0) {
    fprintf(stderr, "emu: thread %d changed a wgmma A register while the wgmma was in flight\n", tid);
    abort();
  }
  float arow[2][16];
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 16; ++k) {
      const int m = wrow + g + 8 * r;
      if (op.reg_a) {
        const uint32_t v = op.a[(g)*4 + (k % 8) / 2][r + (k >= 8 ? 2 : 0)];
        arow[r][k] = bf((k & 1) ? v >> 16 : v & 0xFFFF);
      } else {
        arow[r][k] = smem_bf16(gmma_offset(op.desc_a, m, k, false));
      }
    }
  for (int i = 0; i < op.n / 8; ++i)
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * i + 2 * c + (e & 1);
      double s = 0;
      for (int k = 0; k < 16; ++k) s += (double)arow[e >> 1][k] * smem_bf16(gmma_offset(op.desc_b, col, k, op.trans_b));
      float& d = op.d[4 * i + e];
      d = (float)((op.scale_d ? (double)d : 0.0) + s);
    }
}

// Issue (every thread of the warpgroup). a_regs null: A from desc_a.
EMU_INTERNAL inline void wgmma(float* d, int n, const uint32_t* a_regs, uint64_t desc_a, uint64_t desc_b, int scale_d,
                               int trans_b) {
  const int tid = g_fibers[g_cur].tid, lane = tid % 32, w = tid / 32;
  if (g_wg_n[tid] == kMaxWgmma) {
    fprintf(stderr, "emu: thread %d has more than %d wgmma in flight\n", tid, kMaxWgmma);
    abort();
  }
  Wgmma& op = g_wg[tid][g_wg_n[tid]++];
  op.d = d;
  op.n = n;
  op.scale_d = scale_d != 0;
  op.trans_b = trans_b != 0;
  op.reg_a = a_regs != nullptr;
  op.desc_a = desc_a;
  op.desc_b = desc_b;
  op.group = g_wg_commits[tid];
  op.a_regs = a_regs;
  op.chained = false;
  for (int i = 0; i + 1 < g_wg_n[tid]; ++i) op.chained |= g_wg[tid][i].d == d;
  if (!op.chained) std::memcpy(op.d_in, d, sizeof(float) * (n / 2));
  if (op.reg_a) {
    static uint32_t buf[2][32][32][4];  // two buffers, as in shfl_xor
    uint32_t(&A)[32][32][4] = buf[g_warp_grp[w].gen & 1];
    std::memcpy(A[w][lane], a_regs, 16);
    std::memcpy(op.own_a, a_regs, 16);
    wait(g_warp_grp[w]);
    std::memcpy(op.a, A[w], sizeof(op.a));
  }
  if (g_cp_async_eager) {
    wgmma_compute(op);
    --g_wg_n[tid];
  }
}
EMU_INTERNAL inline void wgmma(float (*d)[4], int n, uint64_t a, uint64_t b, int scale_d, int trans_b) {
  wgmma(&d[0][0], n, nullptr, a, b, scale_d, trans_b);
}
EMU_INTERNAL inline void wgmma(float (*d)[4], int n, const uint32_t (&a)[4], uint64_t b, int scale_d, int trans_b) {
  wgmma(&d[0][0], n, a, 0, b, scale_d, trans_b);
}
EMU_INTERNAL inline void wgmma_fence() {}
EMU_INTERNAL inline void fence_proxy_async() {
  const int tid = g_fibers[g_cur].tid;
  for (int chunk : g_unfenced_list[tid])
    if (g_unfenced_by[chunk] == tid + 1) g_unfenced_by[chunk] = 0;
  g_unfenced_list[tid].clear();
}
EMU_INTERNAL inline void wgmma_commit() { ++g_wg_commits[g_fibers[g_cur].tid]; }
// wgmma.wait_group n: every committed group but the n most recent has completed.
EMU_INTERNAL inline void wgmma_wait(int n) {
  const int tid = g_fibers[g_cur].tid;
  int kept = 0;
  const int count = g_wg_n[tid];
  for (int i = 0; i < count; ++i) {
    Wgmma& op = g_wg[tid][i];
    if (op.group < g_wg_commits[tid] - n) {
      wgmma_compute(op);
    } else {
      if (kept != i) g_wg[tid][kept] = op;
      ++kept;
    }
  }
  g_wg_n[tid] = kept;
}

EMU_INTERNAL inline Dim block_idx() { return g_block_idx; }
EMU_INTERNAL inline Dim grid_dim() { return g_grid_dim; }
EMU_INTERNAL inline Dim block_dim() { return g_block_dim; }

}  // namespace emu

#define threadIdx (::emu::cur_tid())
#define blockIdx (::emu::block_idx())
#define gridDim (::emu::grid_dim())
#define blockDim (::emu::block_dim())
#define __syncthreads() ::emu::wait(::emu::g_block_grp)
#define __shfl_xor_sync(m, v, o) ::emu::shfl_xor(m, v, o)
#define __cvta_generic_to_shared(p) ::emu::smem_addr(p)
