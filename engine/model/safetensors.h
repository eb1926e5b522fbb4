// Reader for the safetensors format (https://huggingface.co/docs/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON describing each tensor (dtype, shape, byte range
// in the data section), then the data section.
//
// The file is memory-mapped read-only; tensors are views into the mapping, so reading a slice
// (one tensor-parallel shard) touches only its bytes. Every header is validated before any view is
// handed out: the length fits the file, the JSON is an object, each tensor has a known dtype, a
// shape of non-negative dimensions whose byte size equals its data range, ranges lie inside the
// data section and do not overlap. A bad file is an error naming the file and the tensor, never
// a crash or a read outside the file.
#ifndef VAMP_ENGINE_MODEL_SAFETENSORS_H_
#define VAMP_ENGINE_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace vamp {

// Element types of the format. Only kF32, kF16 and kBF16 can be read as float32 here; the others
// are recognised so that a checkpoint containing them (e.g. integer buffers) still opens, and
// reading one of them is an error naming the tensor.
enum class TensorDType {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kI64,
  kU64,
  kF64,
  kF8E4M3,
  kF8E5M2
};

absl::string_view TensorDTypeName(TensorDType dtype);
// Bytes per element.
int64_t TensorDTypeSize(TensorDType dtype);
absl::StatusOr<TensorDType> ParseTensorDType(absl::string_view name);

struct TensorInfo {
  std::string name;
  TensorDType dtype = TensorDType::kF32;
  std::vector<int64_t> shape;
  int64_t num_elements = 0;
  // Into the mapping (or the caller's buffer for FromBuffer); valid while the file object lives.
  const uint8_t* data = nullptr;
  int64_t num_bytes = 0;
};

// "[2, 3, 4]": for error messages.
std::string ShapeString(absl::Span<const int64_t> shape);

class SafetensorsFile {
 public:
  // Upper bound on the JSON header (the format's own limit is 100 MB); larger is an error.
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

  // Maps `path` read-only and validates its header.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Validates a file image owned by the caller, which must outlive the returned object.
  // `display_name` is used in error messages (the fuzzer and tests use this entry point).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBuffer(const uint8_t* data,
                                                                     size_t size,
                                                                     std::string display_name);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Tensors in the order of their data offsets.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Null when the file has no tensor of that name.
  const TensorInfo* Find(absl::string_view name) const;
  // The optional "__metadata__" string map.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  absl::Status Parse(const uint8_t* data, size_t size);

  std::string path_;
  void* mapping_ = nullptr;  // owned mmap, null for FromBuffer
  size_t mapping_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// A half-open index range [begin, end) along one dimension.
struct DimRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// Converts the sub-block of `tensor` selected by `ranges` (one per dimension, in range of the
// shape) to float32, row-major into `out` (product of the range lengths elements). Supports F32,
// F16 and BF16; other dtypes and bad ranges are errors naming the tensor.
absl::Status ReadTensorSliceAsFloat(const TensorInfo& tensor, absl::Span<const DimRange> ranges,
                                    float* out);

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_SAFETENSORS_H_
