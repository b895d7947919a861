// kvshift_simt: the CUDA kernels' source, run on the CPU under the SIMT
// emulator (emu.h), against the CPU reference ops. See tests/simt/README.md.
// usage: kvshift_simt [-v] [-j N] [ORDER...] [--only FAMILY]   ORDER: fwd rev greedy greedyrev
// Default: all four orders (fwd and rev catch missing read-after-write
// barriers; greedy and greedyrev, one warp running ahead, also the
// write-after-read ones). -j N runs the orders in N processes at once (the
// emulator's state belongs to its process); the reduce family, which compares
// its bits across orders, stays in this one. Exit status 1 on any failure.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "emu.h"
#include "simt_util.h"

namespace {

using Family = std::pair<const char*, std::function<void()>>;

// Runs the families selected by `pick` in one order; returns the number of failures.
int run_order(const std::string& order, const std::vector<Family>& families, const std::function<bool(const char*)>& pick) {
  emu::g_reverse = order == "rev" || order == "greedyrev";
  emu::g_greedy = order == "greedy" || order == "greedyrev";
  // cp.async copies land at once in rev and greedy, at their wait in fwd and greedyrev (emu.h).
  emu::g_cp_async_eager = order == "rev" || order == "greedy";
  int total = 0;
  for (const auto& [name, fn] : families) {
    if (!pick(name)) continue;
    const auto t = std::chrono::steady_clock::now();
    simt::g_fails = 0;
    fn();
    total += simt::g_fails;
    printf("%-5s %-18s %-9s %5.1f s\n", simt::g_fails ? "FAIL" : "ok", name, order.c_str(),
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
    fflush(stdout);
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> orders;
  std::string only;
  int jobs = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-v") simt::g_verbose = true;
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "-j" && i + 1 < argc && std::atoi(argv[i + 1]) > 0) jobs = std::atoi(argv[++i]);
    else if (a == "fwd" || a == "rev" || a == "greedy" || a == "greedyrev") orders.push_back(a);
    else {
      fprintf(stderr, "usage: %s [-v] [-j N] [fwd|rev|greedy|greedyrev]... [--only FAMILY]\n", argv[0]);
      return 2;
    }
  }
  if (orders.empty()) orders = {"fwd", "rev", "greedy", "greedyrev"};
  const std::vector<Family> families = {
      {"flash_attention", simt::run_flash_attention}, {"shift_rope", simt::run_shift_rope},
      {"rmsnorm", simt::run_rmsnorm},                 {"cross_entropy", simt::run_cross_entropy},
      {"vocab_parallel_ce", simt::run_vocab_parallel_ce}, {"embedding", simt::run_embedding},
      {"swiglu", simt::run_swiglu},                   {"adamw", simt::run_adamw},
      {"reduce", simt::run_reduce},                   {"convert", simt::run_convert},
      {"shift_gate", simt::run_shift_gate},
  };
  bool known = only.empty();
  for (const auto& f : families) known = known || only == f.first;
  if (!known) {
    fprintf(stderr, "no family named %s\n", only.c_str());
    return 2;
  }
  const auto selected = [&](const char* name) { return only.empty() || only == name; };
  const auto across_orders = [](const char* name) { return std::string(name) == "reduce"; };
  const auto t0 = std::chrono::steady_clock::now();
  int total = 0;
  if (jobs == 1 || orders.size() == 1) {
    for (const auto& order : orders) total += run_order(order, families, selected);
  } else {
    // One child per order, at most `jobs` at a time; each exits with its failure count (capped).
    std::vector<pid_t> running;
    const auto reap_one = [&] {
      int st = 0;
      const pid_t pid = ::wait(&st);
      running.erase(std::remove(running.begin(), running.end(), pid), running.end());
      total += WIFEXITED(st) ? WEXITSTATUS(st) : 1;
      if (!WIFEXITED(st)) printf("FAIL  an order's process ended by signal %d\n", WTERMSIG(st));
    };
    for (const auto& order : orders) {
      if (static_cast<int>(running.size()) == jobs) reap_one();
      fflush(stdout);
      const pid_t pid = ::fork();
      if (pid < 0) {
        perror("fork");
        return 2;
      }
      if (pid == 0) {
        const int fails = run_order(order, families, [&](const char* n) { return selected(n) && !across_orders(n); });
        fflush(stdout);
        ::_exit(std::min(fails, 100));
      }
      running.push_back(pid);
    }
    while (!running.empty()) reap_one();
    for (const auto& order : orders)
      total += run_order(order, families, [&](const char* n) { return selected(n) && across_orders(n); });
  }
  printf("%d failure(s), %.1f s\n", total, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return total != 0;
}
