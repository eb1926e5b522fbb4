#include "bench/engine/gpu_step_report.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "engine/memory/memory_plan.h"
#include "nlohmann/json.hpp"

namespace vamp::gpu_step_bench {

namespace {

using Json = nlohmann::ordered_json;

// The paper's decode-time cost of VAMP-15 (Table IV: TPOT 170.9 -> 224.0 ms).
constexpr double kPaperTpotOverheadPct = 31.1;

Json ToJson(const Summary& s) {
  return Json{{"p50", s.p50}, {"p90", s.p90}, {"mean", s.mean}, {"min", s.min}};
}

}  // namespace

std::string FormatReport(const Flags& f, const Bandwidths& bw, const DecodeFloor& floor,
                         const ExpertGeometry& g, const std::vector<PointResult>& points) {
  const PointResult& resident_decode = points.front();
  std::string out = absl::StrFormat(
      "\n%s, %s; %s %s (dummy weights, bfloat16), batch %d @ %d tokens\n"
      "HBM %.0f GB/s, pinned H2D %.1f GB/s (%s copy), logits D2H %.2f ms per step\n\n"
      "decode floor: %.2f ms = (%.2f GiB non-expert + %.2f GiB experts + %.2f GiB KV + %.2f GiB "
      "recurrent state) / HBM\n"
      "  (%s)\n"
      "resident decode: forward %.2f ms = %.2fx the floor; step (with sampling) %.2f ms\n\n",
      bw.device_name, FormatBytes(bw.device_memory_bytes), floor.model_type, f.model_dir, f.batch,
      f.context, bw.hbm_gbps, bw.h2d_peak_gbps, FormatBytes(f.h2d_copy_bytes), bw.logits_d2h_ms,
      floor.ms, floor.non_expert_bytes / kGiB, floor.expert_bytes / kGiB, floor.kv_bytes / kGiB,
      floor.state_bytes / kGiB, floor.estimate, resident_decode.forward_ms.p50,
      resident_decode.forward_ms.p50 / floor.ms, resident_decode.step_ms.p50);
  absl::StrAppend(
      &out,
      "| mode | VAMP-r | offloaded/layer | staged MiB/step | copies alone ms | "
      "forward p50 ms | step p50 ms | exposed staging ms | floor ms | forward/floor | "
      "H2D GB/s (>=) | TPOT overhead (forward / step) |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const PointResult& p : points) {
    absl::StrAppendFormat(&out,
                          "| %s | %.2f | %d/%d (%.1f%%) | %.1f | %.2f | %.2f | %.2f | %.2f | "
                          "%.2f | %.3f | %.1f | %+.1f%% / %+.1f%% |\n",
                          p.mode, p.ratio, p.offloaded_experts_per_layer, g.num_experts,
                          100.0 * p.offloaded_experts_per_layer / g.num_experts,
                          p.staged_bytes_per_step / kMiB, p.copies_alone_ms, p.forward_ms.p50,
                          p.step_ms.p50, p.exposed_ms_per_step, p.floor_ms, p.forward_over_floor,
                          p.staging_gbps_lower_bound, p.forward_overhead_pct, p.step_overhead_pct);
  }
  absl::StrAppendFormat(&out,
                        "\nfloor = max(resident forward, staged bytes / pinned H2D); paper: TPOT "
                        "%+.1f%% at VAMP-15 (Qwen3-Next-80B, TP2, H100)\n",
                        kPaperTpotOverheadPct);
  return out;
}

absl::Status WriteJsonReport(const Flags& f, const Bandwidths& bw, const GpuEngine& e,
                             const DecodeFloor& floor, const std::vector<PointResult>& points) {
  const ExpertGeometry& g = e.rank->plan.experts;
  if (!f.json.empty()) {
    Json j;
    j["bench"] = "vamp_gpu_step_bench";
    j["device"] = {{"name", bw.device_name},
                   {"memory_bytes", bw.device_memory_bytes},
                   {"hbm_gbps", bw.hbm_gbps},
                   {"hbm_copy_bytes", bw.hbm_copy_bytes},
                   {"h2d_peak_gbps", bw.h2d_peak_gbps},
                   {"logits_d2h_bytes", bw.logits_bytes},
                   {"logits_d2h_ms", bw.logits_d2h_ms}};
    Json h2d = Json::array();
    for (const auto& [bytes, gbps] : bw.h2d_gbps) h2d.push_back({{"bytes", bytes}, {"gbps", gbps}});
    j["device"]["h2d_pinned"] = h2d;
    j["model"] = {{"dir", f.model_dir},
                  {"layers", e.rank->config.num_hidden_layers},
                  {"hidden", e.rank->config.hidden_size},
                  {"experts", e.rank->config.num_experts},
                  {"top_k", e.rank->config.num_experts_per_tok},
                  {"vocab", e.rank->config.vocab_size},
                  {"dtype", "bfloat16"},
                  {"non_expert_weight_bytes", e.model->weight_bytes()},
                  {"workspace_bytes", e.model->workspace_bytes()},
                  {"expert_bytes", g.expert_bytes},
                  {"group_experts", g.group_experts},
                  {"moe_layers", g.moe_layers.size()},
                  {"eligible_layers", g.eligible_layers.size()},
                  {"load_seconds", e.load_seconds}};
    j["plan"] = {{"gpu_memory_utilization", f.gpu_memory_utilization},
                 {"max_offload_ratio", f.ratios.back()},
                 {"max_groups", g.max_groups},
                 {"kv_baseline_blocks", e.rank->plan.kv_baseline_blocks},
                 {"kv_max_blocks", e.rank->plan.kv_max_blocks},
                 {"page_bytes", g.page_bytes}};
    j["workload"] = {{"batch", f.batch},
                     {"context", f.context},
                     {"prefill_tokens", f.prefill_tokens},
                     {"steps", f.steps},
                     {"warmup", f.warmup},
                     {"max_num_batched_tokens", f.max_num_batched_tokens},
                     {"device_gemm_max_rows_per_expert", f.device_gemm_max_rows_per_expert}};
    j["decode_floor"] = {{"tokens", floor.tokens},
                         {"expected_experts_per_layer", floor.expected_experts_per_layer},
                         {"non_expert_bytes", floor.non_expert_bytes},
                         {"expert_bytes", floor.expert_bytes},
                         {"kv_bytes", floor.kv_bytes},
                         {"state_bytes", floor.state_bytes},
                         {"total_bytes", floor.total_bytes},
                         {"ms", floor.ms},
                         {"estimate", floor.estimate}};
    Json pts = Json::array();
    for (const PointResult& p : points) {
      pts.push_back({{"mode", p.mode},
                     {"ratio", p.ratio},
                     {"groups", p.groups},
                     {"offloaded_experts_per_layer", p.offloaded_experts_per_layer},
                     {"offloaded_fraction", static_cast<double>(p.offloaded_experts_per_layer) /
                                                static_cast<double>(g.num_experts)},
                     {"staged_layers", p.staged_layers},
                     {"offloaded_bytes_per_layer", p.offloaded_bytes_per_layer},
                     {"tokens_per_step", p.tokens_per_step},
                     {"step_ms", ToJson(p.step_ms)},
                     {"forward_ms", ToJson(p.forward_ms)},
                     {"sample_ms", ToJson(p.sample_ms)},
                     {"staged_bytes_per_step", p.staged_bytes_per_step},
                     {"copies_per_step", p.copies_per_step},
                     {"exposed_staging_ms_per_step", p.exposed_ms_per_step},
                     {"graph_replays", p.graph_replays},
                     {"copies_alone_ms", p.copies_alone_ms},
                     {"floor_ms", p.floor_ms},
                     {"forward_over_floor", p.forward_over_floor},
                     {"step_over_floor", p.step_over_floor},
                     {"staging_gbps_lower_bound", p.staging_gbps_lower_bound},
                     {"forward_overhead_pct", p.forward_overhead_pct},
                     {"step_overhead_pct", p.step_overhead_pct}});
    }
    j["points"] = pts;
    j["paper_tpot_overhead_pct_vamp15"] = kPaperTpotOverheadPct;
    std::ofstream file(f.json);
    file << j.dump(2) << "\n";
    if (!file) return absl::InternalError(absl::StrCat("--json: cannot write '", f.json, "'"));
    VAMP_LOG(INFO) << "wrote " << f.json;
  }
  return absl::OkStatus();
}

}  // namespace vamp::gpu_step_bench
