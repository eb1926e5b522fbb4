// The numbers the VAMP paper (shared/reference/vamp-paper.md) states, for the reports of vamp-sim
// and vamp-bench to draw next to their own measurements. Only what the paper's text or tables give
// as numbers; none is derived here. The paper's setting differs from ours (2×H100 PCIe, TP2,
// Qwen3-Next-80B-A3B, vLLM 0.15 as the baseline), so these are reference marks, not targets.
#ifndef VAMP_BENCH_CHART_PAPER_REFERENCE_H_
#define VAMP_BENCH_CHART_PAPER_REFERENCE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace vamp::chart {

// A TTFT p99 the paper reports for a (policy, concurrency) point of its in-house multi-turn sweep.
struct PaperPoint {
  std::string policy;  // "static" (vLLM), "vamp-15", "vamp-20", "vamp-25"
  int32_t concurrency = 0;
  double ttft_p99_s = 0;  // < 0: a range, given in `note`
  std::string note;
};

// The H100-PCIe TP2 numbers of the paper's Figure 9 as §VI-C states them in its text.
std::vector<PaperPoint> PaperFigure9H100();

// Table IV: the 2,103-turn recorded-trace replay, vLLM against VAMP-15 (means of five runs).
struct PaperHeadline {
  static constexpr double kStaticTtftP90S = 26.1;
  static constexpr double kVampTtftP90S = 1.10;
  static constexpr double kStaticTtftP99S = 32.7;
  static constexpr double kVampTtftP99S = 3.48;
  static constexpr double kStaticHitRate = 0.0019;  // 0..1
  static constexpr double kVampHitRate = 0.898;
  static constexpr double kStaticTpotS = 0.1709;
  static constexpr double kVampTpotS = 0.2240;  // +31.1 %
  static constexpr double kTpotRatio = kVampTpotS / kStaticTpotS;
  static constexpr const char* kSetting = "2×H100, Qwen3-Next-80B, SWE-agent replay";
};

}  // namespace vamp::chart

#endif  // VAMP_BENCH_CHART_PAPER_REFERENCE_H_
