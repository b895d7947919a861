// OpenBLAS under an address-space limit (`ulimit -v`, RLIMIT_AS). When
// Debian's OpenBLAS loads, its constructor maps a 128 MiB buffer for each of
// its threads, and where mmap and malloc both fail it tries again forever:
// the program spins before main() without a word (seen with limits up to
// 128 MiB a thread above what the libraries themselves map; kvshift with
// CUDA maps about 1 GB). The kvshift binary checks first, from .preinit_array (which runs
// before any shared library's constructor; core/runtime_env.cpp), and stops
// with one line instead. Plain C calls only: libstdc++ is not set up yet then.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvs {

// What the loaded OpenBLAS maps per thread as it loads: its BUFFER_SIZE (32
// << 22 bytes in Debian's 0.3.21 DYNAMIC_ARCH build) and the page malloc adds
// (a 134,225,920-byte mmap seen in the spinning constructor); its MAX_THREADS.
inline constexpr uint64_t kOpenBlasThreadBuffer = (uint64_t{128} << 20) + 8192;
inline constexpr int kOpenBlasMaxThreads = 64;
// Room for the rest of the libraries' start-up beside the buffers (measured:
// 1 and 2 threads loaded with 3-10 MiB more free than the buffers take).
inline constexpr uint64_t kLoadHeadroom = uint64_t{16} << 20;

// The threads OpenBLAS sizes its buffers for: the first positive of
// OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS and OMP_NUM_THREADS in `envp` (read
// as atoi reads them), else `cpus`; at most `cpus` and kOpenBlasMaxThreads.
int openblas_threads_at_load(char** envp, int cpus);

// The one line (without "kvshift: error: ") for a `limit`-byte address space
// of which `used` bytes are mapped, too small for `threads` buffers.
void format_openblas_address_space_refusal(char* out, size_t n, uint64_t limit, uint64_t used, int threads);

// False, with the refusal in `out`, when RLIMIT_AS leaves no room to map
// `threads` buffers and the headroom now (probed with one PROT_NONE mapping,
// released at once); true without a limit or with room.
bool openblas_fits_address_space(int threads, char* out, size_t n);

// After the model's buffers are allocated (train, before its first step):
// OpenBLAS maps another buffer for each thread that calls it (the split
// GEMMs' threads) the first time it does, and spins the same way when it
// cannot. Throws kvs::Error with one line when RLIMIT_AS leaves no room for
// `threads` buffers and some headroom; nothing without a limit.
void check_address_space_for_openblas_calls(int threads);

// An allocation of about `need` bytes that failed (std::bad_alloc) under an
// address-space limit that `need` alone fits in: what stands in the way is
// the limit beside what the process already maps (`mapped` names it: its
// libraries and threads, kvshift with CUDA maps about 1 GB before any model),
// not the machine's memory. Then one clause for the error line: "the
// address-space limit (ulimit -v) of L MiB leaves F MiB beside the U MiB
// <mapped>, and it needs about N MiB more: raise the limit to at least X MiB
// (ulimit -v K) or lift it". "" without a limit, or when `need` alone is
// larger than the limit (the caller's own advice, a smaller batch or model,
// is the right one then).
std::string address_space_limit_clause(uint64_t need, const char* mapped);
// The same from the limit (0: none) and the bytes mapped (tests).
std::string address_space_limit_clause(uint64_t need, const char* mapped, uint64_t limit, uint64_t used);

}  // namespace kvs
