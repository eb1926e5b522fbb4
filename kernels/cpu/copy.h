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
