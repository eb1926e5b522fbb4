// Flag parsing shared by the GPU kernel benchmarks (vamp_attention_bench, vamp_delta_rule_bench).
#ifndef VAMP_BENCH_KERNELS_BENCH_FLAGS_H_
#define VAMP_BENCH_KERNELS_BENCH_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/config.h"

namespace vamp::bench {

// The comma-separated integers of flag `name` (empty parts skipped); InvalidArgument naming the
// flag and the part for anything that is not an integer of at least `min`.
inline absl::StatusOr<std::vector<int64_t>> ParseIntList(const Config& config,
                                                         const std::string& name, int64_t min) {
  std::vector<int64_t> values;
  for (absl::string_view part : absl::StrSplit(config.GetString(name), ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < min) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": '", part, "' is not an integer >= ", min));
    }
    values.push_back(v);
  }
  return values;
}

}  // namespace vamp::bench

#endif  // VAMP_BENCH_KERNELS_BENCH_FLAGS_H_
