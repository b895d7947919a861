// metrics.jsonl: one JSON object per line (a training step or an evaluation),
// flushed as written so a crash loses nothing that was printed.
#pragma once
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace kvs {

// The lines of a metrics.jsonl that carry a "step" (training, evaluation and
// straggler lines; not foreign or cut ones), and the largest step (-1: none).
struct MetricsSteps {
  int64_t lines = 0, last = -1;
  int64_t last_eval = -1;  // the last step with a {"type": "eval"} line
};
MetricsSteps metrics_steps(const std::string& path);

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Opens `path` for appending. With keep_through_step >= 0, first drops every
  // line whose "step" is greater (lines a crashed run wrote after the checkpoint
  // it resumes from), rewriting the file atomically.
  void open(const std::string& path, int64_t keep_through_step = -1);
  ~MetricsWriter();
  // A failed write (a full disk) loses that line whole, warns once, and goes
  // on; when writes work again it says how many were lost, and the
  // destructor says so again at the end.
  void write(const nlohmann::json& line);
  int64_t lost_lines() const { return lost_; }

 private:
  int fd_ = -1;
  std::string path_;
  bool failing_ = false;
  int64_t lost_ = 0;
};

}  // namespace kvs
