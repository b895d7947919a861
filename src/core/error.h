// Errors: one exception type carrying a one-line, user-facing message.
// The CLI catches it, prints "kvshift: error: <message>" and exits non-zero.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvs {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
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
