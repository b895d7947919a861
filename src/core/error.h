// Errors: one exception type carrying a one-line, user-facing message.
// The CLI catches it, prints "kvshift: error: <message>" and exits non-zero.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvs {

// A message on one visible line: control characters a value brought in (a
// newline or NUL inside a path or a config string) are written as escapes,
// "\n", "\0", "\x1b" (a tab stays), so the line neither breaks nor stops at a NUL.
inline std::string escape_control_characters(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((u >= 0x20 && u != 0x7f) || c == '\t') {
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\0') {
      out += "\\0";
    } else {
      out += fmt::format("\\x{:02x}", u);
    }
  }
  return out;
}

struct Error : std::runtime_error {
  explicit Error(const std::string& message) : std::runtime_error(escape_control_characters(message)) {}
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

// A library exception's text on one line, without nlohmann's
// "[json.exception.parse_error.101] " prefix, for embedding in our messages.
inline std::string one_line_error_text(const std::exception& e) {
  std::string s = e.what();
  if (!s.empty() && s[0] == '[') {
    const auto p = s.find("] ");
    if (p != std::string::npos) s = s.substr(p + 2);
  }
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

}  // namespace kvs

#define KVS_CHECK(cond, ...)                 \
  do {                                       \
    if (!(cond)) ::kvs::fail(__VA_ARGS__);   \
  } while (0)
