// Where the loader reads weights from: a safetensors checkpoint (one file or many, with or without
// model.safetensors.index.json) or seeded random values of the same shapes (`--load-format
// dummy`). Reads are by tensor name and slice, so a tensor-parallel rank reads only its shard.
#ifndef VAMP_ENGINE_MODEL_WEIGHT_SOURCE_H_
#define VAMP_ENGINE_MODEL_WEIGHT_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/model/safetensors.h"

namespace vamp {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Whether a tensor of that name exists (dummy sources have every name).
  virtual bool Has(const std::string& name) const = 0;
  // Converts the slice `ranges` of tensor `name` to float32 into `out` (row-major, product of the
  // range lengths). The tensor must have exactly `shape`; a missing tensor, another shape or an
  // unsupported dtype is an error naming the tensor.
  virtual absl::Status Read(const std::string& name, absl::Span<const int64_t> shape,
                            absl::Span<const DimRange> ranges, float* out) = 0;
  // Names of tensors present but never read, for diagnostics (empty for dummy sources).
  virtual std::vector<std::string> UnreadTensors() const = 0;
};

// Opens every *.safetensors file of the checkpoint directory `dir` (the files named by
// model.safetensors.index.json when present) or the single file `dir` names. A tensor name in two
// files is an error.
absl::StatusOr<std::unique_ptr<WeightSource>> OpenSafetensorsCheckpoint(const std::string& dir);

// Seeded random weights: element i of tensor `name` is a pure function of (seed, name, i), so every
// rank's shard agrees with the unsharded tensor. Values are uniform in
// [-1/sqrt(shape.back()), 1/sqrt(shape.back())] except for names ending in "norm.weight", which
// are 1 (so activations keep a sensible scale at any model size).
std::unique_ptr<WeightSource> CreateDummyWeightSource(uint64_t seed);

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_WEIGHT_SOURCE_H_
