#include "train/metrics.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/fs.h"

namespace kvs {
namespace {

// The "step" of a parsed metrics line, or nullopt (a foreign line, or one cut by a crash).
std::optional<double> step_of(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) return std::nullopt;
  return j["step"].get<double>();
}

}  // namespace

MetricsSteps metrics_steps(const std::string& path) {
  MetricsSteps s;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (const std::optional<double> step = step_of(j)) {
      ++s.lines;
      s.last = std::max(s.last, static_cast<int64_t>(*step));
      if (j.value("type", "") == "eval") s.last_eval = std::max(s.last_eval, static_cast<int64_t>(*step));
    }
  }
  return s;
}

void MetricsWriter::open(const std::string& path, int64_t keep_through_step) {
  if (keep_through_step >= 0 && std::filesystem::exists(path)) {
    std::istringstream in(read_file(path));
    std::string line, kept;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) continue;  // a line cut by a crash
      if (const std::optional<double> step = step_of(j); step && *step > keep_through_step) continue;
      kept += line + "\n";
    }
    atomic_write_file(path, kept);
  }
  path_ = path;
  f_ = std::fopen(path.c_str(), "a");
  KVS_CHECK(f_ != nullptr, "{}: cannot open for appending", path);
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const nlohmann::json& line) {
  if (!f_) return;
  const std::string s = line.dump() + "\n";
  // A full disk loses metrics lines, not the run (its checkpoint saves fail loudly): say so once.
  if ((std::fwrite(s.data(), 1, s.size(), f_) != s.size() || std::fflush(f_) != 0) && !write_failed_) {
    write_failed_ = true;
    spdlog::warn("metrics: cannot write {}: {}; later lines may be lost", path_, std::strerror(errno));
  }
}

}  // namespace kvs
