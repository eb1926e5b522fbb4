// Reading a rank's part of a checkpoint tensor, shared by the model definitions: whole tensors,
// row and column ranges of matrices (tensor-parallel shards), and one MoE layer's routed experts
// in either layout HF checkpoints use. Errors name the tensor (WeightSource's contract).
#ifndef VAMP_ENGINE_MODEL_WEIGHT_READING_H_
#define VAMP_ENGINE_MODEL_WEIGHT_READING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/causal_lm.h"
#include "engine/model/weight_source.h"

namespace vamp {

// Reads the whole tensor `name` of `shape` into `out` (resized).
absl::Status ReadFull(WeightSource& source, const std::string& name, std::vector<int64_t> shape,
                      std::vector<float>* out);

// Rows [row_begin, row_end) of the 2-D tensor `name` of shape [rows, cols], into `out`
// ((row_end - row_begin) * cols floats).
absl::Status ReadRows(WeightSource& source, const std::string& name, int64_t rows, int64_t cols,
                      int64_t row_begin, int64_t row_end, float* out);

// Columns [col_begin, col_end) of the 2-D tensor `name` of shape [rows, cols], into `out`
// (rows * (col_end - col_begin) floats, row-major).
absl::Status ReadCols(WeightSource& source, const std::string& name, int64_t rows, int64_t cols,
                      int64_t col_begin, int64_t col_end, float* out);

// The routed experts of MoE layer `layer` (tensors under `model.layers.{layer}.mlp.experts.`):
// this rank's slice [tp_rank * inter, (tp_rank + 1) * inter) of each expert's intermediate
// dimension (inter = layout.inter of the full moe_intermediate_size), stored into `sink` as
// [gate rows | up rows | down] shards. Either the fused layout (transformers >= 5: gate_up_proj
// [E, 2I, H], gate rows first; down_proj [E, H, I]) or the per-expert one
// (experts.{e}.{gate,up,down}_proj.weight); NotFound naming both when the layer has neither.
absl::Status LoadRoutedExperts(WeightSource& source, int layer, int64_t num_experts,
                               int64_t moe_intermediate_size, const ExpertShardLayout& layout,
                               int tp_rank, ExpertWeightSink& sink);

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_WEIGHT_READING_H_
