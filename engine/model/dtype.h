// Element types of weights, activations and the KV cache. The CPU engine computes and stores
// float32; the CUDA engine stores bfloat16 weights, activations and KV (computing in float32) or,
// for bit-level comparisons with the CPU engine, float32 throughout.
#ifndef VAMP_ENGINE_MODEL_DTYPE_H_
#define VAMP_ENGINE_MODEL_DTYPE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vamp {

enum class DType { kFloat32, kBFloat16 };

// Bytes per element.
inline int64_t DTypeBytes(DType d) { return d == DType::kBFloat16 ? 2 : 4; }

// "float32" / "bfloat16", the names of checkpoints' config.json and of the --dtype flags.
inline absl::string_view DTypeName(DType d) {
  return d == DType::kBFloat16 ? "bfloat16" : "float32";
}

// Parses DTypeName's names; InvalidArgument naming the value otherwise (float16 is not supported:
// Qwen3 checkpoints are bfloat16 and float16 overflows their activations).
absl::StatusOr<DType> ParseDType(absl::string_view name);

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_DTYPE_H_
