#include "engine/model/causal_lm.h"

namespace vamp {

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
  return view;
}

}  // namespace vamp
