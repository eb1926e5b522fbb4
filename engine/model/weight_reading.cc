#include "engine/model/weight_reading.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace vamp {

absl::Status ReadFull(WeightSource& source, const std::string& name, std::vector<int64_t> shape,
                      std::vector<float>* out) {
  std::vector<DimRange> ranges;
  int64_t n = 1;
  for (int64_t d : shape) {
    ranges.push_back({0, d});
    n *= d;
  }
  out->resize(n);
  return source.Read(name, shape, ranges, out->data());
}

absl::Status ReadRows(WeightSource& source, const std::string& name, int64_t rows, int64_t cols,
                      int64_t row_begin, int64_t row_end, float* out) {
  const int64_t shape[] = {rows, cols};
  const DimRange ranges[] = {{row_begin, row_end}, {0, cols}};
  return source.Read(name, shape, ranges, out);
}

absl::Status ReadCols(WeightSource& source, const std::string& name, int64_t rows, int64_t cols,
                      int64_t col_begin, int64_t col_end, float* out) {
  const int64_t shape[] = {rows, cols};
  const DimRange ranges[] = {{0, rows}, {col_begin, col_end}};
  return source.Read(name, shape, ranges, out);
}

absl::Status LoadRoutedExperts(WeightSource& source, int layer, int64_t num_experts,
                               int64_t moe_intermediate_size, const ExpertShardLayout& layout,
                               int tp_rank, ExpertWeightSink& sink) {
  const int64_t H = layout.hidden, I = moe_intermediate_size, E = num_experts;
  const int64_t Il = layout.inter, r = tp_rank;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".mlp.experts.");
  const bool fused = source.Has(prefix + "gate_up_proj");
  if (!fused && !source.Has(prefix + "0.gate_proj.weight")) {
    return absl::NotFoundError(absl::StrCat("checkpoint has no experts for layer ", layer,
                                            ": neither '", prefix, "gate_up_proj' (fused) nor '",
                                            prefix, "0.gate_proj.weight' (per expert)"));
  }
  std::vector<float> shard(layout.Elements());
  float* gate = shard.data();
  float* up = gate + Il * H;
  float* down = shard.data() + layout.W13Elements();
  for (int64_t e = 0; e < E; ++e) {
    if (fused) {
      const int64_t gu_shape[] = {E, 2 * I, H};
      const DimRange gate_ranges[] = {{e, e + 1}, {r * Il, (r + 1) * Il}, {0, H}};
      const DimRange up_ranges[] = {{e, e + 1}, {I + r * Il, I + (r + 1) * Il}, {0, H}};
      VAMP_RETURN_IF_ERROR(source.Read(prefix + "gate_up_proj", gu_shape, gate_ranges, gate));
      VAMP_RETURN_IF_ERROR(source.Read(prefix + "gate_up_proj", gu_shape, up_ranges, up));
      const int64_t d_shape[] = {E, H, I};
      const DimRange d_ranges[] = {{e, e + 1}, {0, H}, {r * Il, (r + 1) * Il}};
      VAMP_RETURN_IF_ERROR(source.Read(prefix + "down_proj", d_shape, d_ranges, down));
    } else {
      const std::string ep = absl::StrCat(prefix, e, ".");
      VAMP_RETURN_IF_ERROR(
          ReadRows(source, ep + "gate_proj.weight", I, H, r * Il, (r + 1) * Il, gate));
      VAMP_RETURN_IF_ERROR(ReadRows(source, ep + "up_proj.weight", I, H, r * Il, (r + 1) * Il, up));
      VAMP_RETURN_IF_ERROR(
          ReadCols(source, ep + "down_proj.weight", H, I, r * Il, (r + 1) * Il, down));
    }
    VAMP_RETURN_IF_ERROR(sink.StoreExpertShard(layer, static_cast<int>(e), shard));
  }
  return absl::OkStatus();
}

}  // namespace vamp
