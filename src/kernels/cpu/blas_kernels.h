// Which OpenBLAS kernel family ("core": Haswell, SkylakeX, Cooperlake, ...)
// the CPU engine's GEMMs run on.
//
// OpenBLAS's dynamic-arch build picks its core from the CPU's model number
// when it loads and falls back to generic SSE3 kernels (Prescott) for a model
// it does not know, which is what a cloud VM with a masked CPU model gets: a
// third of the machine's speed. So we choose from the cpuid feature flags
// instead and switch OpenBLAS in process, before the first BLAS call
// (gotoblas_dynamic_quit / gotoblas_dynamic_init with OPENBLAS_CORETYPE set
// for the call: the same path OpenBLAS takes at load time). A user's own
// OPENBLAS_CORETYPE always wins.
#pragma once
#include <string>
#include <vector>

namespace kvs::cpu {

// What cpuid (and xgetbv: whether the OS saves the wider registers) says.
struct CpuFeatures {
  bool amd = false;    // AuthenticAMD or HygonGenuine
  bool intel = false;  // GenuineIntel
  bool ssse3 = false, sse4_2 = false;
  bool avx = false, avx2 = false, fma = false;  // usable: OS saves the YMM state
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512cd = false;  // and ZMM state
  bool avx512_bf16 = false;
};

CpuFeatures detect_cpu_features();

// The OpenBLAS cores to try for these features, best first (the names
// OPENBLAS_CORETYPE takes). Ends in "Prescott", which every x86-64 build has.
std::vector<std::string> openblas_cores_for(const CpuFeatures& f);

// The widest vector ISA level of a core or a CPU: 1 SSE, 2 AVX, 3 AVX2+FMA, 4 AVX-512.
int isa_level(const std::string& core);
int isa_level(const CpuFeatures& f);

// A core far below what the CPU can run (SSE or AVX-only kernels on an AVX2 or
// AVX-512 CPU): GEMMs at a third of the speed or less.
bool is_slow_fallback(const std::string& core, const CpuFeatures& f);

struct BlasChoice {
  std::string core;    // the family OpenBLAS runs
  std::string source;  // "OPENBLAS_CORETYPE" (the user's), "cpu features", "OpenBLAS's own detection"
  bool slow_fallback = false;
  std::string describe() const;  // one line for logs: "Cooperlake (from the CPU's features)"
};

// The decision alone, for tests: `user_coretype` is the user's
// OPENBLAS_CORETYPE (null when unset), `available(core)` whether the library
// has that core, `detected` the core OpenBLAS picked by itself.
BlasChoice choose_openblas_core(const char* user_coretype, const CpuFeatures& f,
                                bool (*available)(const std::string&), const std::string& detected);

// Switches the loaded OpenBLAS to `core` now (OpenBLAS's own load-time path,
// run again with OPENBLAS_CORETYPE set for the call). False, with the kernels
// that ran before the call restored, if the library has no dynamic-arch entry
// points or does not know the name. No BLAS call may run at the same time.
bool switch_openblas_core(const std::string& core);

// The core the loaded OpenBLAS runs, as it spells it.
std::string openblas_core();

// Decides and switches OpenBLAS once per process (later calls return the
// first answer). Call before any BLAS work, outside OpenMP regions.
const BlasChoice& select_blas_kernels();

}  // namespace kvs::cpu
