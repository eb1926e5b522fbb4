#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/copy.h"
#include "nlohmann/json.hpp"

namespace vamp {
namespace {

struct DTypeEntry {
  TensorDType dtype;
  const char* name;
  int64_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {TensorDType::kBool, "BOOL", 1},      {TensorDType::kU8, "U8", 1},
    {TensorDType::kI8, "I8", 1},          {TensorDType::kI16, "I16", 2},
    {TensorDType::kU16, "U16", 2},        {TensorDType::kF16, "F16", 2},
    {TensorDType::kBF16, "BF16", 2},      {TensorDType::kI32, "I32", 4},
    {TensorDType::kU32, "U32", 4},        {TensorDType::kF32, "F32", 4},
    {TensorDType::kI64, "I64", 8},        {TensorDType::kU64, "U64", 8},
    {TensorDType::kF64, "F64", 8},        {TensorDType::kF8E4M3, "F8_E4M3", 1},
    {TensorDType::kF8E5M2, "F8_E5M2", 1},
};

const DTypeEntry& Entry(TensorDType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e;
  }
  return kDTypes[0];  // unreachable: every enumerator is in the table
}

// A JSON number that is a non-negative integer representable as int64.
bool AsNonNegativeInt(const nlohmann::json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(v);
    return true;
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = v;
    return true;
  }
  return false;
}

}  // namespace

absl::string_view TensorDTypeName(TensorDType dtype) { return Entry(dtype).name; }
int64_t TensorDTypeSize(TensorDType dtype) { return Entry(dtype).size; }

absl::StatusOr<TensorDType> ParseTensorDType(absl::string_view name) {
  for (const auto& e : kDTypes) {
    if (name == e.name) return e.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat '", path, "': ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("safetensors file '", path,
                                                   "' is truncated: ", size,
                                                   " bytes, less than the 8-byte header "
                                                   "length"));
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapping == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot mmap '", path, "': ", std::strerror(err)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->mapping_size_ = size;
  if (absl::Status s = file->Parse(static_cast<const uint8_t*>(mapping), size); !s.ok()) return s;
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBuffer(
    const uint8_t* data, size_t size, std::string display_name) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::move(display_name);
  if (absl::Status s = file->Parse(data, size); !s.ok()) return s;
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

const TensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::Status SafetensorsFile::Parse(const uint8_t* data, size_t size) {
  auto error = [this](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors file '", path_, "': ", parts...));
  };
  if (size < 8) return error("truncated: ", size, " bytes, less than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > kMaxHeaderBytes) {
    return error("header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  }
  if (header_len > size - 8) {
    return error("truncated: header length ", header_len, " but only ", size - 8,
                 " bytes follow it");
  }
  const char* header = reinterpret_cast<const char*>(data + 8);
  nlohmann::json root = nlohmann::json::parse(header, header + header_len, /*cb=*/nullptr,
                                              /*allow_exceptions=*/false);
  if (root.is_discarded()) return error("header is not valid JSON");
  if (!root.is_object()) return error("header is not a JSON object");

  const uint8_t* data_section = data + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  tensors_.clear();
  index_.clear();
  metadata_.clear();
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end) per tensor, for overlaps
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return error("'__metadata__' is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return error("'__metadata__' entry '", m.key(), "' is not a string");
        }
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (name.empty()) return error("a tensor has an empty name");
    if (!entry.is_object()) return error("tensor '", name, "': entry is not an object");
    for (auto f = entry.begin(); f != entry.end(); ++f) {
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets") {
        return error("tensor '", name, "': unknown field '", f.key(), "'");
      }
    }
    TensorInfo info;
    info.name = name;
    auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return error("tensor '", name, "': missing or non-string 'dtype'");
    }
    absl::StatusOr<TensorDType> dtype = ParseTensorDType(dtype_it->get<std::string>());
    if (!dtype.ok()) return error("tensor '", name, "': ", dtype.status().message());
    info.dtype = *dtype;

    auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return error("tensor '", name, "': missing or non-array 'shape'");
    }
    int64_t num_elements = 1;
    for (const auto& dim : *shape_it) {
      int64_t d;
      if (!AsNonNegativeInt(dim, &d)) {
        return error("tensor '", name, "': shape entries must be non-negative integers");
      }
      if (__builtin_mul_overflow(num_elements, d, &num_elements)) {
        return error("tensor '", name, "': element count overflows");
      }
      info.shape.push_back(d);
    }
    info.num_elements = num_elements;
    int64_t num_bytes;
    if (__builtin_mul_overflow(num_elements, TensorDTypeSize(info.dtype), &num_bytes)) {
      return error("tensor '", name, "': byte size overflows");
    }

    auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
      return error("tensor '", name, "': 'data_offsets' must be an array [begin, end]");
    }
    int64_t begin, end;
    if (!AsNonNegativeInt((*offsets_it)[0], &begin) || !AsNonNegativeInt((*offsets_it)[1], &end)) {
      return error("tensor '", name, "': data_offsets must be non-negative integers");
    }
    if (begin > end) {
      return error("tensor '", name, "': data_offsets [", begin, ", ", end, "] are reversed");
    }
    if (static_cast<uint64_t>(end) > data_size) {
      return error("tensor '", name, "': data_offsets end ", end, " is past the data section of ",
                   data_size, " bytes (truncated file?)");
    }
    if (end - begin != num_bytes) {
      return error("tensor '", name, "': shape ", ShapeString(info.shape), " of ",
                   TensorDTypeName(info.dtype), " needs ", num_bytes,
                   " bytes but data_offsets span ", end - begin);
    }
    info.data = data_section + begin;
    info.num_bytes = num_bytes;
    ranges.emplace_back(begin, end);
    tensors_.push_back(std::move(info));
  }
  // Order by offset; a tensor may not start before the previous one ends.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  std::vector<TensorInfo> sorted;
  sorted.reserve(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) {
    if (i > 0 && ranges[order[i]].first < ranges[order[i - 1]].second) {
      return error("tensors '", tensors_[order[i - 1]].name, "' and '", tensors_[order[i]].name,
                   "' overlap in the data section");
    }
    sorted.push_back(std::move(tensors_[order[i]]));
  }
  tensors_ = std::move(sorted);
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  return absl::OkStatus();
}

