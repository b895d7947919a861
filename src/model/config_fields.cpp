// The typed readers, the key check with its suggestions, and the range rules
// behind the config's field tables (config_fields.h).
#include "model/config_fields.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>

namespace kvs::config {

std::string join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

// ---------------------------------------------------------------------------
// Schema and suggestions.
// ---------------------------------------------------------------------------

const Schema::Section* Schema::find(const std::string& path) const {
  for (const auto& s : sections)
    if (s.path == path) return &s;
  return nullptr;
}

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                                          std::tolower(static_cast<unsigned char>(b[j - 1]))
                                      ? 0
                                      : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string truncated(std::string s, size_t n = 60) {
  if (s.size() > n) s = s.substr(0, n - 3) + "...";
  return s;
}

}  // namespace

std::string Schema::suggestion(const std::string& key, const std::string& parent,
                               const std::vector<std::string>& known) const {
  const size_t limit = key.size() <= 4 ? 1 : key.size() <= 8 ? 2 : 3;
  size_t best = limit + 1;
  std::string best_key;
  for (const auto& k : known) {
    size_t d = edit_distance(key, k);
    if (d < best) best = d, best_key = k;
  }
  if (!best_key.empty()) return " (did you mean '" + join(parent, best_key) + "'?)";
  for (const auto& s : sections)
    for (const auto& k : s.keys)
      if (k == key && parent != s.path) return " (did you mean '" + join(s.path, k) + "'?)";
  return "";
}

// ---------------------------------------------------------------------------
// Messages about JSON values.
// ---------------------------------------------------------------------------

std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean " + v.dump();
    case json::value_t::string: return "string " + truncated(v.dump());
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "number " + v.dump();
    case json::value_t::array: return "array " + truncated(v.dump());
    case json::value_t::object: return "object " + truncated(v.dump());
    default: return "a value of another kind";
  }
}

void type_error(const Where& w, const char* expected, const json& got) {
  fail("{}: {}: expected {}, got {}", w.origin, w.path, expected, describe(got));
}

void require_object(const json& v, const Where& w) {
  if (v.is_object()) return;
  if (w.path.empty()) fail("{}: expected a JSON object at the top level, got {}", w.origin, describe(v));
  type_error(w, "an object", v);
}

void check_keys(const json& j, const Where& w, const std::vector<std::string>& known,
                const std::vector<std::string>& also) {
  for (const auto& [k, v] : j.items()) {
    if (std::find(known.begin(), known.end(), k) != known.end()) continue;
    if (std::find(also.begin(), also.end(), k) != also.end()) continue;
    fail("{}: unknown key '{}'{}", w.origin, w.key(k), w.schema.suggestion(k, w.path, known));
  }
}

// ---------------------------------------------------------------------------
// Typed readers.
// ---------------------------------------------------------------------------

void read_value(const json& v, const Where& w, int& out) {
  auto too_big = [&] { fail("{}: {}: {} does not fit in a 32-bit integer", w.origin, w.path, v.dump()); };
  if (v.is_number_unsigned()) {
    auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT_MAX)) too_big();
    out = static_cast<int>(u);
  } else if (v.is_number_integer()) {
    auto x = v.get<int64_t>();
    if (x < INT_MIN || x > INT_MAX) too_big();
    out = static_cast<int>(x);
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || d != std::trunc(d)) type_error(w, "an integer", v);
    if (d < INT_MIN || d > INT_MAX) too_big();
    out = static_cast<int>(d);
  } else {
    type_error(w, "an integer", v);
  }
}

void read_value(const json& v, const Where& w, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    auto x = v.get<int64_t>();
    if (x < 0) fail("{}: {}: expected a non-negative integer, got number {}", w.origin, w.path, x);
    out = static_cast<uint64_t>(x);
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || d != std::trunc(d)) type_error(w, "a non-negative integer", v);
    // Doubles are exact integers only up to 2^53; write bigger seeds as integers.
    if (d < 0) fail("{}: {}: expected a non-negative integer, got number {}", w.origin, w.path, v.dump());
    if (d > 9007199254740992.0)
      fail("{}: {}: {} is past 2^53, where a number with an exponent or a decimal point is no longer exact: write "
           "it in plain digits ({:.0f})",
           w.origin, w.path, v.dump(), d);
    out = static_cast<uint64_t>(d);
  } else {
    type_error(w, "a non-negative integer", v);
  }
}

void read_value(const json& v, const Where& w, double& out) {
  if (!v.is_number()) type_error(w, "a number", v);
  const double d = v.get<double>();
  if (!std::isfinite(d)) type_error(w, "a finite number", v);
  out = d;
}

void read_value(const json& v, const Where& w, bool& out) {
  if (!v.is_boolean()) type_error(w, "a boolean (true or false)", v);
  out = v.get<bool>();
}

void read_value(const json& v, const Where& w, std::string& out) {
  if (!v.is_string()) type_error(w, "a string", v);
  out = v.get<std::string>();
}

namespace {
// An array whose items read as T, each named "<path>[i]" in messages.
template <class T>
void read_array(const json& v, const Where& w, const char* expected, std::vector<T>& out) {
  if (!v.is_array()) type_error(w, expected, v);
  std::vector<T> items(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    read_value(v[i], Where{w.origin, w.schema, fmt::format("{}[{}]", w.path, i)}, items[i]);
  out = std::move(items);
}
}  // namespace

void read_value(const json& v, const Where& w, std::vector<std::string>& out) {
  read_array(v, w, "an array of strings", out);
}
void read_value(const json& v, const Where& w, std::vector<int>& out) { read_array(v, w, "an array of integers", out); }
void read_value(const json& v, const Where& w, std::vector<double>& out) {
  read_array(v, w, "an array of numbers", out);
}

// ---------------------------------------------------------------------------
// Range rules.
// ---------------------------------------------------------------------------

bool Rule::holds(double v) const {
  switch (kind) {
    case Kind::Positive: return v > 0;
    case Kind::AtLeast: return v >= lo;
    case Kind::Above: return v > lo;
    case Kind::Closed: return v >= lo && v <= hi;
    case Kind::HalfOpen: return v >= lo && v < hi;
  }
  return false;
}

std::string Rule::bound() const {
  std::string s;
  switch (kind) {
    case Kind::Positive: s = "positive"; break;
    case Kind::AtLeast: s = fmt::format(">= {}", lo); break;
    case Kind::Above: s = fmt::format("> {}", lo); break;
    case Kind::Closed: s = fmt::format("in [{}, {}]", lo, hi); break;
    case Kind::HalfOpen: s = fmt::format("in [{}, {})", lo, hi); break;
  }
  if (note) s += fmt::format(" ({})", note);
  return s;
}

}  // namespace kvs::config
