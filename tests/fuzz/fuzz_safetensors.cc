// libFuzzer target: the safetensors header parser and slice reader must reject any malformed file
// with an error, never crash or read outside the buffer (AddressSanitizer checks the reads: the
// fuzzer's buffer is exactly `size` bytes).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = vamp::SafetensorsFile::FromBuffer(data, size, "fuzz.safetensors");
  if (!file.ok()) return 0;
  std::vector<float> out;
  for (const vamp::TensorInfo& t : (*file)->tensors()) {
    // Whole tensors up to a bound, and the last element of every one: reads at both ends.
    std::vector<vamp::DimRange> ranges;
    for (int64_t d : t.shape) ranges.push_back({0, d});
    if (t.num_elements <= (1 << 16)) {
      out.resize(t.num_elements);
      (void)vamp::ReadTensorSliceAsFloat(t, ranges, out.data());
    }
    if (t.num_elements > 0) {
      for (size_t i = 0; i < ranges.size(); ++i) ranges[i].begin = ranges[i].end - 1;
      float last;
      (void)vamp::ReadTensorSliceAsFloat(t, ranges, &last);
    }
  }
  return 0;
}
