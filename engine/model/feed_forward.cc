#include "engine/model/feed_forward.h"

#include "common/status_macros.h"
#include "engine/model/scratch.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/moe.h"

namespace vamp {
namespace {

namespace k = kernels::cpu;

}  // namespace

absl::Status FeedForward::Routed(int layer, const float* router, const RoutedExpertsShape& s,
                                 const float* x, int64_t n, ExpertWeights* experts, float* out) {
  const int64_t H = s.hidden, E = s.num_experts, top_k = s.top_k, Il = s.inter;
  const int64_t rows = n * top_k;
  float* router_logits = GrowScratch(router_logits_, n * E);
  k::Gemm(x, H, router, H, router_logits, E, n, E, H);
  int32_t* ids = GrowScratch(topk_ids_, rows);
  float* weights = GrowScratch(topk_weights_, rows);
  k::RouterTopK(router_logits, E, n, E, top_k, s.renormalize, ids, weights);
  int32_t* offsets = GrowScratch(expert_offsets_, E + 1);
  int32_t* row_token = GrowScratch(row_token_, rows);
  int32_t* pair_row = GrowScratch(pair_row_, rows);
  k::MoePermute(ids, n, top_k, E, offsets, row_token, pair_row);
  float* xs = GrowScratch(permuted_, rows * H);
  k::GatherRows(x, H, row_token, rows, H, xs, H);

  VAMP_ASSIGN_OR_RETURN(const ExpertLayerTable table, experts->AcquireLayer(layer));
  w13_table_.assign(E, nullptr);
  w2_table_.assign(E, nullptr);
  for (int64_t e = 0; e < E; ++e) {
    w13_table_[e] = static_cast<const float*>(table.w13[e]);
    w2_table_[e] = static_cast<const float*>(table.w2[e]);
  }
  float* h13 = GrowScratch(h13_, rows * 2 * Il);
  k::ExpertGemm(xs, H, w13_table_.data(), 0, H, offsets, E, h13, 2 * Il, 2 * Il, H);
  float* act = GrowScratch(act_, rows * Il);
  k::SiluAndMul(h13, 2 * Il, rows, Il, act, Il);
  float* y = GrowScratch(expert_out_, rows * H);
  k::ExpertGemm(act, Il, w2_table_.data(), 0, Il, offsets, E, y, H, H, Il);
  VAMP_RETURN_IF_ERROR(experts->ReleaseLayer(layer));

  k::MoeUnpermute(y, H, pair_row, weights, n, top_k, H, out, H);
  return absl::OkStatus();
}

void FeedForward::Dense(const float* w13, const float* w2, int64_t H, int64_t Il, const float* x,
                        int64_t n, float* out) {
  float* h13 = GrowScratch(h13_, n * 2 * Il);
  k::Gemm(x, H, w13, H, h13, 2 * Il, n, 2 * Il, H);
  float* act = GrowScratch(act_, n * Il);
  k::SiluAndMul(h13, 2 * Il, n, Il, act, Il);
  k::Gemm(act, Il, w2, Il, out, H, n, H, Il);
}

}  // namespace vamp
