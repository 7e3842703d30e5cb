// Compile-time loops for SIMD kernels whose accumulators are small arrays.
#pragma once

#include <type_traits>
#include <utility>

namespace tandem::cpu {
namespace {  // each kernel file (compiled for its own ISA) gets its own copy

// Calls f(std::integral_constant<int, 0>) .. f(<N - 1>), so array indices are
// constants before GCC 12 decides which arrays live in registers. With plain
// `for (t < NT)` loops it kept accumulators in registers but also stored each
// back to the stack every step (the AVX2 packed float kernel: 16 GMAC/s a core
// instead of 28).
template <int N, typename F>
inline void each(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>{}), ...); }
  (std::make_integer_sequence<int, N>{});
}

// Calls f(std::integral_constant<int, n>) for a run-time n in 1 .. Max: a kernel templated on
// its token count, picked for the count at hand (nothing for n outside the range).
template <int Max, typename F>
inline void with_count(int n, F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((n == I + 1 ? (f(std::integral_constant<int, I + 1>{}), true) : false) || ...);
  }
  (std::make_integer_sequence<int, Max>{});
}

}  // namespace
}  // namespace tandem::cpu
