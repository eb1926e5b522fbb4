#include "engine/model/causal_lm.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/sampling.h"

namespace vamp {
namespace {

constexpr int64_t kFloatBytes = sizeof(float);

// Calls fn(stored, done, n) for the pieces of the snapshot's bytes [offset, offset + bytes), chunk
// by chunk: `n` bytes at `stored`, `done` bytes into the range.
template <typename Fn>
void ForEachPiece(const StateSnapshotView& view, int64_t offset, int64_t bytes, Fn fn) {
  for (int64_t done = 0; done < bytes;) {
    const int64_t at = offset + done;
    const int64_t within = at % view.chunk_bytes;
    const int64_t n = std::min(bytes - done, view.chunk_bytes - within);
    fn(view.chunks[static_cast<size_t>(at / view.chunk_bytes)] + within, done, n);
    done += n;
  }
}

}  // namespace

void StateSnapshotView::Write(int64_t offset, const float* data, int64_t count) const {
  const auto* src = reinterpret_cast<const uint8_t*>(data);
  ForEachPiece(*this, offset * kFloatBytes, count * kFloatBytes,
               [&](uint8_t* stored, int64_t done, int64_t n) {
                 std::memcpy(stored, src + done, static_cast<size_t>(n));
               });
}

void StateSnapshotView::Read(int64_t offset, float* data, int64_t count) const {
  auto* dst = reinterpret_cast<uint8_t*>(data);
  ForEachPiece(*this, offset * kFloatBytes, count * kFloatBytes,
               [&](uint8_t* stored, int64_t done, int64_t n) {
                 std::memcpy(dst + done, stored, static_cast<size_t>(n));
               });
}

absl::Status CheckForwardAndSampleArgs(const ForwardBatch& batch, const StepSampling& sampling,
                                       const StepSamplingOutput& out, int64_t max_rows) {
  const size_t m = batch.logits_indices.size();
  const int32_t max_top = sampling.max_top_logprobs;
  if (sampling.temperatures.size() != m || sampling.top_ks.size() != m ||
      sampling.top_ps.size() != m || sampling.seeds.size() != m ||
      sampling.draw_indices.size() != m) {
    return absl::InvalidArgumentError(absl::StrCat("sampling parameters for ",
                                                   sampling.temperatures.size(),
                                                   " rows; the batch has ", m, " logits rows"));
  }
  if (sampling.top_counts.size() != (max_top > 0 ? m : 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_counts for ", sampling.top_counts.size(), " rows with max_top_logprobs ",
                     max_top, "; the batch has ", m, " logits rows"));
  }
  if (max_top < 0 || max_top > kernels::cpu::kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("max_top_logprobs ", max_top, " outside [0, ",
                                                   kernels::cpu::kMaxTopLogprobs, "]"));
  }
  if (m > 0 && (out.tokens == nullptr || out.logprobs == nullptr ||
                (max_top > 0 && (out.top_ids == nullptr || out.top_logprobs == nullptr)))) {
    return absl::InvalidArgumentError("ForwardAndSample needs every output array it fills");
  }
  if (static_cast<int64_t>(m) > max_rows) {
    return absl::ResourceExhaustedError(
        absl::StrCat("sampling ", m, " rows in one step exceeds ", max_rows, " (max_logits_rows)"));
  }
  return absl::OkStatus();
}

KvCacheView BlockMajorKvLayout::View(void* base, int64_t num_blocks,
                                     absl::Span<const int> attention_layers,
                                     int num_decoder_layers) const {
  KvCacheView view;
  view.block_size = block_size;
  view.num_blocks = num_blocks;
  view.dtype = dtype;
  view.strides.block_stride = BlockElements();
  view.strides.token_stride = kv_heads * head_dim;
  view.strides.head_stride = head_dim;
  view.k.assign(num_decoder_layers, nullptr);
  view.v.assign(num_decoder_layers, nullptr);
  for (size_t i = 0; i < attention_layers.size(); ++i) {
    uint8_t* k =
        static_cast<uint8_t*>(base) + static_cast<int64_t>(i) * LayerElements() * DTypeBytes(dtype);
    view.k[attention_layers[i]] = k;
    view.v[attention_layers[i]] = k + block_size * kv_heads * head_dim * DTypeBytes(dtype);
  }
  view.blocks = static_cast<uint8_t*>(base);
  view.block_bytes = BlockBytes();
  return view;
}

}  // namespace vamp
