#include "core/json_file.h"

#include "core/error.h"
#include "core/fs.h"

namespace kvs {

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // syntax, and numbers out of range ("1e400")
    fail("{}: invalid JSON: {}", path, one_line_error_text(e));
  }
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  std::string text;
  try {
    text = j.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {
    fail("{}: cannot write: {}", path, one_line_error_text(e));
  }
  atomic_write_file(path, text);
}

}  // namespace kvs
