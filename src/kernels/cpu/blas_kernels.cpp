#include "kernels/cpu/blas_kernels.h"

#include <cpuid.h>
#include <dlfcn.h>
#include <strings.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>

extern "C" char* openblas_get_corename(void);

namespace kvs::cpu {

namespace {

bool bit(unsigned reg, int b) { return (reg >> b) & 1u; }

// XCR0: which register states the OS saves on a context switch. AVX needs
// XMM+YMM (bits 1, 2); AVX-512 also opmask, ZMM_Hi256 and Hi16_ZMM (5, 6, 7).
unsigned long long xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

std::string upper(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

// Whether the loaded OpenBLAS has this core's kernel table (gotoblas_SKYLAKEX, ...).
bool library_has_core(const std::string& core) { return dlsym(RTLD_DEFAULT, ("gotoblas_" + upper(core)).c_str()); }

bool same_core(const std::string& a, const std::string& b) { return strcasecmp(a.c_str(), b.c_str()) == 0; }

}  // namespace

std::string openblas_core() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

// OPENBLAS_CORETYPE is put back as it was after the call, so child processes
// decide for themselves and a user's value stays theirs.
bool switch_openblas_core(const std::string& core) {
  using Fn = void (*)();
  auto quit = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto init = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (!quit || !init) return false;
  const char* prev = std::getenv("OPENBLAS_CORETYPE");
  const bool had = prev != nullptr;
  const std::string saved = had ? prev : "", running = openblas_core();
  auto load = [&](const std::string& name) {
    setenv("OPENBLAS_CORETYPE", name.c_str(), 1);
    quit();
    init();
  };
  load(core);
  const bool taken = same_core(openblas_core(), core);
  // An unknown name gives Prescott: back to the kernels that ran. (Not to a
  // fresh detection: on a VM that masks its CPU model, that is Prescott too.)
  if (!taken) load(running);
  if (had) setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  else unsetenv("OPENBLAS_CORETYPE");
  return taken;
}

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  // Vendor string in EBX, EDX, ECX: "AuthenticAMD" and Hygon's Zen-based "HygonGenuine"; "GenuineIntel".
  f.amd = (b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163) || (b == 0x6f677948 && d == 0x6e65476e);
  f.intel = b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e;
  __get_cpuid(1, &a, &b, &c, &d);
  f.ssse3 = bit(c, 9);
  f.sse4_2 = bit(c, 20);
  const bool osxsave = bit(c, 27);
  const unsigned long long xcr = osxsave ? xcr0() : 0;
  const bool ymm = (xcr & 0x6) == 0x6, zmm = ymm && (xcr & 0xe0) == 0xe0;
  f.avx = ymm && bit(c, 28);
  f.fma = f.avx && bit(c, 12);
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned max_sub = a;
    f.avx2 = f.avx && bit(b, 5);
    f.avx512f = zmm && bit(b, 16);
    f.avx512dq = f.avx512f && bit(b, 17);
    f.avx512cd = f.avx512f && bit(b, 28);
    f.avx512bw = f.avx512f && bit(b, 30);
    f.avx512vl = f.avx512f && bit(b, 31);
    if (max_sub >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      f.avx512_bf16 = f.avx512f && bit(a, 5);
    }
  }
  return f;
}

int isa_level(const CpuFeatures& f) {
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) return 4;
  if (f.avx2 && f.fma) return 3;
  if (f.avx) return 2;
  return 1;
}

int isa_level(const std::string& core) {
  static const char* const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
  static const char* const avx2[] = {"Haswell", "Zen", "Excavator", "Steamroller"};
  static const char* const avx[] = {"Sandybridge", "Bulldozer", "Piledriver"};
  for (const char* n : avx512)
    if (same_core(core, n)) return 4;
  for (const char* n : avx2)
    if (same_core(core, n)) return 3;
  for (const char* n : avx)
    if (same_core(core, n)) return 2;
  return 1;
}

bool is_slow_fallback(const std::string& core, const CpuFeatures& f) {
  return isa_level(f) >= 3 && isa_level(core) <= 2;
}

std::vector<std::string> openblas_cores_for(const CpuFeatures& f) {
  std::vector<std::string> cores;
  // AVX-512 kernels need F, BW, VL and DQ; Cooperlake's add the BF16 GEMMs and
  // run the same fp32 kernels as SkylakeX.
  if (isa_level(f) >= 4) {
    if (f.avx512_bf16) cores.push_back("Cooperlake");
    cores.push_back("SkylakeX");
  }
  if (isa_level(f) >= 3) {
    if (f.amd) cores.push_back("Zen");
    cores.push_back("Haswell");
  }
  if (f.avx) cores.push_back("Sandybridge");
  if (f.sse4_2) cores.push_back("Nehalem");
  if (f.ssse3) cores.push_back("Core2");
  cores.push_back("Prescott");
  return cores;
}

std::string BlasChoice::describe() const {
  std::string s = core + " (" + source + ")";
  if (slow_fallback) s += ": generic kernels, far below this CPU's speed";
  return s;
}

BlasChoice choose_openblas_core(const char* user_coretype, const CpuFeatures& f,
                                bool (*available)(const std::string&), const std::string& detected) {
  BlasChoice ch;
  if (user_coretype && *user_coretype) {
    ch.core = user_coretype;
    ch.source = "OPENBLAS_CORETYPE";
  } else {
    ch.core = detected;
    ch.source = "OpenBLAS's own detection";
    for (const std::string& core : openblas_cores_for(f)) {
      if (!available(core)) continue;
      ch.core = core;
      ch.source = "from the CPU's features";
      break;
    }
  }
  ch.slow_fallback = is_slow_fallback(ch.core, f);
  return ch;
}

const BlasChoice& select_blas_kernels() {
  static BlasChoice choice;
  static std::once_flag once;
  std::call_once(once, [] {
    const CpuFeatures f = detect_cpu_features();
    const char* user = std::getenv("OPENBLAS_CORETYPE");
    const std::string detected = openblas_core();
    choice = choose_openblas_core(user, f, library_has_core, detected);
    if (choice.source != "from the CPU's features" || same_core(choice.core, detected)) {
      choice.core = detected;  // OpenBLAS's spelling of what runs
    } else if (!switch_openblas_core(choice.core)) {
      choice.core = openblas_core();
      choice.source = "OpenBLAS's own detection";
    }
    choice.slow_fallback = is_slow_fallback(choice.core, f);
  });
  return choice;
}

}  // namespace kvs::cpu
