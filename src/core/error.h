// Errors: one exception type carrying a one-line, user-facing message.
// The CLI catches it, prints "kvshift: error: <message>" and exits non-zero.
#pragma once
#include <fmt/format.h>
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

}  // namespace kvs

#define KVS_CHECK(cond, ...)                 \
  do {                                       \
    if (!(cond)) ::kvs::fail(__VA_ARGS__);   \
  } while (0)
