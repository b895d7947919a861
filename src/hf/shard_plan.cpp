#include "hf/shard_plan.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>

#include "core/error.h"

namespace kvs::hf {

uint64_t parse_size(const std::string& text, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  std::string unit = text.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  else if (unit == "KIB") mult = 1024.0;
  else if (unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "GIB") mult = 1024.0 * 1024 * 1024;
  double v = 0;
  bool ok = i > 0 && mult > 0;
  if (ok) {
    try {
      v = std::stod(text.substr(0, i));
    } catch (const std::exception&) {
      ok = false;
    }
  }
  KVS_CHECK(ok && v * mult >= 1 && std::isfinite(v * mult),
            "{}: '{}' is not a size (examples: 5GB, 500MB, 2GiB, 1000000)", what, text);
  return static_cast<uint64_t>(std::llround(v * mult));
}

std::vector<std::vector<size_t>> plan_shards(const std::vector<uint64_t>& bytes, uint64_t limit) {
  std::vector<std::vector<size_t>> shards;
  uint64_t cur = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (shards.empty() || (cur > 0 && cur + bytes[i] > limit)) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += bytes[i];
  }
  return shards;
}

std::string shard_file_name(size_t index, size_t count) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

}  // namespace kvs::hf
