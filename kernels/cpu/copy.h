// Data movement and number-format conversion, CPU reference. Conventions: see kernels/cpu/gemm.h.
#ifndef VAMP_KERNELS_CPU_COPY_H_
#define VAMP_KERNELS_CPU_COPY_H_

#include <cstdint>

#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cpu {

// dst[r, :] = src[row_index[r], :] for r < num_rows, `cols` elements per row. Serves as the
// embedding lookup (src = the embedding table, row_index = token ids) and as the MoE gather.
void GatherRows(const float* src, int64_t src_stride, const int32_t* row_index, int64_t num_rows,
                int64_t cols, float* dst, int64_t dst_stride);
// The bfloat16 version (bf16 embedding table and activations): a bit-exact copy, NaN payloads
// included.
void GatherRows(const BFloat16* src, int64_t src_stride, const int32_t* row_index, int64_t num_rows,
                int64_t cols, BFloat16* dst, int64_t dst_stride);

// Routed expert staging: copies expert e's `expert_bytes` from src + (e − first_expert) ·
// expert_bytes to dst at the same offset, for every e in [first_expert, num_experts) that the
// step's routing uses (expert_offsets[e + 1] > expert_offsets[e]; expert_offsets is MoePermute's
// [num_experts + 1] row offsets). Experts nobody routes to are not copied: their bytes in dst are
// left as they were, which is safe because no GEMM row reads them. `src` is the offloaded range
// [first_expert, num_experts) of a layer (its pinned host copy), `dst` its staging buffer. When
// `copied_bytes` is not null, the bytes copied are added to it.
void CopyRoutedExperts(const int32_t* expert_offsets, int64_t first_expert, int64_t num_experts,
                       const uint8_t* src, uint8_t* dst, int64_t expert_bytes,
                       uint64_t* copied_bytes);

// Widening conversions of `n` elements; exact (every bf16 and fp16 value, subnormals, infinities
// and NaNs included, is representable in float32).
void Bf16ToFloat(const uint16_t* src, int64_t n, float* dst);
void Fp16ToFloat(const uint16_t* src, int64_t n, float* dst);

// Round-to-nearest-even narrowing (NaN stays NaN; fp16 overflows to infinity and keeps
// subnormals); for producing 16-bit checkpoints and test data.
void FloatToBf16(const float* src, int64_t n, uint16_t* dst);
void FloatToFp16(const float* src, int64_t n, uint16_t* dst);

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_COPY_H_
