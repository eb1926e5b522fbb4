#include "engine/model/dtype.h"

#include "absl/strings/str_cat.h"

namespace vamp {

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "float32") return DType::kFloat32;
  if (name == "bfloat16") return DType::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype '", name, "' is not supported (use bfloat16 or float32)"));
}

}  // namespace vamp