absl::Status ReadTensorSliceAsFloat(const TensorInfo& tensor, absl::Span<const DimRange> ranges,
                                    float* out) {
  const size_t rank = tensor.shape.size();
  if (ranges.size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name, "': slice has ",
                                                   ranges.size(), " ranges for a tensor of rank ",
                                                   rank));
  }
  for (size_t d = 0; d < rank; ++d) {
    if (ranges[d].begin < 0 || ranges[d].begin > ranges[d].end || ranges[d].end > tensor.shape[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensor.name, "': slice [", ranges[d].begin, ", ", ranges[d].end,
                       ") of dimension ", d, " is outside its shape ", ShapeString(tensor.shape)));
    }
    if (ranges[d].begin == ranges[d].end) return absl::OkStatus();  // empty slice
  }
  if (tensor.dtype != TensorDType::kF32 && tensor.dtype != TensorDType::kF16 &&
      tensor.dtype != TensorDType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name, "' has dtype ",
                                                   TensorDTypeName(tensor.dtype),
                                                   "; only F32, F16 and BF16 can be loaded"));
  }
  const int64_t elem = TensorDTypeSize(tensor.dtype);
  // Element strides of the source, innermost run length and the outer index odometer.
  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank; d-- > 1;) stride[d - 1] = stride[d] * tensor.shape[d];
  const int64_t run = rank == 0 ? 1 : ranges[rank - 1].end - ranges[rank - 1].begin;
  std::vector<int64_t> index(rank);
  for (size_t d = 0; d < rank; ++d) index[d] = ranges[d].begin;
  std::vector<uint16_t> narrow(elem == 2 ? run : 0);
  for (;;) {
    int64_t offset = 0;
    for (size_t d = 0; d < rank; ++d) offset += index[d] * stride[d];
    const uint8_t* src = tensor.data + offset * elem;
    // The mapping may be unaligned for the element type: copy bytes, then convert.
    if (tensor.dtype == TensorDType::kF32) {
      std::memcpy(out, src, run * sizeof(float));
    } else {
      std::memcpy(narrow.data(), src, run * sizeof(uint16_t));
      if (tensor.dtype == TensorDType::kBF16) {
        kernels::cpu::Bf16ToFloat(narrow.data(), run, out);
      } else {
        kernels::cpu::Fp16ToFloat(narrow.data(), run, out);
      }
    }
    out += run;
    // Advance the odometer over all but the innermost dimension.
    if (rank <= 1) break;
    size_t d = rank - 1;
    for (;;) {
      if (d == 0) return absl::OkStatus();
      --d;
      if (++index[d] < ranges[d].end) break;
      index[d] = ranges[d].begin;
    }
  }
  return absl::OkStatus();
}

}  // namespace vamp
