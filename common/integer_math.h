// Integer helpers shared across layers.
#ifndef VAMP_COMMON_INTEGER_MATH_H_
#define VAMP_COMMON_INTEGER_MATH_H_

#include <cstdint>

namespace vamp {

// ceil(a / b) for a >= 0 and b > 0 (e.g. blocks that hold `a` tokens at `b` tokens per block).
constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace vamp

#endif  // VAMP_COMMON_INTEGER_MATH_H_
