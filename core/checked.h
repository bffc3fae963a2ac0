// Checked size arithmetic: every size formed from caller values goes through these, so that a
// product or sum that does not fit is an error instead of a wrapped (small) size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace kvarn {

// *out = the product of factors; false if it does not fit in size_t (or a factor is negative).
template <typename... T>
bool CheckedMul(size_t* out, T... factors) {
  size_t r = 1;
  for (long long f : std::initializer_list<long long>{static_cast<long long>(factors)...}) {
    if (f < 0 || __builtin_mul_overflow(r, static_cast<unsigned long long>(f), &r)) return false;
  }
  *out = r;
  return true;
}

// *acc += v; false (acc unchanged) on overflow.
inline bool CheckedAdd(size_t* acc, size_t v) {
  size_t r;
  if (__builtin_add_overflow(*acc, v, &r)) return false;
  *acc = r;
  return true;
}

// The largest byte count an object can have here (PTRDIFF_MAX): larger sizes cannot describe
// caller memory and are refused as arguments.
constexpr size_t kMaxObjectBytes = static_cast<size_t>(PTRDIFF_MAX);

}  // namespace kvarn
