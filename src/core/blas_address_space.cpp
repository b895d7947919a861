#include "core/blas_address_space.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace kvs {

namespace {

// The value of NAME in envp, or null.
const char* env_value(char** envp, const char* name) {
  const size_t len = std::strlen(name);
  for (char** e = envp; e && *e; ++e)
    if (std::strncmp(*e, name, len) == 0 && (*e)[len] == '=') return *e + len + 1;
  return nullptr;
}

// VmSize of /proc/self/status in bytes (0 if unreadable), with read(2) only.
uint64_t mapped_bytes() {
  const int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[4096];
  const ssize_t got = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (got <= 0) return 0;
  buf[got] = '\0';
  const char* p = std::strstr(buf, "VmSize:");
  return p ? std::strtoull(p + 7, nullptr, 10) * 1024 : 0;
}

uint64_t mib(uint64_t bytes) { return (bytes + (uint64_t{1} << 20) - 1) >> 20; }

// Whether `bytes` more can be mapped now: true without an RLIMIT_AS (then
// *limit = 0); else one PROT_NONE mapping of that size, released at once.
bool room_under_limit(uint64_t bytes, uint64_t* limit) {
  rlimit rl{};
  *limit = 0;
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return true;
  *limit = rl.rlim_cur;
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  munmap(p, static_cast<size_t>(bytes));
  return true;
}

}  // namespace

int openblas_threads_at_load(char** envp, int cpus) {
  int threads = 0;
  static const char* const kNames[] = {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"};
  for (const char* name : kNames) {
    const char* v = env_value(envp, name);
    if (v && std::atoi(v) > 0) {
      threads = std::atoi(v);
      break;
    }
  }
  if (threads <= 0 || threads > cpus) threads = cpus;
  if (threads > kOpenBlasMaxThreads) threads = kOpenBlasMaxThreads;
  return threads < 1 ? 1 : threads;
}

void format_openblas_address_space_refusal(char* out, size_t n, uint64_t limit, uint64_t used, int threads) {
  const uint64_t need = used + threads * kOpenBlasThreadBuffer + kLoadHeadroom;
  std::snprintf(out, n,
                "the address-space limit (ulimit -v) of %llu MiB leaves %llu MiB beside the %llu MiB the libraries "
                "map, and OpenBLAS maps 128 MiB for each of its %d thread%s as it loads (it would wait forever): "
                "raise the limit to at least %llu MiB (ulimit -v %llu)%s",
                (unsigned long long)mib(limit), (unsigned long long)(limit > used ? (limit - used) >> 20 : 0),
                (unsigned long long)mib(used), threads, threads == 1 ? "" : "s", (unsigned long long)mib(need),
                (unsigned long long)(mib(need) * 1024), threads > 1 ? ", or run fewer threads (OMP_NUM_THREADS)" : "");
}

bool openblas_fits_address_space(int threads, char* out, size_t n) {
  uint64_t limit = 0;
  if (room_under_limit(threads * kOpenBlasThreadBuffer + kLoadHeadroom, &limit)) return true;
  format_openblas_address_space_refusal(out, n, limit, mapped_bytes(), threads);
  return false;
}

void check_address_space_for_openblas_calls(int threads) {
  // Beside each thread's buffer: the 64 MiB a thread's first malloc reserves
  // for its arena (glibc), 8 MiB of stack. (A toy run on 2 threads needed
  // 266-314 MiB left here, depending on which threads had their arenas.)
  const uint64_t need = threads * kOpenBlasThreadBuffer + ((uint64_t{32} + 72 * threads) << 20);
  uint64_t limit = 0;
  if (room_under_limit(need, &limit)) return;
  const uint64_t used = mapped_bytes();
  fail("the address-space limit (ulimit -v) of {} MiB leaves {} MiB beside the {} MiB the model's buffers and the "
       "libraries map, and OpenBLAS maps 128 MiB for each of the {} thread{} that call it, at their first product "
       "(it would wait forever): raise the limit to at least {} MiB, or lower train.micro_batch_size",
       mib(limit), limit > used ? (limit - used) >> 20 : 0, mib(used), threads, threads == 1 ? "" : "s",
       mib(used + need));
}

std::string address_space_limit_clause(uint64_t need, const char* mapped, uint64_t limit, uint64_t used) {
  if (limit == 0 || need > limit) return "";
  // Room for what the failed allocation's neighbours take beside it (glibc's
  // arenas, the threads' stacks: see check_address_space_for_openblas_calls).
  const uint64_t at_least = mib(used + need + (uint64_t{256} << 20));
  return fmt::format(
      "the address-space limit (ulimit -v) of {} MiB leaves {} MiB beside the {} MiB {}, and it needs about {} MiB "
      "more: raise the limit to at least {} MiB (ulimit -v {}) or lift it",
      mib(limit), limit > used ? (limit - used) >> 20 : 0, mib(used), mapped, mib(need), at_least, at_least * 1024);
}

std::string address_space_limit_clause(uint64_t need, const char* mapped) {
  rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return "";
  return address_space_limit_clause(need, mapped, rl.rlim_cur, mapped_bytes());
}

}  // namespace kvs
