// kvshift_simt: the CUDA kernels' source, run on the CPU under the SIMT
// emulator (emu.h), against the CPU reference ops. See tests/simt/README.md.
// usage: kvshift_simt [-v] [ORDER...] [--only FAMILY]   ORDER: fwd rev greedy greedyrev
// Default: all four orders (fwd and rev catch missing read-after-write
// barriers; greedy and greedyrev, one warp running ahead, also the
// write-after-read ones). Exit status 1 on any failure.
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "emu.h"
#include "simt_util.h"

int main(int argc, char** argv) {
  std::vector<std::string> orders;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-v") simt::g_verbose = true;
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "fwd" || a == "rev" || a == "greedy" || a == "greedyrev") orders.push_back(a);
    else {
      fprintf(stderr, "usage: %s [-v] [fwd|rev|greedy|greedyrev]... [--only FAMILY]\n", argv[0]);
      return 2;
    }
  }
  if (orders.empty()) orders = {"fwd", "rev", "greedy", "greedyrev"};
  const std::pair<const char*, std::function<void()>> families[] = {
      {"flash_attention", simt::run_flash_attention}, {"shift_rope", simt::run_shift_rope},
      {"rmsnorm", simt::run_rmsnorm},                 {"cross_entropy", simt::run_cross_entropy},
      {"vocab_parallel_ce", simt::run_vocab_parallel_ce}, {"embedding", simt::run_embedding},
      {"swiglu", simt::run_swiglu},                   {"adamw", simt::run_adamw},
      {"reduce", simt::run_reduce},                   {"convert", simt::run_convert},
      {"shift_gate", simt::run_shift_gate},
  };
  const auto t0 = std::chrono::steady_clock::now();
  int total = 0, ran = 0;
  for (const auto& order : orders) {
    emu::g_reverse = order == "rev" || order == "greedyrev";
    emu::g_greedy = order == "greedy" || order == "greedyrev";
    // cp.async copies land at once in rev and greedy, at their wait in fwd and greedyrev (emu.h).
    emu::g_cp_async_eager = order == "rev" || order == "greedy";
    for (const auto& [name, fn] : families) {
      if (!only.empty() && only != name) continue;
      const auto t = std::chrono::steady_clock::now();
      simt::g_fails = 0;
      fn();
      ++ran;
      total += simt::g_fails;
      printf("%-5s %-18s %-9s %5.1f s\n", simt::g_fails ? "FAIL" : "ok", name, order.c_str(),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
      fflush(stdout);
    }
  }
  if (ran == 0) {
    fprintf(stderr, "no family named %s\n", only.c_str());
    return 2;
  }
  printf("%d failure(s), %.1f s\n", total, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return total != 0;
}
