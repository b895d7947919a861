#include "train/metrics.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

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
    // Through a link (metrics.jsonl -> a dashboard's directory), the file it names is rewritten; the link stays.
    std::error_code ec;
    const std::string target = std::filesystem::is_symlink(path, ec) ? std::filesystem::canonical(path).string() : path;
    atomic_write_file(target, kept);
  }
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  KVS_CHECK(fd_ >= 0, "{}: cannot open for appending: {}", path, std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (fd_ < 0) return;
  if (lost_ > 0)
    spdlog::warn("metrics: {} line{} of {} could not be written (the file holds every other line, whole)", lost_,
                 lost_ == 1 ? "" : "s", path_);
  ::close(fd_);
}

void MetricsWriter::write(const nlohmann::json& line) {
  if (fd_ < 0) return;
  const std::string s = line.dump() + "\n";
  // A full disk loses metrics lines, not the run (its checkpoint saves fail loudly). A line
  // written in part is cut off again, so the next one does not continue it: the file stays
  // whole lines that parse, and only the lost ones are missing.
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd_, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  if (done == s.size()) {
    if (failing_) {
      failing_ = false;
      spdlog::info("metrics: {} is written again ({} line{} lost)", path_, lost_, lost_ == 1 ? "" : "s");
    }
    return;
  }
  const int err = errno;
  if (done > 0 && before >= 0 && ::ftruncate(fd_, before) != 0)
    spdlog::warn("metrics: cannot cut a partly written line off {}: {}", path_, std::strerror(errno));
  ++lost_;
  if (!failing_) {
    failing_ = true;
    spdlog::warn("metrics: cannot write {}: {}; lines are lost until it can be written again", path_,
                 std::strerror(err ? err : ENOSPC));
  }
}

}  // namespace kvs
