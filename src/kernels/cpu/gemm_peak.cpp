#include "kernels/cpu/gemm_peak.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/cpu_budget.h"
#include "core/fs.h"
#include "kernels/cpu/gemm_library.h"


namespace kvs::cpu {

namespace {

double loadavg_1min() {
  double l = 0;
  return getloadavg(&l, 1) == 1 ? l : 0.0;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string dir;
  if (xdg && *xdg) dir = xdg;
  else if (home && *home) dir = std::string(home) + "/.cache";
  else return "";
  return dir + "/kvshift/sgemm_peak.json";
}

// The running library, and ", split" when its threads split the products
// (gemm_library.h): the cache keeps the two threadings' peaks apart.
std::string running_core() {
  const GemmThreading t = effective_gemm_threading(gemm_library(), gemm_threading());
  return gemm_library_name(gemm_library(), true) + (t == GemmThreading::kSplit ? ", split" : "");
}

}  // namespace

std::string cpu_identity() {
  // The model name alone is not enough: VMs mask it ("AMD EPYC" is Zen 3, 4
  // or 5 on this project's machines), and a home shared across them must
  // not hand one generation's peak to another.
  std::ifstream in("/proc/cpuinfo");
  std::string line, name = "unknown", family, model, stepping;
  auto value = [&](const std::string& l) {
    const size_t colon = l.find(':');
    if (colon == std::string::npos) return std::string();
    const size_t b = l.find_first_not_of(" \t", colon + 1);
    return b == std::string::npos ? std::string() : l.substr(b);
  };
  auto is = [&](const char* key) {
    const size_t n = std::char_traits<char>::length(key);
    return line.rfind(key, 0) == 0 && line.find_first_not_of(" \t", n) == line.find(':');
  };
  while (std::getline(in, line)) {
    if (line.empty()) break;  // the first processor's block is enough
    if (is("model name")) name = value(line);
    else if (is("cpu family")) family = value(line);
    else if (is("model")) model = value(line);
    else if (is("stepping")) stepping = value(line);
  }
  if (family.empty() && model.empty()) return name;
  return name + " (family " + family + ", model " + model + ", stepping " + stepping + ")";
}

GemmPeak measure_sgemm_peak(int threads, int n) {
  threads = use_threads(std::max(1, threads));
  // The size: 2048 for a few threads, larger for many so each still gets whole
  // blocks, smaller on a slow machine (generic kernels) so a product stays
  // near 0.1-0.2 s: a 512^3 product first estimates the speed.
  const int n_max = threads <= 4 ? 2048 : threads <= 16 ? 3072 : 4096;
  const size_t nn = static_cast<size_t>(n > 0 ? n : n_max) * (n > 0 ? n : n_max);
  std::vector<float> a(nn), b(nn), c(nn);
  for (size_t i = 0; i < nn; ++i) {
    a[i] = static_cast<float>((i * 7919) % 1009) / 1009.0f - 0.5f;
    b[i] = static_cast<float>((i * 104729) % 997) / 997.0f - 0.5f;
  }
  if (n <= 0) {
    constexpr int kProbe = 512;
    double probe_s = 0;
    for (int rep = 0; rep < 2; ++rep) {  // the first pays for page faults and thread start
      const auto t0 = std::chrono::steady_clock::now();
      sgemm(false, false, kProbe, kProbe, kProbe, 1.0f, a.data(), kProbe, b.data(), kProbe, 0.0f, c.data(), kProbe);
      probe_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const double flops_per_s = 2.0 * kProbe * kProbe * kProbe / std::max(probe_s, 1e-9);
    const int fit = static_cast<int>(std::cbrt(0.2 * flops_per_s / 2.0)) / 256 * 256;  // the probe runs slower than a large product
    n = std::clamp(fit, kProbe, n_max);
  }
  const double flop = 2.0 * n * static_cast<double>(n) * n;
  double best = 0, spent = 0;
  GemmPeak p;
  p.loadavg = loadavg_1min();
  // One untimed product (page faults, thread start), then the best of at least
  // 5 and until 1 s has passed (at most 15): other work on the machine only
  // ever lowers a repetition's speed, so the best one is the closest to the peak.
  for (int rep = 0; rep < 16 && (rep < 6 || spent < 1.0); ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep == 0) continue;
    spent += s;
    best = std::max(best, flop / s / 1e9);
  }
  p.gflops = best;
  p.n = n;
  p.threads = threads;
  p.core = running_core();
  p.measured_at = utc_now();
  return p;
}

namespace {

// The running library's entry, read from the cache or measured and stored.
GemmPeak library_peak(int threads, bool recalibrate) {
  const std::string path = cache_path();
  const std::string core = running_core();
  const std::string key = cpu_identity() + " | " + core + " | " + std::to_string(threads) + " threads";
  nlohmann::json cache = nlohmann::json::object();
  if (!path.empty()) {
    std::ifstream in(path);
    if (in) {
      try {
        cache = nlohmann::json::parse(in);
      } catch (const std::exception&) {  // not JSON, or not readable (a directory): measured again
        cache = nlohmann::json::object();
      }
    }
  }
  if (!recalibrate && cache.is_object() && cache.contains(key)) {
    try {
      const auto& e = cache[key];
      GemmPeak p;
      p.gflops = e.at("gflops").get<double>();
      p.n = e.at("n").get<int>();
      p.threads = threads;
      p.core = core;
      p.measured_at = e.at("measured_at").get<std::string>();
      p.loadavg = e.at("loadavg").get<double>();
      p.cached = true;
      if (p.gflops > 0) return p;
    } catch (const nlohmann::json::exception&) {
    }
  }
  GemmPeak p = measure_sgemm_peak(threads);
  if (!path.empty()) {
    if (!cache.is_object()) cache = nlohmann::json::object();
    cache[key] = {{"gflops", p.gflops}, {"n", p.n}, {"measured_at", p.measured_at}, {"loadavg", p.loadavg}};
    try {
      make_dirs(path.substr(0, path.rfind('/')));
      atomic_write_file(path, cache.dump(1) + "\n");
    } catch (const std::exception&) {
      // A read-only home: the value is still right for this run.
    }
  }
  return p;
}

}  // namespace

GemmPeak sgemm_peak(int threads, bool recalibrate) {
  GemmPeak best;
  // oneDNN only where it may run; one thread has nothing to split.
  const bool onednn_allowed = select_gemm_library().onednn_allowed();
  for (GemmLibrary lib : {GemmLibrary::OpenBLAS, GemmLibrary::OneDNN})
    for (GemmThreading t : {GemmThreading::kLibrary, GemmThreading::kSplit}) {
      if (lib == GemmLibrary::OneDNN && !onednn_allowed) continue;
      if (t == GemmThreading::kSplit && threads <= 1) continue;
      const GemmLibraryScope on(lib);
      const GemmThreadingScope with(t);
      const GemmPeak p = library_peak(threads, recalibrate);
      if (p.gflops > best.gflops) best = p;
    }
  return best;
}

}  // namespace kvs::cpu
