// JSON files: read with one-line errors naming the file, written atomically.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace kvs {

// The file parsed; a syntax error or a number out of range ("1e400") is a
// kvs::Error "<path>: invalid JSON: <what>", a missing file "<path>: cannot read".
nlohmann::json read_json_file(const std::string& path);
// Indented JSON and a newline, written atomically (fs.h's atomic_write_file).
void write_json_file(const std::string& path, const nlohmann::json& j);

}  // namespace kvs
