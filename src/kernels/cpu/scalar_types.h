// The scalar types the CPU ops are instantiated for: float (the trainer) and
// double (the finite-difference tests). Every op static_asserts kSupported<T>.
#pragma once
#include <type_traits>

namespace kvs::cpu::detail {
template <class T>
inline constexpr bool kSupported = std::is_same_v<T, float> || std::is_same_v<T, double>;
}  // namespace kvs::cpu::detail
